"""vllm_fleet.plan.tuning over host states recorded on real machines (tests/fixtures/probe/host-state-*.txt).

Each fixture is the exact output of the read-only command the host_tuning role runs on a host
(`grep -H MemTotal node*/meminfo; grep -H . <hugepage, THP, numa_balancing, cpufreq, cmdline files>`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.tuning import (
    GOVERNOR_GLOB,
    PAGE_1G_KB,
    PAGE_2M_KB,
    SYSFS_WRITE_SCRIPT,
    KvTierNeed,
    TuningOptions,
    kernel_cmdline_for,
    kv_tier_needs,
    limits_conf,
    parse_page_size,
    plan_hugepages,
    plan_tuning,
    report_text,
    runtime_changes,
    sysctl_conf,
    sysfs_write_argv,
    tuning_unit_text,
    unit_exec_starts,
)
from vllm_fleet.probe.hoststate import HostState, parse_host_state

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "probe"
GiB = 2**30


def state(name: str) -> HostState:
    return parse_host_state((FIXTURES / name).read_text())


def test_parse_controller_vm_state() -> None:
    s = state("host-state-controller-vm-1node.txt")
    assert s.nodes == [0]
    assert s.node_memory_bytes[0] == 8480972 * 1024
    assert s.hugepages == {(0, 1048576): 0, (0, 2048): 0}
    assert s.thp_enabled == "madvise"
    assert s.thp_defrag == "madvise"
    assert s.numa_balancing == "0"
    assert s.governor is None  # a VM without cpufreq
    assert s.kernel_release.startswith("6.18.")
    assert "console=ttyS0" in s.cmdline


def test_parse_ignores_noise_and_missing_files() -> None:
    s = parse_host_state("grep: /proc/sys/kernel/numa_balancing: No such file or directory\n\nnot a path\n")
    assert s.nodes == [] and s.numa_balancing is None and s.thp_enabled is None


def two_node_state() -> HostState:
    """Node sizes from the real `numactl --hardware` of a 2 x EPYC 9135 + RTX 4090 host
    (tests/fixtures/topology/numactl-hardware-cpu-compress-2x-epyc9135-4090-ktransformers-797.txt: 580088 and
    580505 MB); that post shows no sysfs, so THP/cpufreq/cmdline are the stock Ubuntu 24.04 server values."""
    return HostState(
        node_memory_bytes={0: 580_088 * 2**20, 1: 580_505 * 2**20},
        hugepages={(0, 2048): 0, (1, 2048): 0, (0, PAGE_1G_KB): 0, (1, PAGE_1G_KB): 0},
        thp_enabled="always",
        thp_defrag="madvise",
        numa_balancing="1",
        governor="schedutil",
        governors_available=("conservative", "ondemand", "powersave", "performance", "schedutil"),
        cmdline="BOOT_IMAGE=/vmlinuz-6.8.0-49-generic root=/dev/sda2 ro",
        kernel_release="6.8.0-49-generic",
    )


LAYOUT_2xTP2 = {
    "instances": [
        {"name": "i0", "gpus": [0, 1], "numa_binding": {"mode": "numactl", "nodes": [0]}},
        {"name": "i1", "gpus": [2, 3], "numa_binding": {"mode": "numactl", "nodes": [1]}},
    ]
}


def test_hugepages_per_node_follow_the_bound_instances() -> None:
    needs = kv_tier_needs(LAYOUT_2xTP2, 100 * GiB)
    assert needs == [KvTierNeed("i0", (0,), 100 * GiB), KvTierNeed("i1", (1,), 100 * GiB)]
    plan = plan_hugepages(needs, two_node_state().node_memory_bytes, margin_fraction=0.10)
    # 100 GiB + 10 % = 110 GiB = 56320 pages of 2 MiB on each node
    assert [(h.node, h.pages, h.instances) for h in plan] == [(0, 56320, ["i0"]), (1, 56320, ["i1"])]


def test_unbound_instance_is_spread_over_all_nodes_and_per_instance_amounts() -> None:
    layout = {
        "instances": [
            {"name": "i0", "gpus": [0, 1, 2, 3], "numa_binding": {"mode": "none", "nodes": []}},
            {"name": "i1", "gpus": [4], "numa_binding": {"mode": "vllm", "nodes": [0, 1]}},
        ]
    }
    needs = kv_tier_needs(layout, {"i0": 20 * GiB, "i1": 0})
    plan = plan_hugepages(needs, two_node_state().node_memory_bytes, margin_fraction=0.0)
    assert [h.pages for h in plan] == [5120, 5120]
    assert needs[1].nodes == (0, 1)


def test_node_overcommit_is_refused_with_the_variable_named() -> None:
    needs = kv_tier_needs(LAYOUT_2xTP2, 600 * GiB)
    with pytest.raises(FleetInputError, match="vllm_service_kv_offload_cpu_bytes: NUMA node 0 would need"):
        plan_hugepages(needs, two_node_state().node_memory_bytes)


def test_binding_to_a_node_the_host_lacks_is_refused() -> None:
    needs = kv_tier_needs(LAYOUT_2xTP2, GiB)
    with pytest.raises(FleetInputError, match="bound to NUMA node 1, but this host has nodes \\[0\\]"):
        plan_hugepages(needs, state("host-state-controller-vm-1node.txt").node_memory_bytes)


def test_negative_inputs_are_refused() -> None:
    with pytest.raises(FleetInputError, match="vllm_service_kv_offload_cpu_bytes"):
        kv_tier_needs(LAYOUT_2xTP2, -1)
    with pytest.raises(FleetInputError, match="host_tuning_hugepages_margin"):
        plan_hugepages([], {0: GiB}, margin_fraction=-0.5)
    with pytest.raises(FleetInputError, match="host_tuning_hugepage_size: '4M'"):
        parse_page_size("4M")
    assert parse_page_size("1G") == PAGE_1G_KB and parse_page_size("2MiB") == PAGE_2M_KB


def test_full_plan_on_the_two_socket_host() -> None:
    s = two_node_state()
    plan = plan_tuning(s, kv_tier_needs(LAYOUT_2xTP2, 100 * GiB), TuningOptions(reserve_hugepages=True))
    assert any("never in that pool" in w for w in plan.warnings)  # asked for, but said what it costs
    assert plan.sysctl == {"kernel.numa_balancing": "0"}
    assert (GOVERNOR_GLOB, "performance") in plan.sysfs
    assert ("/sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages", "56320") in plan.sysfs
    assert plan.kernel_cmdline == [] and not plan.reboot_required
    changes = runtime_changes(plan, s)
    assert "node 0: 2048 kB hugepages 0 -> 56320" in changes
    assert "transparent hugepages enabled: always -> madvise" in changes
    assert "CPU governor: schedutil -> performance" in changes
    assert "kernel.numa_balancing: 1 -> 0" in changes
    assert sysctl_conf(plan).endswith("kernel.numa_balancing = 0\n")
    assert "vllm hard memlock unlimited" in limits_conf(plan)
    cmds = sysfs_write_argv(plan)
    node0 = "/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages"
    assert cmds[0] == ["/bin/sh", "-c", SYSFS_WRITE_SCRIPT, "sh", "56320", node0]
    assert cmds[-1] == ["/bin/sh", "-c", SYSFS_WRITE_SCRIPT, "sh", "performance", GOVERNOR_GLOB]


def test_one_gib_pages_go_on_the_kernel_command_line_and_need_a_reboot() -> None:
    s = two_node_state()
    one_gib = TuningOptions(page_size_kb=PAGE_1G_KB, reserve_hugepages=True)
    plan = plan_tuning(s, kv_tier_needs(LAYOUT_2xTP2, 100 * GiB), one_gib)
    assert plan.kernel_cmdline == ["hugepagesz=1G", "hugepages=0:110,1:110"]
    assert plan.reboot_required
    assert not any(p.endswith("nr_hugepages") for p, _ in plan.sysfs)
    booted = HostState(**{**s.__dict__, "cmdline": s.cmdline + " hugepagesz=1G hugepages=0:110,1:110"})
    assert not plan_tuning(booted, kv_tier_needs(LAYOUT_2xTP2, 100 * GiB), one_gib).reboot_required
    # Ubuntu 22.04's 5.15 kernel predates per-node counts: the total, split evenly by the kernel
    assert kernel_cmdline_for(plan.hugepages, "5.15.0-91-generic") == ["hugepagesz=1G", "hugepages=220"]


def test_single_node_vm_without_cpufreq_and_nothing_bound() -> None:
    s = state("host-state-controller-vm-1node.txt")
    layout = {"instances": [{"name": "i0", "gpus": [], "numa_binding": {"mode": "none", "nodes": []}}]}
    plan = plan_tuning(s, kv_tier_needs(layout, 0), TuningOptions())
    assert plan.sysctl == {}
    assert not any(p == GOVERNOR_GLOB for p, _ in plan.sysfs)
    assert any("no cpufreq" in r for r in plan.reasons)
    assert [h.pages for h in plan.hugepages] == [0]
    # nothing to reserve: the pool is not touched (it may serve something else)
    assert not any(p.endswith("nr_hugepages") for p, _ in plan.sysfs)
    assert any(r.startswith("no hugetlb pool planned") for r in plan.reasons) and plan.shm is None
    reserved = HostState(**{**s.__dict__, "hugepages": {(0, 2048): 512, (0, PAGE_1G_KB): 0}})
    assert runtime_changes(plan_tuning(reserved, kv_tier_needs(layout, 0), TuningOptions()), reserved) == [
        "transparent hugepages defrag: madvise -> defer+madvise"
    ]
    changes = runtime_changes(plan, s)
    assert changes == ["transparent hugepages defrag: madvise -> defer+madvise"]
    text = report_text(plan, changes, applied=False)
    assert "NOT applied at runtime (host_tuning_apply_runtime: false)" in text


def test_bad_thp_and_numa_balancing_values_are_refused() -> None:
    s = state("host-state-controller-vm-1node.txt")
    with pytest.raises(FleetInputError, match="host_tuning_thp_enabled: 'sometimes'"):
        plan_tuning(s, [], TuningOptions(thp_enabled="sometimes"))
    with pytest.raises(FleetInputError, match="host_tuning_numa_balancing: 'maybe'"):
        plan_tuning(s, [], TuningOptions(numa_balancing="maybe"))


def test_unit_exec_starts_escape_dollar_for_systemd() -> None:
    plan = plan_tuning(two_node_state(), kv_tier_needs(LAYOUT_2xTP2, GiB), TuningOptions())
    lines = unit_exec_starts(plan)
    script = SYSFS_WRITE_SCRIPT.replace("$", "$$").replace("%", "%%").replace("\\", "\\\\")
    script = script.replace('"', '\\"')
    assert lines[-1] == f'ExecStart=/bin/sh -c "{script}" sh performance "{GOVERNOR_GLOB}"'
    assert all(line.startswith("ExecStart=/bin/sh -c ") for line in lines)
    assert "ExecStart=" + lines[-1][len("ExecStart=") :] in tuning_unit_text(plan)


def test_the_sysfs_write_script_takes_the_value_as_an_argument(tmp_path) -> None:
    """The real /bin/sh runs the script: the value lands in the file verbatim, a hostile value included, and
    the glob expands (no variable is part of the script's text)."""
    import subprocess

    for name in ("a", "b"):
        (tmp_path / f"cpu{name}").write_text("")
    hostile = "performance; touch " + str(tmp_path / "pwned")
    argv = ["/bin/sh", "-c", SYSFS_WRITE_SCRIPT, "sh", hostile, str(tmp_path / "cpu*")]
    subprocess.run(argv, check=True, timeout=10)
    assert (tmp_path / "cpua").read_text() == hostile + "\n" == (tmp_path / "cpub").read_text()
    assert not (tmp_path / "pwned").exists()


def test_the_cpu_kv_tier_sizes_dev_shm_not_a_hugetlb_pool() -> None:
    """vLLM >= 0.20 maps the tier in /dev/shm (SharedOffloadRegion; >= 0.30 checks its free space): the
    default plan sizes /dev/shm for both instances' tiers, with THP on it, and reserves no pool (a recorded
    state)."""
    s = state("host-state-controller-vm-shm.txt")
    assert s.shm_size_bytes == 25276502016 and s.shmem_thp
    assert s.shm_options == ("rw", "relatime", "size=24684084k")
    layout = {"instances": [{"name": n, "gpus": [], "numa_binding": {"mode": "none"}} for n in ("i0", "i1")]}
    plan = plan_tuning(s, kv_tier_needs(layout, 5 * GiB), TuningOptions())
    assert [h.pages for h in plan.hugepages] == [0]
    assert not any(p.endswith("nr_hugepages") for p, _ in plan.sysfs)
    assert plan.shm is not None
    # 2 x 5 GiB + 10 % = 11 GiB fits the 23.5 GiB tmpfs: its size stays, only huge= changes
    assert plan.shm.needed_bytes == 11 * GiB
    assert plan.shm.options == ["size=24105m", "huge=within_size"] and plan.shm.remount == [
        "huge=within_size"
    ]
    assert plan.shm.fstab_line == "tmpfs /dev/shm tmpfs rw,nosuid,nodev,size=24105m,huge=within_size 0 0"
    assert "/dev/shm: 23.54 GiB -> remount with huge=within_size" in runtime_changes(plan, s)


def test_dev_shm_grows_to_the_need_and_a_converged_host_changes_nothing() -> None:
    s = state("host-state-controller-vm-shm.txt")
    layout = {"instances": [{"name": "i0", "gpus": [], "numa_binding": {"mode": "none"}}]}
    small = HostState(**{**s.__dict__, "shm_size_bytes": 4 * GiB, "shm_options": ("rw", "size=4194304k")})
    plan = plan_tuning(small, kv_tier_needs(layout, 16 * GiB), TuningOptions(shm_huge=None))
    assert plan.shm is not None and plan.shm.remount == ["size=18023m"]  # ceil(17.6 GiB) in MiB
    # what the kernel shows after `mount -o remount,size=18023m /dev/shm`: nothing left to do, same fstab line
    grown = HostState(**{**small.__dict__, "shm_size_bytes": 18023 * 2**20})
    again = plan_tuning(grown, kv_tier_needs(layout, 16 * GiB), TuningOptions(shm_huge=None))
    assert again.shm is not None and again.shm.remount == []
    assert not any(c.startswith("/dev/shm") for c in runtime_changes(again, grown))
    assert again.shm.fstab_line == plan.shm.fstab_line
    with pytest.raises(
        FleetInputError, match=r"vllm_service_kv_offload_cpu_bytes: the CPU KV tiers need 22\.0 GiB"
    ):
        plan_tuning(s, kv_tier_needs(layout, 20 * GiB), TuningOptions())
    with pytest.raises(FleetInputError, match="host_tuning_shm_huge: 'huge'"):
        plan_tuning(s, kv_tier_needs(layout, GiB), TuningOptions(shm_huge="huge"))


def test_a_kernel_without_tmpfs_thp_keeps_small_pages_with_a_warning() -> None:
    s = state("host-state-controller-vm-1node.txt")  # recorded before shmem_enabled was read: absent
    layout = {"instances": [{"name": "i0", "gpus": [], "numa_binding": {"mode": "none"}}]}
    plan = plan_tuning(s, kv_tier_needs(layout, GiB), TuningOptions())
    assert plan.shm is not None and plan.shm.options == ["size=1127m"] and s.shm_size_bytes is None
    assert any("no transparent hugepages for tmpfs" in w for w in plan.warnings)


def test_recorded_h200_guest_plans_from_the_host_total_not_the_lazily_onlined_node() -> None:
    """tests/fixtures/probe/h200-shm: node 0's sysfs says 4.7 GB, /proc/meminfo 126 GiB; /dev/shm is 128 GiB.
    The same 64 GiB tier the live run there planned (its report is in tune-shm-run1.log)."""
    s = parse_host_state((FIXTURES / "h200-shm" / "host-state-h200-shm.txt").read_text())
    assert s.node_memory_bytes == {0: 4681200 * 1024} and s.memory_bytes == 131981020 * 1024
    assert s.shm_size_bytes == 128 * GiB and s.shm_options[-1] == "size=134217728k"  # the top mount
    layout = {"instances": [{"name": "i0", "gpus": [0], "numa_binding": {"mode": "none"}}]}
    plan = plan_tuning(s, kv_tier_needs(layout, 64 * GiB), TuningOptions())
    assert plan.shm is not None and plan.shm.remount == ["huge=within_size"]
    assert plan.shm.fstab_line == "tmpfs /dev/shm tmpfs rw,nosuid,nodev,size=131072m,huge=within_size 0 0"
    live = (FIXTURES / "h200-shm" / "tune-shm-run1.log").read_text()
    shm_line = next(line for line in report_text(plan, [], applied=True).splitlines() if "/dev/shm:" in line)
    assert f'"{shm_line}"' in live  # the line the live run printed, character for character
    assert "changed=0" in (FIXTURES / "h200-shm" / "tune-shm-run2.log").read_text()
