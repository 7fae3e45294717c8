"""Host tuning decisions: hugepages per NUMA node, sysctl, memlock, THP, CPU governor, kernel command line.

Pure functions over the raw text the `host_tuning` role reads on a host (`parse_host_state`) and the
layout plan (`gpu_topology.layout`): `plan_tuning` says what the host should look like, `runtime_changes` what
differs from what it looks like now. Nothing here touches a host.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

from vllm_fleet.errors import FleetInputError
from vllm_fleet.hostvalues import directive
from vllm_fleet.plan.host import HostPlan
from vllm_fleet.probe.hoststate import NODE_SYSFS, SHM_PATH, THP_SYSFS, HostState
from vllm_fleet.validate.kinds import Context
from vllm_fleet.validate.table import VARIABLES

PAGE_2M_KB = 2048
PAGE_1G_KB = 1048576
PAGE_SIZES_KB = {"2M": PAGE_2M_KB, "2MiB": PAGE_2M_KB, "1G": PAGE_1G_KB, "1GiB": PAGE_1G_KB}
THP_MODES = ("always", "madvise", "never")
THP_DEFRAG_MODES = ("always", "defer", "defer+madvise", "madvise", "never")
SHM_HUGE_MODES = ("never", "always", "within_size", "advise")
MiB = 2**20
GOVERNOR_GLOB = "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor"
# cpufreq's governors (scaling_available_governors): performance, powersave, schedutil, ondemand, ...
# Writes one value to sysfs files. The value and the paths arrive as arguments ($1, then the paths or
# globs, which the inner unquoted `for` expands): no variable is ever part of the script's text.
SYSFS_WRITE_SCRIPT = (
    'value=$1; shift; for pattern in "$@"; do for f in $pattern; do '
    'printf "%s\\n" "$value" > "$f" || exit 1; done; done'
)
# Per-node counts on the kernel command line (hugepages=0:N,1:M) exist since Linux 5.16.
PER_NODE_CMDLINE_KERNEL = (5, 16)


@dataclass(frozen=True)
class KvTierNeed:
    """Host memory one instance's CPU KV tier needs, and the NUMA nodes its memory is bound to."""

    instance: str
    nodes: tuple[int, ...]  # () = not bound: the kernel may place it on any node
    cpu_kv_bytes: int


@dataclass(frozen=True)
class TuningOptions:
    page_size_kb: int = PAGE_2M_KB
    margin_fraction: float = 0.10
    max_node_fraction: float = 0.90
    thp_enabled: str | None = "madvise"
    thp_defrag: str | None = "defer+madvise"
    governor: str | None = "performance"
    numa_balancing: str = "auto"  # auto: off where an instance is bound; off; keep
    service_user: str = "vllm"
    reserve_hugepages: bool = False  # a hugetlb pool sized on the CPU KV tier (vLLM's tier never maps it)
    shm_huge: str | None = "within_size"  # /dev/shm's huge= mount option (None leaves it)


@dataclass
class ShmPlan:
    """/dev/shm sized for the CPU KV tiers of every instance on the host (vLLM maps them there)."""

    needed_bytes: int  # the tiers plus the margin
    size_bytes: int  # the size /dev/shm gets: the need, or more where the host already gives more
    options: list[str]  # the mount options this plan sets: size=...m, huge=...
    remount: list[str]  # the options that differ from the mount now ([]: /dev/shm already matches)
    fstab_line: str


@dataclass
class NodeHugepages:
    node: int
    page_size_kb: int
    pages: int
    bytes: int
    instances: list[str] = field(default_factory=list)


@dataclass
class TuningPlan:
    page_size_kb: int
    hugepages: list[NodeHugepages]
    sysctl: dict[str, str]
    sysfs: list[tuple[str, str]]  # (path or glob, value) written at boot by the tuning unit
    kernel_cmdline: list[str]  # arguments that must be on the kernel command line (1 GiB pages)
    reboot_required: bool
    memlock_user: str
    reasons: list[str]
    warnings: list[str]
    shm: ShmPlan | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["sysfs"] = [{"path": p, "value": v} for p, v in self.sysfs]
        return out


def parse_page_size(value: str | int, variable: str = "host_tuning_hugepage_size") -> int:
    """`2M`/`2MiB`/`1G`/`1GiB` (or a size in kB) -> the page size in kB."""
    if isinstance(value, int) and value in (PAGE_2M_KB, PAGE_1G_KB):
        return value
    size = PAGE_SIZES_KB.get(str(value).strip())
    if size is None:
        raise FleetInputError(f"{variable}: {value!r} is not a hugepage size this role manages; use 2M or 1G")
    return size


def kernel_version(release: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", release)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


# --------------------------------------------------------------------------------------------------- planning


def kv_tier_needs(layout: dict[str, Any], cpu_kv_bytes: int | dict[str, int]) -> list[KvTierNeed]:
    """One need per layout instance: its CPU KV bytes (one number for all, or per instance name) and the nodes
    its memory is bound to (`numa_binding.nodes` when the mode binds, else none)."""
    needs = []
    for inst in layout.get("instances", []):
        name = str(inst.get("name"))
        amount = int(cpu_kv_bytes.get(name, 0)) if isinstance(cpu_kv_bytes, dict) else int(cpu_kv_bytes)
        if amount < 0:
            raise FleetInputError(
                f"vllm_service_kv_offload_cpu_bytes: {amount} for instance {name} is negative; "
                "give 0 or a size like 200GiB"
            )
        nodes = bound_nodes(inst.get("numa_binding"))
        needs.append(KvTierNeed(instance=name, nodes=nodes, cpu_kv_bytes=amount))
    return needs


def bound_nodes(binding: dict[str, Any] | None) -> tuple[int, ...]:
    """The NUMA nodes an instance's memory is bound to; () when it is not bound."""
    binding = binding or {}
    if binding.get("mode") not in ("numactl", "vllm"):
        return ()
    return tuple(sorted({int(n) for n in binding.get("nodes") or []}))


def plan_kv_tier_needs(plan: HostPlan) -> list[KvTierNeed]:
    """One need per instance of the host's plan (its CPU KV tier, where its memory is bound)."""
    return [
        KvTierNeed(instance=i.name, nodes=bound_nodes(i.numa_binding), cpu_kv_bytes=i.needs.cpu_kv_bytes)
        for i in plan.instances
    ]


def plan_hugepages(
    needs: list[KvTierNeed],
    node_memory_bytes: dict[int, int],
    *,
    page_size_kb: int = PAGE_2M_KB,
    margin_fraction: float = 0.10,
    max_node_fraction: float = 0.90,
) -> list[NodeHugepages]:
    """Pages per NUMA node: each bound instance's CPU KV bytes split evenly over its nodes, unbound ones over
    every node, plus the margin, rounded up to whole pages. Refuses a node asked for more than
    `max_node_fraction` of its memory (the rest of the host needs memory too)."""
    if margin_fraction < 0:
        raise FleetInputError(f"host_tuning_hugepages_margin: {margin_fraction} is negative; use e.g. 0.1")
    nodes = sorted(node_memory_bytes) or [0]
    page_bytes = page_size_kb * 1024
    wanted: dict[int, Fraction] = dict.fromkeys(nodes, Fraction(0))
    users: dict[int, list[str]] = {n: [] for n in nodes}
    for need in needs:
        if need.cpu_kv_bytes <= 0:
            continue
        targets = list(need.nodes) or nodes
        for node in targets:
            if node not in wanted:
                raise FleetInputError(
                    f"layout instance {need.instance}: bound to NUMA node {node}, but this host has nodes "
                    f"{nodes}; re-run the probe (playbooks/probe.yml) so the layout matches the host"
                )
            wanted[node] += Fraction(need.cpu_kv_bytes, len(targets))
            users[node].append(need.instance)
    plan = []
    for node in nodes:
        # Exact arithmetic: 100 GiB + 10 % is 56320 pages, not 56321 from a float's rounding.
        amount = wanted[node] * (1 + Fraction(str(margin_fraction)))
        pages = math.ceil(amount / page_bytes)
        total = node_memory_bytes.get(node)
        if total and pages * page_bytes > max_node_fraction * total:
            raise FleetInputError(
                f"vllm_service_kv_offload_cpu_bytes: NUMA node {node} would need {pages} hugepages of "
                f"{page_size_kb} kB "
                f"({pages * page_bytes / 2**30:.1f} GiB with the {margin_fraction:.0%} margin) but has "
                f"{total / 2**30:.1f} GiB; lower the CPU KV tier (cpu_bytes_to_use) or spread the instances "
                f"over more nodes"
            )
        plan.append(NodeHugepages(node, page_size_kb, pages, pages * page_bytes, sorted(set(users[node]))))
    return plan


def _mount_option(options: tuple[str, ...] | list[str], key: str) -> str | None:
    return next((o.split("=", 1)[1] for o in options if o.startswith(f"{key}=")), None)


def plan_shm(
    needs: list[KvTierNeed],
    state: HostState,
    *,
    margin_fraction: float,
    max_fraction: float,
    huge: str | None,
) -> tuple[ShmPlan | None, list[str], list[str]]:
    """/dev/shm for the CPU KV tiers: big enough for all of them plus the margin, never smaller than the host
    already gives it, and with transparent hugepages (`huge=`) where the kernel has them. Returns the plan
    (None: no tier, /dev/shm is left as it is), reasons and warnings."""
    total = sum(n.cpu_kv_bytes for n in needs)
    if total <= 0:
        return None, [], []
    if huge is not None and huge not in SHM_HUGE_MODES:
        raise FleetInputError(
            f"host_tuning_shm_huge: {huge!r} is not one of {', '.join(SHM_HUGE_MODES)} (or '' to leave it)"
        )
    needed = math.ceil(total * (1 + Fraction(str(margin_fraction))))
    memory = max(state.memory_bytes or 0, sum(state.node_memory_bytes.values()))
    if memory and needed > max_fraction * memory:
        raise FleetInputError(
            "vllm_service_kv_offload_cpu_bytes: the CPU KV tiers need "
            f"{needed / 2**30:.1f} GiB of /dev/shm with the {margin_fraction:.0%} margin "
            f"but the host has {memory / 2**30:.1f} GiB of memory; "
            "lower the tier or run fewer instances here"
        )
    reasons = [
        f"/dev/shm holds the CPU KV tier ({', '.join(n.instance for n in needs if n.cpu_kv_bytes)}): "
        f"{needed / 2**30:.2f} GiB with the {margin_fraction:.0%} margin"
    ]
    warnings: list[str] = []
    current = state.shm_size_bytes or 0
    size = max(math.ceil(needed / MiB), current // MiB)
    options = [f"size={size}m"]
    remount = [] if current >= needed else [f"size={size}m"]
    if huge and not state.shmem_thp:
        warnings.append(
            f"host_tuning_shm_huge: {huge}: this kernel has no transparent hugepages for tmpfs "
            f"({THP_SYSFS}/shmem_enabled is missing); /dev/shm keeps small pages"
        )
    elif huge:
        options.append(f"huge={huge}")
        if (_mount_option(state.shm_options, "huge") or "never") != huge:
            remount.append(f"huge={huge}")
        reasons.append(f"/dev/shm huge={huge}: the tier gets transparent hugepages without a reserved pool")
    fstab = directive(
        "fstab",
        "tmpfs",
        SHM_PATH,
        "tmpfs",
        f"rw,nosuid,nodev,{','.join(options)}",
        "0",
        "0",
        variable="host_tuning_shm_huge",
    )
    return ShmPlan(needed, size * MiB, options, remount, fstab), reasons, warnings


def kernel_cmdline_for(hugepages: list[NodeHugepages], kernel_release: str) -> list[str]:
    """Kernel arguments that reserve 1 GiB pages at boot (only boot can find that much contiguous memory)."""
    total = sum(h.pages for h in hugepages)
    if not hugepages or hugepages[0].page_size_kb != PAGE_1G_KB or total == 0:
        return []
    if kernel_version(kernel_release) >= PER_NODE_CMDLINE_KERNEL:
        per_node = ",".join(f"{h.node}:{h.pages}" for h in hugepages if h.pages)
        return ["hugepagesz=1G", f"hugepages={per_node}"]
    return ["hugepagesz=1G", f"hugepages={total}"]


def cmdline_has(cmdline: str, wanted: list[str]) -> bool:
    present = cmdline.split()
    return all(arg in present for arg in wanted)


def check_options(options: TuningOptions) -> None:
    """The values that reach a sysfs write, limits.d or fstab: names by pattern, fractions in range."""
    if options.thp_enabled is not None and options.thp_enabled not in THP_MODES:
        raise FleetInputError(
            f"host_tuning_thp_enabled: {options.thp_enabled!r} is not one of {', '.join(THP_MODES)}"
        )
    if options.thp_defrag is not None and options.thp_defrag not in THP_DEFRAG_MODES:
        raise FleetInputError(
            f"host_tuning_thp_defrag: {options.thp_defrag!r} is not one of {', '.join(THP_DEFRAG_MODES)}"
        )
    if options.numa_balancing not in ("auto", "off", "keep"):
        raise FleetInputError(
            f"host_tuning_numa_balancing: {options.numa_balancing!r} is not one of auto, off, keep"
        )
    if options.shm_huge is not None and options.shm_huge not in SHM_HUGE_MODES:
        raise FleetInputError(
            f"host_tuning_shm_huge: {options.shm_huge!r} is not one of {', '.join(SHM_HUGE_MODES)} "
            "(or '' to leave it)"
        )
    # the kinds preflight checks these variables by (vllm_fleet.validate.table), again where they are used
    for name, value in (
        ("host_tuning_cpu_governor", options.governor or ""),
        ("host_tuning_memlock_user", options.service_user),
        ("host_tuning_hugepages_margin", options.margin_fraction),
        ("host_tuning_hugepages_max_node_fraction", options.max_node_fraction),
    ):
        for message in VARIABLES[name].errors(value, name, Context()):
            raise FleetInputError(message)


def plan_tuning(state: HostState, needs: list[KvTierNeed], options: TuningOptions) -> TuningPlan:
    """What the host should look like: hugepages per node, sysctl, boot-time sysfs writes, kernel args."""
    reasons: list[str] = []
    warnings: list[str] = []
    check_options(options)
    shm, shm_reasons, shm_warnings = plan_shm(
        needs,
        state,
        margin_fraction=options.margin_fraction,
        max_fraction=options.max_node_fraction,
        huge=options.shm_huge,
    )
    reasons += shm_reasons
    warnings += shm_warnings
    if options.reserve_hugepages and shm:
        warnings.append(
            "host_tuning_hugepages: true reserves a hugetlb pool the size of the CPU KV tier, but vLLM maps "
            "the tier in /dev/shm (or pinned pages), never in that pool: the pool only takes memory from it"
        )
    hugepages = plan_hugepages(
        needs if options.reserve_hugepages else [],
        state.node_memory_bytes,
        page_size_kb=options.page_size_kb,
        margin_fraction=options.margin_fraction,
        max_node_fraction=options.max_node_fraction,
    )
    for h in hugepages:
        if h.pages:
            reasons.append(
                f"node {h.node}: {h.pages} x {h.page_size_kb} kB hugepages for the CPU KV tier of "
                f"{', '.join(h.instances)} (+{options.margin_fraction:.0%} margin)"
            )
    sysfs: list[tuple[str, str]] = []
    if not any(h.pages for h in hugepages):
        # Nothing to reserve: leave the kernel's pool alone (it may serve something else, e.g. DPDK).
        reasons.append(
            "no hugetlb pool planned (host_tuning_hugepages is off, or no CPU KV tier): "
            "the pool is left as it is"
        )
    elif options.page_size_kb == PAGE_2M_KB:
        for h in hugepages:
            path = f"{NODE_SYSFS}/node{h.node}/hugepages/hugepages-{PAGE_2M_KB}kB/nr_hugepages"
            sysfs.append((path, str(h.pages)))
    if options.thp_enabled:
        sysfs.append((f"{THP_SYSFS}/enabled", options.thp_enabled))
    if options.thp_defrag:
        sysfs.append((f"{THP_SYSFS}/defrag", options.thp_defrag))
    if options.governor:
        if state.governor is None:
            reasons.append("no cpufreq on this host: the CPU governor is left alone")
        elif state.governors_available and options.governor not in state.governors_available:
            warnings.append(
                f"CPU governor {options.governor!r} is not offered here "
                f"({' '.join(state.governors_available)}); left at {state.governor!r}"
            )
        else:
            sysfs.append((GOVERNOR_GLOB, options.governor))
    sysctl: dict[str, str] = {}
    bound = [n.instance for n in needs if n.nodes]
    if options.numa_balancing != "keep":
        wants_off = options.numa_balancing == "off" or bool(bound)
        if wants_off and state.numa_balancing is None:
            reasons.append("kernel.numa_balancing does not exist here: nothing to turn off")
        elif wants_off:
            sysctl["kernel.numa_balancing"] = "0"
            reasons.append(
                "kernel.numa_balancing=0: "
                + (
                    f"instances bound to NUMA nodes ({', '.join(bound)}): the kernel must not migrate their "
                    "pages away from their node"
                    if bound
                    else "asked for (host_tuning_numa_balancing: off)"
                )
            )
    cmdline = kernel_cmdline_for(hugepages, state.kernel_release)
    reboot = bool(cmdline) and not cmdline_has(state.cmdline, cmdline)
    if cmdline:
        reasons.append(f"1 GiB pages come from the kernel command line: {' '.join(cmdline)}")
        if kernel_version(state.kernel_release) < PER_NODE_CMDLINE_KERNEL:
            warnings.append(
                f"kernel {state.kernel_release or '?'} predates per-node hugepages= (5.16): the pages are "
                "split evenly over all nodes"
            )
    if reboot:
        reasons.append("the running kernel was booted without these arguments: a reboot is needed")
    return TuningPlan(
        page_size_kb=options.page_size_kb,
        hugepages=hugepages,
        sysctl=sysctl,
        sysfs=sysfs,
        kernel_cmdline=cmdline,
        reboot_required=reboot,
        memlock_user=options.service_user,
        reasons=reasons,
        warnings=warnings,
        shm=shm,
    )


def runtime_changes(plan: TuningPlan, state: HostState) -> list[str]:
    """Where the running host differs from the plan (what applying at runtime would change)."""
    changes = []
    if plan.page_size_kb == PAGE_2M_KB and any(h.pages for h in plan.hugepages):
        for h in plan.hugepages:
            now = state.hugepages.get((h.node, PAGE_2M_KB), 0)
            if now != h.pages:
                changes.append(f"node {h.node}: 2048 kB hugepages {now} -> {h.pages}")
    wanted = dict(plan.sysfs)
    for key, now in (("enabled", state.thp_enabled), ("defrag", state.thp_defrag)):
        want = wanted.get(f"{THP_SYSFS}/{key}")
        if want and now is not None and now != want:
            changes.append(f"transparent hugepages {key}: {now} -> {want}")
    want_gov = wanted.get(GOVERNOR_GLOB)
    if want_gov and state.governor != want_gov:
        changes.append(f"CPU governor: {state.governor} -> {want_gov}")
    for key, value in plan.sysctl.items():
        if key == "kernel.numa_balancing" and state.numa_balancing not in (None, value):
            changes.append(f"{key}: {state.numa_balancing} -> {value}")
    if plan.shm and plan.shm.remount:
        now = f"{state.shm_size_bytes / 2**30:.2f} GiB" if state.shm_size_bytes else "not mounted"
        changes.append(f"{SHM_PATH}: {now} -> remount with {','.join(plan.shm.remount)}")
    return changes


# -------------------------------------------------------------------------------------------------- rendering


def sysctl_conf(plan: TuningPlan) -> str:
    lines = ["# Written by vllm-fleet (host_tuning). Changes here are overwritten."]
    lines += [directive("sysctl", key, value) for key, value in sorted(plan.sysctl.items())]
    return "\n".join(lines) + "\n"


def limits_conf(plan: TuningPlan) -> str:
    # Pinned CPU KV buffers (cudaHostAlloc / torch pin_memory) count against RLIMIT_MEMLOCK.
    user = plan.memlock_user
    lines = [
        "# Written by vllm-fleet (host_tuning): pinned CPU KV-cache buffers need unlimited locked memory.",
        *(
            directive("limits", user, kind, "memlock", "unlimited", variable="host_tuning_memlock_user")
            for kind in ("soft", "hard")
        ),
    ]
    return "\n".join(lines) + "\n"


def sysfs_write_argv(plan: TuningPlan) -> list[list[str]]:
    """One argv per sysfs write (the role runs them with ansible.builtin.command; the boot unit as
    ExecStart=): a fixed script, the value and the path as its arguments."""
    return [["/bin/sh", "-c", SYSFS_WRITE_SCRIPT, "sh", value, path] for path, value in plan.sysfs]


def unit_exec_starts(plan: TuningPlan) -> list[str]:
    """`sysfs_write_argv` as ExecStart= lines of the boot-time unit, quoted by `directive('exec', ...)`."""
    return [directive("exec", "ExecStart", *argv, variable="host_tuning") for argv in sysfs_write_argv(plan)]


def tuning_unit_text(plan: TuningPlan) -> str:
    """The boot-time oneshot unit (vllm-fleet-tuning.service): the sysfs writes again at every boot."""
    pages = "/".join(str(h.pages) for h in plan.hugepages)
    lines = [
        f"# vllm-fleet host tuning at boot: {pages} hugepages of {plan.page_size_kb} kB per NUMA node, "
        "transparent hugepages, CPU governor. Written by host_tuning.",
        "[Unit]",
        "Description=vllm-fleet host tuning (hugepages per NUMA node, THP, CPU governor)",
        "DefaultDependencies=no",
        "After=local-fs.target systemd-sysctl.service",
        "Before=multi-user.target",
        "# Containers see /sys read-only: nothing to do there.",
        "ConditionPathIsReadWrite=/sys",
        "",
        "[Service]",
        "Type=oneshot",
        "RemainAfterExit=yes",
        *(unit_exec_starts(plan) or ["ExecStart=/bin/true"]),
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


def report_text(plan: TuningPlan, changes: list[str], applied: bool) -> str:
    lines = ["host tuning plan:"]
    if not any(h.pages for h in plan.hugepages):
        lines.append("  hugepages: none planned (the pool is left as it is)")
    for h in plan.hugepages if any(h.pages for h in plan.hugepages) else []:
        size = f"{h.bytes / 2**30:.2f} GiB"
        lines.append(f"  node {h.node}: {h.pages} hugepages of {h.page_size_kb} kB ({size})")
    for key, value in sorted(plan.sysctl.items()):
        lines.append(f"  sysctl {key} = {value}")
    for path, value in plan.sysfs:
        if not path.endswith("nr_hugepages"):
            lines.append(f"  {path} = {value}")
    if plan.kernel_cmdline:
        lines.append(f"  kernel command line: {' '.join(plan.kernel_cmdline)}")
    if plan.shm:
        need = f"{plan.shm.needed_bytes / 2**30:.2f} GiB of CPU KV"
        remount = f" (remount with {','.join(plan.shm.remount)})" if plan.shm.remount else ""
        lines.append(f"  {SHM_PATH}: {','.join(plan.shm.options)} for {need}{remount}")
    lines.append(f"  memlock unlimited for user {plan.memlock_user}")
    lines += [f"  why: {r}" for r in plan.reasons]
    lines += [f"  WARNING: {w}" for w in plan.warnings]
    if changes:
        verb = (
            "applied to the running kernel"
            if applied
            else "NOT applied at runtime (host_tuning_apply_runtime: false); written for the next boot"
        )
        lines.append(f"  changes, {verb}:")
        lines += [f"    {c}" for c in changes]
    else:
        lines.append("  the running host already matches")
    if plan.reboot_required:
        lines.append("  REBOOT REQUIRED for the kernel command line")
    return "\n".join(lines)
