"""Bringing labs up and down on the controller (the side effects behind `vllm-fleet lab`).

Layout under the lab root (see `vllm_fleet.lab.spec.lab_root`):

    cache/                          shared artefacts (vllm_fleet.lab.build), built once under cache/.lock
    labs/<name>.lock                serialises up/down of one lab
    labs/<name>/state.json          the plan and the nspawn PIDs; written before anything is created
    labs/<name>/id_ed25519{,.pub}   the lab's SSH key; authorized_keys is bound read-only into every host
    labs/<name>/inventory.yml       the Ansible inventory that reaches the hosts from the root namespace
    labs/<name>/hosts/<host>/       upper+work (the host's writable layer, on disk), root (the overlay)

`down` works from the lab name alone: it reads state.json when there is one and also sweeps every network
namespace named `vfl-<name>.*` and every mount under the lab folder, so it cleans up after a crashed `up`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from vllm_fleet.errors import FleetInputError
from vllm_fleet.lab import build as lab_build
from vllm_fleet.lab import spec as lab
from vllm_fleet.lab.build import LabBuildError, OnProgress, file_lock, run
from vllm_fleet.lab.leftovers import tree_bytes
from vllm_fleet.lab.progress import Progress

Log = Callable[[str], None]
BOOT_TIMEOUT_S = 90
SSH_TIMEOUT_S = 60
STOP_TIMEOUT_S = 20
# Keeps the children of this process (nspawn) reapable, so a stopped one does not linger as a zombie.
_children: dict[int, subprocess.Popen] = {}


class LabError(RuntimeError):
    """Lab hosts failed to start or stop; the message carries what was seen."""


def _quiet(_: str) -> None:
    pass


def _no_progress(_: Progress) -> None:
    pass


def _labs_dir(root: Path) -> Path:
    return root / "labs"


def _state_file(root: Path, name: str) -> Path:
    return _labs_dir(root) / name / "state.json"


def read_state(root: Path, name: str) -> dict[str, Any] | None:
    try:
        return json.loads(_state_file(root, name).read_text())
    except (OSError, ValueError):
        return None


def _write_state(plan: lab.LabPlan, state: dict[str, Any]) -> None:
    plan.lab_dir.mkdir(parents=True, exist_ok=True)
    tmp = plan.lab_dir / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.rename(plan.lab_dir / "state.json")


# -- processes -----------------------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _is_our_nspawn(pid: int, machine: str) -> bool:
    return f"--machine={machine}" in lab.started_nspawn(_cmdline(pid))


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if _alive(p)]
    return left


# -- network namespaces --------------------------------------------------------------------------------------


def list_netns() -> list[str]:
    out = run(["ip", "netns", "list"], timeout=30, what="ip netns list")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _netns_pids(netns: str) -> list[int]:
    try:
        out = run(["ip", "netns", "pids", netns], timeout=30, what="ip netns pids")
    except LabBuildError:
        return []
    return [int(p) for p in out.split() if p.isdigit()]


def _netns_links(netns: str) -> list[str]:
    try:
        out = run(["ip", "-n", netns, "-o", "link", "show"], timeout=30, what="ip link show")
    except LabBuildError:
        return []
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return [n for n in names if n != "lo"]


def _create_network(plan: lab.LabPlan) -> None:
    ip = ["ip"]
    cmds = [
        [*ip, "netns", "add", plan.ctl_netns],
        [*ip, "-n", plan.ctl_netns, "link", "set", "lo", "up"],
        [*ip, "-n", plan.ctl_netns, "link", "add", plan.bridge, "type", "bridge"],
        [*ip, "-n", plan.ctl_netns, "addr", "add", f"{plan.gateway}/24", "dev", plan.bridge],
        [*ip, "-n", plan.ctl_netns, "link", "set", plan.bridge, "up"],
    ]
    for host in plan.hosts:
        # Created straight inside the namespaces: nothing of the lab ever appears in the root namespace.
        cmds += [
            [*ip, "netns", "add", host.netns],
            [*ip, "-n", host.netns, "link", "set", "lo", "up"],
            [
                *ip,
                "-n",
                plan.ctl_netns,
                "link",
                "add",
                host.veth,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                host.netns,
            ],
            [*ip, "-n", plan.ctl_netns, "link", "set", host.veth, "master", plan.bridge, "up"],
            [*ip, "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0"],
            [*ip, "-n", host.netns, "link", "set", "eth0", "up"],
            [*ip, "-n", host.netns, "route", "add", "default", "via", plan.gateway],
        ]
    for argv in cmds:
        run(argv, timeout=30, what="lab network setup")


# -- mounts --------------------------------------------------------------------------------------------------


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path` (deepest first), from this process's mount table."""
    prefix = str(path).rstrip("/")
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if target == prefix or target.startswith(prefix + "/"):
            found.append(target)
    return sorted(set(found), key=lambda t: (-t.count("/"), t))


def _umount(target: str) -> None:
    proc = subprocess.run(["umount", target], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        # still busy (a process of a dying container): detach now, the kernel frees it when released
        subprocess.run(["umount", "--lazy", target], capture_output=True, text=True, check=False)


# -- ssh -----------------------------------------------------------------------------------------------------


def ssh_argv(plan: lab.LabPlan, host: lab.LabHost, command: str, connect_timeout: int = 5) -> list[str]:
    return [
        "ssh",
        "-i",
        str(plan.key_file),
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={connect_timeout}",
        "-o",
        f"ProxyCommand={plan.proxy_command()}",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "ControlMaster=no",
        f"root@{host.address}",
        command,
    ]


def _ssh_ok(plan: lab.LabPlan, host: lab.LabHost) -> bool:
    try:
        proc = subprocess.run(
            ssh_argv(plan, host, "true"),
            capture_output=True,
            timeout=20,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0


def _init_pid(nspawn_pid: int) -> int | None:
    for pid in _children_of(nspawn_pid):
        if Path(f"/proc/{pid}/comm").exists() and _cmdline(pid)[:1] != ["systemd-nspawn"]:
            return pid
    return None


def system_state(init_pid: int) -> str:
    proc = subprocess.run(
        [
            "nsenter",
            f"--target={init_pid}",
            "--mount",
            "--uts",
            "--ipc",
            "--net",
            "--pid",
            "--",
            "systemctl",
            "is-system-running",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return proc.stdout.strip() or proc.stderr.strip()


def _log_tail(plan: lab.LabPlan, host: str, lines: int = 20) -> str:
    try:
        text = (plan.host_dir(host) / "nspawn.log").read_text(errors="replace")
    except OSError:
        return "(no nspawn log)"
    return "\n".join(text.splitlines()[-lines:])


# -- up / down -----------------------------------------------------------------------------------------------


def _start_host(plan: lab.LabPlan, host: lab.LabHost, lowers: list[Path], binds_ro: dict[str, str]) -> int:
    """Mount the host's overlay (its writable layer over `lowers`, the topmost first: a saved vLLM venv, then
    the shared root filesystem) and start its systemd-nspawn; returns nspawn's PID."""
    hdir = plan.host_dir(host.name)
    for sub in ("upper", "work", "root"):
        (hdir / sub).mkdir(parents=True, exist_ok=True)
    # Files placed in the empty upper layer before the mount shadow the shared root filesystem's.
    (hdir / "upper/etc").mkdir(exist_ok=True)
    (hdir / "upper/etc/hosts").write_text(lab.hosts_file(plan))
    (hdir / "upper/etc/resolv.conf").write_text(lab.resolv_conf())
    # The host's writable layer lives on disk (not tmpfs as with --volatile=overlay): a vLLM venv is 2.5 GB.
    run(
        [
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={':'.join(map(str, lowers))},upperdir={hdir / 'upper'},workdir={hdir / 'work'}",
            str(hdir / "root"),
        ],
        timeout=30,
        what=f"overlay mount for lab host {host.name}",
    )
    log = open(hdir / "nspawn.log", "ab")  # noqa: SIM115 - handed to the child, which outlives this call
    try:
        nspawn = lab.nspawn_argv(plan, host, hdir / "root", binds_ro)
        child = subprocess.Popen(
            lab.in_cgroups_argv(_host_cgroups(plan, host), nspawn),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()
    _children[child.pid] = child
    return child.pid


def _cgroup_mounts() -> list[Path]:
    return lab.systemd_cgroup_mounts(Path("/proc/self/mountinfo").read_text())


def _host_cgroups(plan: lab.LabPlan, host: lab.LabHost) -> list[Path]:
    """Make the host's own cgroup in each systemd hierarchy (see lab.CGROUP_PARENT). A hierarchy this process
    cannot write (a read-only /sys/fs/cgroup in a container) is left out: the host then shares its cgroup with
    its neighbours there, as before."""
    made = []
    for mount in _cgroup_mounts():
        path = lab.lab_cgroup(mount, plan.name) / host.name
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        made.append(path)
    return made


def _cgroup_pids(name: str) -> list[int]:
    """Every process in lab `name`'s cgroups: its hosts' nspawn and their containers."""
    pids: set[int] = set()
    for mount in _cgroup_mounts():
        top = lab.lab_cgroup(mount, name)
        for procs in top.rglob("cgroup.procs") if top.is_dir() else []:
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(pid) for pid in procs.read_text().split())
    return sorted(pids)


def _remove_cgroups(name: str, timeout_s: float = 10.0) -> list[str]:
    """Remove lab `name`'s cgroups, deepest first (a cgroup directory goes with rmdir once it has no
    processes and no children); returns those removed. Called after every process of the lab was killed: a
    killed process stays in its cgroup until it has exited whole, so what is still busy is tried again,
    killing what the cgroups still hold, until `timeout_s` (CI: a failed `up` left the lab's top cgroups
    behind, empty by the time the test looked)."""
    removed: list[str] = []
    deadline = time.monotonic() + timeout_s
    mounts = _cgroup_mounts()
    while True:
        tops = [t for t in (lab.lab_cgroup(m, name) for m in mounts) if t.is_dir()]
        for top in tops:
            below = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            for path in [*below, top]:
                with contextlib.suppress(OSError):
                    path.rmdir()
                    removed.append(str(path))
        if not any(t.is_dir() for t in tops) or time.monotonic() > deadline:
            return removed
        _signal(_cgroup_pids(name), signal.SIGKILL)
        time.sleep(0.2)


def _wait_booted(plan: lab.LabPlan, pids: dict[str, int], log: Log) -> dict[str, str]:
    states: dict[str, str] = {}
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    pending = list(plan.hosts)
    while pending:
        for host in list(pending):
            pid = pids[host.name]
            if not _alive(pid):
                raise LabError(
                    f"lab host {host.name}: systemd-nspawn exited during boot:\n{_log_tail(plan, host.name)}"
                )
            init = _init_pid(pid)
            state = system_state(init) if init else "no init yet"
            if lab.system_state_ok(state):
                states[host.name] = state
                pending.remove(host)
                log(f"lab {plan.name}: {host.name} booted ({state})")
        if pending and time.monotonic() > deadline:
            raise LabError(
                f"lab hosts {', '.join(h.name for h in pending)} not booted after {BOOT_TIMEOUT_S} s "
                f"(last state {state!r}):\n{_log_tail(plan, pending[0].name)}"
            )
        if pending:
            time.sleep(0.3)
    return states


def _wait_ssh(plan: lab.LabPlan) -> None:
    deadline = time.monotonic() + SSH_TIMEOUT_S
    pending = list(plan.hosts)
    while pending:
        pending = [h for h in pending if not _ssh_ok(plan, h)]
        if pending and time.monotonic() > deadline:
            raise LabError(f"lab hosts {', '.join(h.name for h in pending)}: no SSH after {SSH_TIMEOUT_S} s")
        if pending:
            time.sleep(0.5)


def _ensure_key(plan: lab.LabPlan) -> None:
    if not plan.key_file.is_file():
        run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                f"vllm-fleet-lab-{plan.name}",
                "-f",
                str(plan.key_file),
            ],
            timeout=30,
            what="ssh-keygen",
        )
    auth = plan.lab_dir / "authorized_keys"
    auth.write_text(Path(f"{plan.key_file}.pub").read_text())
    auth.chmod(0o600)


def write_worker_process_vars(group_vars_lab: Path) -> Path:
    """Beside the lab's variables (`vllm.yml` in an inventory's group_vars/lab), the file that runs each lab
    instance's worker in a process of its own (spec.worker_process_vars); named to load after vllm.yml,
    whose vllm_service_extra_env it replaces with a copy without vLLM's in-process switch. Returns the
    file's path."""
    lab_vars = yaml.safe_load((group_vars_lab / "vllm.yml").read_text())
    path = group_vars_lab / "zz-worker-process.yml"
    path.write_text(yaml.safe_dump(lab.worker_process_vars(lab_vars)))
    return path


def write_inventory(plan: lab.LabPlan, path: Path, with_vllm: bool) -> bool:
    """Write the lab's inventory to `path`; True when the file changed."""
    text = "# Written by `vllm-fleet lab up`: the lab's hosts, reachable from the root network namespace.\n"
    text += yaml.safe_dump(
        lab.inventory(plan, with_vllm=with_vllm), sort_keys=False, default_flow_style=False
    )
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True


def _running_ok(plan: lab.LabPlan, state: dict[str, Any]) -> bool:
    if state.get("status") != "up":
        return False
    netns = set(list_netns())
    for host in plan.hosts:
        pid = state.get("pids", {}).get(host.name)
        if not pid or not _is_our_nspawn(pid, host.name) or host.netns not in netns:
            return False
    # side by side: each check is an ssh login of its own (a lab of 4 hosts took 0.75 s one after another)
    with ThreadPoolExecutor(max_workers=len(plan.hosts) or 1) as pool:
        return all(pool.map(lambda host: _ssh_ok(plan, host), plan.hosts))


def _same_lab(running: lab.LabPlan, state: dict[str, Any], plan: lab.LabPlan, with_vllm: bool) -> bool:
    """Whether the lab recorded up is the one asked for: the same hosts, with or without the vLLM files."""
    same_hosts = [h.name for h in running.hosts] == [h.name for h in plan.hosts]
    return same_hosts and state.get("with_vllm") == with_vllm


def reuse_if_up(
    name: str, names: list[str], *, with_vllm: bool = True, root: Path | None = None
) -> dict[str, Any] | None:
    """`up`'s answer for a lab that is up already with exactly these hosts (each one's nspawn alive, its
    namespace there, its sshd answering), None for anything else (then `up` itself decides: boot, clean up
    or refuse). In the caller's process: playbooks/lab.yml re-runs pay no CLI start for a lab that is up
    (issue 21)."""
    root = root or lab.lab_root()
    plan = lab.plan_lab(name, lab.host_names(name, None, names), root)
    if not _state_file(root, name).is_file():
        return None  # no lab of that name (and no lock file left behind for one)
    started = time.monotonic()
    with file_lock(_labs_dir(root) / f"{name}.lock"):
        state = read_state(root, name)
        if not state:
            return None
        running = lab.LabPlan.from_dict(state["plan"])
        if not (_same_lab(running, state, plan, with_vllm) and _running_ok(running, state)):
            return None
        timings = {"check": round(time.monotonic() - started, 2)}
        return _result(running, state, changed=False, timings=timings, inventory_path=None)


def check_tools(which: Callable[[str], str | None] = shutil.which) -> None:
    """Fail before creating anything when a tool the lab needs is missing."""
    missing = [tool for tool in lab.CONTROLLER_TOOLS if not which(tool)]
    if missing:
        raise FleetInputError(
            f"vllm-fleet lab needs {', '.join(missing)} on this machine (PATH={os.environ.get('PATH', '')}): "
            "run scripts/bootstrap, which installs them"
        )


def up(
    name: str,
    *,
    hosts: int | None = None,
    names: list[str] | None = None,
    inventory_path: Path | None = None,
    with_vllm: bool = True,
    preinstalled_vllm: bool = False,
    root: Path | None = None,
    log: Log = _quiet,
    progress: OnProgress = _no_progress,
) -> dict[str, Any]:
    """Bring lab NAME up (or find it up already); returns what happened, with per-stage timings. log gets
    one line per stage; progress gets the artefact builds' progress (see vllm_fleet.lab.progress).
    preinstalled_vllm: the hosts start with the vLLM venv that `save_vllm` cached for the current wheelhouse,
    when there is one (else they start without it, and the log says so), so the vllm_install role finds vLLM
    installed and pip does not run: for tests of what comes after the install (rollouts, a whole converge)."""
    root = root or lab.lab_root()
    plan = lab.plan_lab(name, lab.host_names(name, hosts, names), root)
    check_tools()
    timings: dict[str, float] = {}
    started = time.monotonic()
    with file_lock(_labs_dir(root) / f"{name}.lock") as lock:
        state = read_state(root, name)
        if state:
            running = lab.LabPlan.from_dict(state["plan"])
            same = _same_lab(running, state, plan, with_vllm)
            alive = _running_ok(running, state)
            if alive and same:
                if inventory_path:
                    write_inventory(running, inventory_path, with_vllm)
                timings["check"] = round(time.monotonic() - started, 2)
                log(f"lab {name}: already up ({len(running.hosts)} hosts), reused")
                return _result(running, state, changed=False, timings=timings, inventory_path=inventory_path)
            if alive:
                raise FleetInputError(
                    f"lab {name!r} is already up with hosts {', '.join(h.name for h in running.hosts)}"
                    f" (vllm artefacts: {state.get('with_vllm')}); run `vllm-fleet lab down --name {name}` "
                    "first or pick another --name"
                )
            log(f"lab {name}: not running as recorded (crashed up, reboot?): cleaning up first")
            _down_locked(root, name, log)
        _check_subnet_free(root, plan)
        state = {"plan": plan.to_dict(), "with_vllm": with_vllm, "status": "starting", "pids": {}}
        _write_state(plan, state)
        try:
            cache = root / "cache"
            artefacts: dict[str, str] = {}
            stage = time.monotonic()
            if not all(lab_build.is_cached(cache, n) for n in lab_build.artefact_names(with_vllm)):
                log(
                    f"lab {name}: building the missing lab caches in {cache} once (root filesystem ~70 s,"
                    " wheelhouse ~600 MB download and a check install, a few minutes); later labs reuse them"
                )
            rootfs = lab_build.ensure_rootfs(cache, progress)
            timings["rootfs_built" if rootfs.built else "rootfs_cached"] = round(time.monotonic() - stage, 2)
            artefacts["rootfs"] = str(rootfs.path)
            binds: dict[str, str] = {}
            lowers = [rootfs.path]
            if with_vllm and preinstalled_vllm:
                installed = cache / lab_build.installed_vllm_name()
                if lab_build.is_cached(cache, installed.name):  # the venv of this lab's wheelhouse
                    lowers.insert(0, installed)
                    artefacts["installed_vllm"] = str(installed)
                    log(f"lab {name}: the hosts start with the vLLM venv saved in {installed}")
                else:
                    log(
                        f"lab {name}: no saved vLLM venv for this wheelhouse ({installed} is not there: "
                        "`vllm-fleet lab save-vllm` makes it): the hosts start without one"
                    )
            if with_vllm:
                stage = time.monotonic()
                wheelhouse = lab_build.ensure_wheelhouse(cache, progress=progress)
                timings["wheelhouse_built" if wheelhouse.built else "wheelhouse_cached"] = round(
                    time.monotonic() - stage, 2
                )
                stage = time.monotonic()
                model = lab_build.ensure_model(cache, progress)
                timings["model_built" if model.built else "model_cached"] = round(time.monotonic() - stage, 2)
                binds = {lab.HOST_WHEELHOUSE: str(wheelhouse.path), lab.HOST_MODEL: str(model.path)}
                artefacts.update(wheelhouse=str(wheelhouse.path), model=str(model.path))
            state["artefacts"] = artefacts
            for key, seconds in timings.items():
                log(f"lab {name}: {key.replace('_', ' ')} in {seconds:.1f} s")
            stage = time.monotonic()
            _ensure_key(plan)
            _create_network(plan)
            for host in plan.hosts:
                state["pids"][host.name] = _start_host(plan, host, lowers, binds)
                _write_state(plan, state)
            state["system_state"] = _wait_booted(plan, state["pids"], log)
            timings["boot"] = round(time.monotonic() - stage, 2)
            stage = time.monotonic()
            _wait_ssh(plan)
            timings["ssh"] = round(time.monotonic() - stage, 2)
            write_inventory(plan, plan.inventory_file, with_vllm)
            if inventory_path:
                write_inventory(plan, inventory_path, with_vllm)
            state["status"] = "up"
            _write_state(plan, state)
        except BaseException:
            log(f"lab {name}: up failed, tearing down what was created")
            _down_locked(root, name, log)
            lock.remove = True  # nothing of the lab is left: neither is its lock
            raise
    timings["total"] = round(time.monotonic() - started, 2)
    log(
        f"lab {name}: up in {timings['total']:.1f} s "
        f"(boot {timings['boot']:.1f} s, ssh {timings['ssh']:.1f} s)"
    )
    return _result(plan, state, changed=True, timings=timings, inventory_path=inventory_path)


def save_vllm(
    name: str, host: str, venv: str, *, root: Path | None = None, log: Log = _quiet
) -> dict[str, Any]:
    """Cache the vLLM venv `venv` (an absolute path on the host) as lab host HOST's vllm_install role left
    it in the host's writable layer, for `up(..., preinstalled_vllm=True)`. Kept once made for this
    wheelhouse (a later save changes nothing); `clean` removes it."""
    root = root or lab.lab_root()
    with file_lock(_labs_dir(root) / f"{lab.check_lab_name(name)}.lock"):  # not while the lab goes down
        return _save_vllm_locked(root, name, host, venv, log)


def _save_vllm_locked(root: Path, name: str, host: str, venv: str, log: Log) -> dict[str, Any]:
    state = read_state(root, name)
    if not state or state.get("status") != "up":
        raise FleetInputError(f"lab {name!r} is not up: bring it up and install vLLM on {host} first")
    plan = lab.LabPlan.from_dict(state["plan"])
    if host not in [h.name for h in plan.hosts]:
        raise FleetInputError(
            f"lab {name!r} has no host {host!r} (its hosts: {', '.join(h.name for h in plan.hosts)})"
        )
    wheelhouse = state.get("artefacts", {}).get("wheelhouse")
    if not wheelhouse:
        raise FleetInputError(
            f"lab {name!r} was brought up --without-vllm: it has no wheelhouse to install from"
        )
    if not venv.startswith("/") or ".." in venv.split("/"):
        raise FleetInputError(
            f"--venv {venv!r}: give the venv's absolute path on the host, as /opt/vllm-fleet/venv"
        )
    # vllm_install creates the venv on the host, so all of it is in the writable layer, none in the rootfs
    source = plan.host_dir(host) / "upper" / venv.lstrip("/")
    missing = [p for p in ("bin/python", "bin/vllm") if not os.path.lexists(source / p)]
    if missing:
        raise FleetInputError(
            f"{host}:{venv} has no {' or '.join(missing)}: install vLLM there first (playbooks/install.yml)"
        )
    started = time.monotonic()
    # named after the wheelhouse this lab's hosts installed from, which a later `up` may have replaced
    saved_name = lab_build.installed_vllm_name(Path(wheelhouse).name)
    artefact = lab_build.save_tree(root / "cache", saved_name, source, venv)
    seconds = round(time.monotonic() - started, 2)
    log(
        f"lab {name}: {host}:{venv} saved in {artefact.path} ({seconds:.1f} s)"
        if artefact.built
        else f"lab {name}: a vLLM venv for this wheelhouse is saved already ({artefact.path}): kept"
    )
    return {
        "name": name,
        "host": host,
        "venv": venv,
        "path": str(artefact.path),
        "changed": artefact.built,
        "seconds": seconds,
    }


def _check_subnet_free(root: Path, plan: lab.LabPlan) -> None:
    for other in sorted(_labs_dir(root).glob("*/state.json")):
        if other.parent.name == plan.name:
            continue
        state = read_state(root, other.parent.name)
        if state and state.get("plan", {}).get("subnet") == plan.subnet:
            raise FleetInputError(
                f"lab name {plan.name!r} maps to subnet {plan.subnet}, "
                f"already used by lab {other.parent.name!r}; "
                "pick another --name"
            )


def _result(
    plan: lab.LabPlan,
    state: dict[str, Any],
    *,
    changed: bool,
    timings: dict[str, float],
    inventory_path: Path | None,
) -> dict[str, Any]:
    return {
        "name": plan.name,
        "changed": changed,
        "status": state.get("status"),
        "inventory": str(plan.inventory_file),
        "inventory_copy": str(inventory_path) if inventory_path else None,
        "hosts": [{**h.to_dict(), "pid": state.get("pids", {}).get(h.name)} for h in plan.hosts],
        "ctl_netns": plan.ctl_netns,
        "subnet": plan.subnet,
        "artefacts": state.get("artefacts", {}),
        "timings_s": timings,
    }


def down(name: str, *, root: Path | None = None, log: Log = _quiet) -> dict[str, Any]:
    root = root or lab.lab_root()
    lab.check_lab_name(name)
    # the lock goes with the lab (it was left behind before: one empty file per lab ever made)
    with file_lock(_labs_dir(root) / f"{name}.lock", remove=True):
        return _down_locked(root, name, log)


def _down_locked(root: Path, name: str, log: Log) -> dict[str, Any]:
    started = time.monotonic()
    state = read_state(root, name) or {}
    lab_dir = _labs_dir(root) / name
    namespaces = [ns for ns in list_netns() if lab.lab_of_netns(ns) == name]
    removed: dict[str, list[Any]] = {"processes": [], "mounts": [], "links": [], "netns": [], "cgroups": []}
    # 1. the containers: TERM makes nspawn shut the container's systemd down cleanly
    machines = {h["name"] for h in state.get("plan", {}).get("hosts", [])}
    nspawns = [pid for host, pid in state.get("pids", {}).items() if _is_our_nspawn(pid, host)]
    for ns in namespaces:
        for pid in _netns_pids(ns):
            argv = lab.started_nspawn(_cmdline(pid))
            if any(f"--machine={m}" in argv for m in machines):
                nspawns.append(pid)
    # every nspawn in the lab's cgroups is the lab's, also one that a crashed `up` left without a state file
    nspawns += [pid for pid in _cgroup_pids(name) if lab.started_nspawn(_cmdline(pid))]
    nspawns = sorted(set(nspawns))
    _signal(nspawns, signal.SIGTERM)
    left = _wait_gone(nspawns, STOP_TIMEOUT_S)
    _signal(left, signal.SIGKILL)
    _wait_gone(left, 5)
    removed["processes"] += nspawns
    # 2. anything else still inside the lab's namespaces or cgroups (SSH ProxyCommand netcats, a container's
    # leftovers)
    others = sorted({pid for ns in namespaces for pid in _netns_pids(ns)} | set(_cgroup_pids(name)))
    _signal(others, signal.SIGKILL)
    _wait_gone(others, 5)
    removed["processes"] += others
    removed["cgroups"] = _remove_cgroups(name)
    phases = {"stop": round(time.monotonic() - started, 2)}
    for pid in list(_children):
        if not _alive(pid):
            _children.pop(pid, None)
    # 3. the hosts' overlay roots
    for target in mounts_under(lab_dir):
        _umount(target)
        removed["mounts"].append(target)
    # 4. links before namespaces: a veth left behind in a namespace being freed blocks the next `up`
    for ns in namespaces:
        for link in _netns_links(ns):
            if (
                subprocess.run(
                    ["ip", "-n", ns, "link", "del", link], capture_output=True, check=False
                ).returncode
                == 0
            ):
                removed["links"].append(link)
    for ns in sorted(namespaces, key=lambda n: n.endswith(".ctl")):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        removed["netns"].append(ns)
    still_mounted = mounts_under(lab_dir)
    if still_mounted:
        raise LabError(f"lab {name}: still mounted after teardown: {', '.join(still_mounted)}")
    phases["unmount_and_network"] = round(time.monotonic() - started - phases["stop"], 2)
    if lab_dir.exists():
        # the hosts' writable layers: a vLLM venv is ~40k files, slow to delete on a busy disk
        shutil.rmtree(lab_dir)
    seconds = round(time.monotonic() - started, 2)
    phases["remove_files"] = round(seconds - phases["stop"] - phases["unmount_and_network"], 2)
    log(
        f"lab {name}: down in {seconds:.1f} s ({len(nspawns)} hosts stopped, {len(removed['netns'])} "
        f"namespaces; " + ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in phases.items()) + ")"
    )
    return {"name": name, "removed": removed, "seconds": seconds, "timings_s": phases}


def known_labs(root: Path | None = None) -> list[str]:
    """Labs with state on disk or namespaces on this machine."""
    root = root or lab.lab_root()
    names = {p.name for p in _labs_dir(root).glob("*") if p.is_dir()}
    names |= {n for n in (lab.lab_of_netns(ns) for ns in list_netns()) if n}
    return sorted(names)


def status(name: str, *, root: Path | None = None) -> dict[str, Any]:
    root = root or lab.lab_root()
    state = read_state(root, name) or {}
    netns = set(list_netns())
    hosts = []
    for h in state.get("plan", {}).get("hosts", []):
        pid = state.get("pids", {}).get(h["name"])
        running = bool(pid) and _is_our_nspawn(pid, h["name"])
        init = _init_pid(pid) if running else None
        hosts.append(
            {
                "name": h["name"],
                "address": h["address"],
                "pid": pid,
                "running": running,
                "netns": h["netns"] in netns,
                "system_state": system_state(init) if init else None,
            }
        )
    leftovers = sorted(ns for ns in netns if lab.lab_of_netns(ns) == name)
    return {
        "name": name,
        "status": state.get("status", "absent" if not leftovers else "leftovers"),
        "inventory": str(_labs_dir(root) / name / "inventory.yml") if state else None,
        "hosts": hosts,
        "netns": leftovers,
    }


def clean(*, root: Path | None = None, log: Log = _quiet) -> dict[str, Any]:
    """Remove everything `vllm-fleet lab` put on this machine: every lab (as `down`), the cached artefacts
    (root filesystem, wheelhouse, model, half-built `.partial` folders) and every lock file; then the lab
    root itself when nothing else is in it. The next `lab up` builds the caches again."""
    root = root or lab.lab_root()
    # the labs of THIS root (a crashed `up` leaves its folder: state.json is written before anything else);
    # namespaces alone cannot tell which root a lab came from, and another root's labs are not ours to stop
    names = sorted(p.name for p in _labs_dir(root).glob("*") if p.is_dir())
    labs = [down(name, root=root, log=log) for name in names]
    removed: list[str] = []
    freed = 0
    for lock_file in sorted(_labs_dir(root).glob("*.lock")):
        with file_lock(lock_file, remove=True):  # waits for an `up`/`down` of that lab still running
            removed.append(str(lock_file))
    cache = root / "cache"
    if cache.is_dir():
        with file_lock(cache / ".lock", remove=True):
            for entry in sorted(cache.iterdir()):
                if entry.name == ".lock":
                    continue
                size = tree_bytes(entry)  # a link (to another root's artefact) is removed, never followed
                lab_build.remove_tree(entry)
                freed += size
                removed.append(str(entry))
                log(f"lab clean: removed {entry} ({size / 1e6:.0f} MB)")
            removed.append(str(cache / ".lock"))
    for folder in (cache, _labs_dir(root), root):
        with contextlib.suppress(OSError):  # not there, or holds something that is not ours
            folder.rmdir()
    log(f"lab clean: {len(labs)} labs down, {freed / 1e6:.0f} MB of caches freed under {root}")
    return {"labs": labs, "removed": removed, "bytes_freed": freed, "root_removed": not root.exists()}
