"""Lab hosts: the plan of a lab (names, namespaces, addresses) and the Ansible inventory that reaches it.

A lab is N systemd-nspawn containers, each in its own network namespace, joined by a bridge that lives in a
per-lab controller namespace. Everything here is pure: names and addresses derive from the lab NAME alone,
so a crashed `up` can always be cleaned by `down --name NAME`, and several labs coexist (distinct namespaces,
bridge, veths and subnet). The side effects live in `vllm_fleet.lab.run` (boot, teardown) and
`vllm_fleet.lab.build` (cached root filesystem, wheelhouse, tiny model).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vllm_fleet.errors import FleetInputError

DEFAULT_LAB_ROOT = "/var/lib/vllm-fleet-lab"
LAB_ROOT_ENV = "VLLM_FLEET_LAB_ROOT"
# Paths inside every lab host where the controller's cached artefacts appear, read-only.
HOST_WHEELHOUSE = "/srv/vllm-fleet-lab/wheelhouse"
HOST_MODEL = "/srv/vllm-fleet-lab/models/tiny"
# Linux interface names hold at most 15 characters (IFNAMSIZ - 1).
IFNAME_MAX = 15
MAX_HOSTS = 50
# Lab names become part of netns names and of file names; "." separates the lab name from the host name in a
# netns name, so it must never occur in either.
_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,23}$")
_HOST_RE = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
NETNS_PREFIX = "vfl-"
# What `lab up` runs on the controller (scripts/bootstrap installs them).
CONTROLLER_TOOLS = (
    "ip",
    "mount",
    "umount",
    "nsenter",
    "systemd-nspawn",
    "debootstrap",
    "chroot",
    "ssh",
    "ssh-keygen",
    "nc",
)


# vLLM's switch that keeps the lab's engine worker inside the engine core process (inventory/group_vars/lab/
# vllm.yml sets it to "0"; vllm/platforms/cpu.py forces a worker process without it)
ENGINE_IN_PROCESS_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def worker_process_vars(lab_vars: dict[str, Any]) -> dict[str, Any]:
    """The lab variables (inventory/group_vars/lab/vllm.yml, parsed) for a lab whose vLLM runs its engine's
    worker in a process of its own: vLLM's own layout on its CPU build, and the one it uses for TP > 1 on
    GPUs (the `mp` executor: a worker process, the engine's shared-memory queue between them). The lab's
    other variables stay. For the labs whose subject includes that layout: the hardening lab (the hardened
    unit runs it) and the multi-host lab (vLLM needs it for pipeline parallelism over hosts)."""
    env = {k: v for k, v in lab_vars["vllm_service_extra_env"].items() if k != ENGINE_IN_PROCESS_ENV}
    return {"vllm_service_extra_env": env}


def lab_root(env: dict[str, str] | None = None) -> Path:
    """The folder holding cached artefacts and per-lab state (`$VLLM_FLEET_LAB_ROOT`, else the default)."""
    env = os.environ if env is None else env
    value = env.get(LAB_ROOT_ENV, "") or DEFAULT_LAB_ROOT
    if not value.startswith("/"):
        raise FleetInputError(
            f"{LAB_ROOT_ENV}={value!r} is not an absolute path; set it to a folder such as {DEFAULT_LAB_ROOT}"
        )
    return Path(value)


def check_lab_name(name: str) -> str:
    if not _NAME_RE.match(name or ""):
        raise FleetInputError(
            f"lab name (--name) {name!r} is not valid: use 1-24 characters a-z, 0-9 and '-', starting with a "
            "letter (for example 't1' or 'molecule-default')"
        )
    return name


def host_names(name: str, hosts: int | None = None, names: list[str] | None = None) -> list[str]:
    """The lab's host names: the given ones, or `<lab>-1` .. `<lab>-N`."""
    if names:
        if hosts not in (None, len(names)):
            raise FleetInputError(
                f"--hosts {hosts} and --host {' '.join(names)} disagree: give either a count or the names"
            )
        result = list(names)
    else:
        if hosts is None:
            raise FleetInputError("lab up needs --hosts N or one --host NAME per host")
        if not 1 <= hosts <= MAX_HOSTS:
            raise FleetInputError(f"--hosts {hosts} is out of range: use 1 to {MAX_HOSTS}")
        result = [f"{name}-{i}" for i in range(1, hosts + 1)]
    for host in result:
        if not _HOST_RE.match(host):
            raise FleetInputError(
                f"lab host name {host!r} is not valid: use 1-32 characters a-z, 0-9 and '-', starting with a "
                "letter"
            )
    duplicates = sorted({h for h in result if result.count(h) > 1})
    if duplicates:
        raise FleetInputError(
            f"lab host names repeat: {', '.join(duplicates)}; give each host a distinct name"
        )
    if len(result) > MAX_HOSTS:
        raise FleetInputError(f"{len(result)} lab hosts requested: at most {MAX_HOSTS}")
    return result


def _digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def lab_subnet(name: str) -> ipaddress.IPv4Network:
    """A /24 within 10.160.0.0-10.223.255.255 derived from the lab name. Distinct labs get distinct
    addresses, which keeps the SSH ControlPersist sockets (keyed by address) of two labs apart."""
    n = int(_digest(name)[6:12], 16)
    return ipaddress.IPv4Network(f"10.{160 + (n >> 8) % 64}.{n & 0xFF}.0/24")


@dataclass(frozen=True)
class LabHost:
    name: str
    index: int
    netns: str
    address: str
    veth: str  # the controller-side end, attached to the bridge; the host side is eth0 inside `netns`

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LabPlan:
    name: str
    root: str
    ctl_netns: str
    bridge: str
    subnet: str
    gateway: str
    hosts: list[LabHost] = field(default_factory=list)

    @property
    def lab_dir(self) -> Path:
        return Path(self.root) / "labs" / self.name

    @property
    def key_file(self) -> Path:
        return self.lab_dir / "id_ed25519"

    @property
    def inventory_file(self) -> Path:
        return self.lab_dir / "inventory.yml"

    def host_dir(self, host: str) -> Path:
        return self.lab_dir / "hosts" / host

    def proxy_command(self) -> str:
        return f"ip netns exec {self.ctl_netns} nc %h %p"

    def ssh_common_args(self) -> str:
        return (
            f"-o ProxyCommand='{self.proxy_command()}' -o StrictHostKeyChecking=no "
            "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["hosts"] = [h.to_dict() for h in self.hosts]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LabPlan:
        hosts = [LabHost(**h) for h in data.get("hosts", [])]
        return cls(**{**data, "hosts": hosts})


def plan_lab(name: str, hosts: list[str], root: Path | str) -> LabPlan:
    """Every name and address of a lab, from its name and host names alone."""
    check_lab_name(name)
    tag = _digest(name)[:6]
    subnet = lab_subnet(name)
    base = subnet.network_address
    planned = []
    for index, host in enumerate(hosts):
        veth = f"vfl{tag}h{index}"
        if len(veth) > IFNAME_MAX:  # only reachable with MAX_HOSTS raised past 99
            raise FleetInputError(f"interface name {veth!r} is longer than {IFNAME_MAX} characters")
        planned.append(
            LabHost(
                name=host,
                index=index,
                netns=f"{NETNS_PREFIX}{name}.{host}",
                address=str(base + 10 + index),
                veth=veth,
            )
        )
    return LabPlan(
        name=name,
        root=str(root),
        ctl_netns=f"{NETNS_PREFIX}{name}.ctl",
        bridge=f"vfl{tag}br",
        subnet=str(subnet),
        gateway=str(base + 1),
        hosts=planned,
    )


def lab_of_netns(netns: str) -> str | None:
    """The lab a network namespace belongs to (`vfl-<lab>.<host>`), or None for anyone else's."""
    if not netns.startswith(NETNS_PREFIX) or "." not in netns:
        return None
    return netns[len(NETNS_PREFIX) :].split(".", 1)[0]


def inventory(plan: LabPlan, *, with_vllm: bool = True) -> dict[str, Any]:
    """The Ansible inventory (a YAML document as a dict) reaching the lab from the root network namespace."""
    group_vars: dict[str, Any] = {
        "vllm_fleet_lab_name": plan.name,
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(plan.key_file),
        "ansible_ssh_common_args": plan.ssh_common_args(),
        "ansible_python_interpreter": "/usr/bin/python3",
    }
    if with_vllm:
        group_vars["vllm_install_wheelhouse"] = HOST_WHEELHOUSE
        group_vars["vllm_install_model_source"] = HOST_MODEL
    return {
        "all": {
            "children": {
                "lab": {
                    "hosts": {h.name: {"ansible_host": h.address} for h in plan.hosts},
                    "vars": group_vars,
                }
            }
        }
    }


def nspawn_argv(plan: LabPlan, host: LabHost, root_dir: Path, binds_ro: dict[str, str]) -> list[str]:
    """The systemd-nspawn command that boots one host: a writable overlay root on disk (`root_dir`), its own
    network namespace, the lab's authorized_keys and the read-only artefacts."""
    argv = [
        "systemd-nspawn",
        "--quiet",
        # no systemd runs as PID 1 on the controller: nothing to register with, no scope unit to create
        "--register=no",
        "--keep-unit",
        "--console=passive",
        f"--machine={host.name}",
        f"--hostname={host.name}",
        f"--network-namespace-path=/run/netns/{host.netns}",
        # the image's /etc/resolv.conf (the lab's own, see resolv_conf) as it is: nspawn's default copies the
        # controller's, whose nameserver a lab host cannot reach
        "--resolv-conf=off",
        f"--bind-ro={plan.lab_dir / 'authorized_keys'}:/root/.ssh/authorized_keys",
    ]
    argv += [f"--bind-ro={src}:{dest}" for dest, src in sorted(binds_ro.items())]
    argv += ["--boot", f"--directory={root_dir}"]
    return argv


# The cgroup, in each hierarchy systemd-nspawn reads its own cgroup from, where a lab host's nspawn starts:
# <mount>/vllm-fleet-lab/<lab>/<host>. nspawn (--keep-unit) puts the container below its own cgroup
# (<own>/payload); started from one cgroup, every host of every lab shared one payload cgroup, so a unit
# stopped on one host removed the cgroup another host was starting the same unit in (status=219/CGROUP).
CGROUP_PARENT = "vllm-fleet-lab"


def systemd_cgroup_mounts(mountinfo: str) -> list[Path]:
    """Where the cgroup hierarchies that systemd tracks processes in are mounted, from /proc/self/mountinfo:
    the unified (cgroup2) hierarchy and the named v1 hierarchy name=systemd (both on a hybrid host)."""
    found = []
    for line in mountinfo.splitlines():
        mount, sep, fs = line.partition(" - ")
        if not sep:
            continue
        fstype, _source, options = [*fs.split(), "", "", ""][:3]
        if fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in options.split(",")):
            found.append(Path(mount.split()[4].replace("\\040", " ")))
    return sorted(set(found))


def lab_cgroup(mount: Path, lab_name: str) -> Path:
    """The cgroup that holds every host of lab `lab_name` in the hierarchy mounted at `mount`."""
    return mount / CGROUP_PARENT / check_lab_name(lab_name)


def in_cgroups_argv(cgroups: list[Path], argv: list[str]) -> list[str]:
    """`argv` started inside `cgroups` (one per hierarchy): a shell writes its own PID into each cgroup.procs,
    then execs argv (same PID). systemd-nspawn reads its cgroup when it starts, so moving it later is too
    late; a shell rather than Popen's preexec_fn, which is unsafe in a process with threads."""
    if not cgroups:
        return argv
    script = 'while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs" || exit 125; shift; done; shift; exec "$@"'
    return ["/bin/sh", "-c", script, "sh", *map(str, cgroups), "--", *argv]


def started_nspawn(argv: list[str]) -> list[str]:
    """The systemd-nspawn command in a process's argv: the argv itself, or what `in_cgroups_argv`'s shell
    execs (a process of `lab up` still in that shell has not become nspawn yet, but it will); else []."""
    if argv[:2] == ["/bin/sh", "-c"] and "--" in argv:
        argv = argv[argv.index("--") + 1 :]
    return argv if argv and argv[0].endswith("systemd-nspawn") else []


def hosts_file(plan: LabPlan) -> str:
    """/etc/hosts for every host of the lab: each name resolves to its lab address (the hosts have no DNS;
    torch's gloo and vLLM look their own hostname up and stall or fall back to loopback otherwise)."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{h.address}\t{h.name}" for h in plan.hosts]
    return "\n".join(lines) + "\n"


def resolv_conf() -> str:
    """/etc/resolv.conf for every lab host: no nameserver. The hosts have no network beyond the lab, so no
    DNS server is reachable; with none listed glibc asks 127.0.0.1:53, where nothing listens, and a lookup
    fails at once. With the controller's nameserver copied in, each lookup waited out its timeouts (10 s):
    apt, trying the rootfs's deb.debian.org source first for every package both it and a lab mirror hold,
    spent ~10 s per .deb before falling back to the mirror (issue 20)."""
    return "# vllm-fleet lab host: no DNS (no network beyond the lab); names come from /etc/hosts\n"


def system_state_ok(state: str) -> bool:
    """`systemctl is-system-running` answers that count as booted (degraded: some unit failed, as in
    containers where hardware units cannot start)."""
    return state.strip() in ("running", "degraded")
