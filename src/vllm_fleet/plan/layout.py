"""Which GPUs serve together, where each vLLM instance is bound, and why (in words a user reads).

`plan_layout(topology, tensor_parallel_size)` turns a `Topology` into `Layout.instances`; every decision
adds a sentence to the instance's `reasons` (or the layout's), which `format_probe_report` prints. The rules:

- GPUs joined by NVLink form one placement group; other GPUs are grouped by their NUMA node (or, with NUMA
  unknown, by the PCIe links that do not cross the SMP interconnect, i.e. anything but `SYS`).
- Instances of `tensor_parallel_size` GPUs are carved inside a group first; only leftovers span groups.
- Binding: all GPUs on node N -> a process-wide `numactl --cpunodebind=N --membind=N` (mode `numactl`);
  spanning nodes -> vLLM's own per-worker binding on >= 0.20 (mode `vllm`), else unbound with a warning;
  NUMA unknown -> mode `none`.
- P2P not OK inside an instance -> custom all-reduce off and `NCCL_P2P_DISABLE=1`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_fleet import flags
from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.model import check_heads, text_config
from vllm_fleet.probe.hoststate import HostState
from vllm_fleet.probe.topology import (
    LINK_MEANINGS,
    P2P_STATUSES,
    Topology,
    format_cpu_list,
    link_kind,
)

_NO_P2P_MODELS = ("RTX 4090",)  # GeForce cards whose driver refuses GPU peer-to-peer


@dataclass
class Instance:
    """One `vllm serve` process: its GPUs, port, NUMA binding, environment and the reasons behind them.

    `numa_binding`: {"mode": "numactl"|"vllm"|"none", "nodes": [...]}; for `numactl` the one node to bind to
    (plus "membind_nodes" when that node has no memory of its own), for `vllm` one node per GPU in
    `gpus` order (the value of `--numa-bind-nodes`), for `none` empty.
    """

    name: str
    gpus: list[int]
    numa_node: int | None
    tensor_parallel_size: int
    port: int
    cuda_visible_devices: str
    numa_binding: dict[str, Any]
    disable_custom_all_reduce: bool
    env: dict[str, str]
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    device: str = "cuda"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "device": self.device,
            "gpus": list(self.gpus),
            "numa_node": self.numa_node,
            "tensor_parallel_size": self.tensor_parallel_size,
            "port": self.port,
            "cuda_visible_devices": self.cuda_visible_devices,
            "numa_binding": dict(self.numa_binding),
            "disable_custom_all_reduce": self.disable_custom_all_reduce,
            "env": dict(self.env),
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Instance:
        try:
            return cls(
                name=str(data["name"]),
                gpus=[int(g) for g in data.get("gpus") or []],
                numa_node=data.get("numa_node"),
                tensor_parallel_size=int(data.get("tensor_parallel_size") or 1),
                port=int(data["port"]),
                cuda_visible_devices=str(data.get("cuda_visible_devices") or ""),
                numa_binding=dict(data.get("numa_binding") or {"mode": "none", "nodes": []}),
                disable_custom_all_reduce=bool(data.get("disable_custom_all_reduce", False)),
                env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
                reasons=list(data.get("reasons") or []),
                warnings=list(data.get("warnings") or []),
                device=str(data.get("device") or "cuda"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FleetInputError(
                f"layout instance {dict(data)!r}: {exc!r}; expected the JSON of "
                "vllm_fleet.plan.layout.Instance "
                "(the gpu_topology.layout fact): re-run the probe"
            ) from exc


@dataclass
class Layout:
    instances: list[Instance]
    tensor_parallel_size: int
    idle_gpus: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    vllm_version: str | None = None

    @property
    def cpu_only(self) -> bool:
        return all(i.device == "cpu" for i in self.instances)

    def to_dict(self) -> dict[str, Any]:
        return {
            "instances": [i.to_dict() for i in self.instances],
            "tensor_parallel_size": self.tensor_parallel_size,
            "idle_gpus": list(self.idle_gpus),
            "cpu_only": self.cpu_only,
            "vllm_version": self.vllm_version,
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | list[Any]) -> Layout:
        """From `to_dict()` output, or from a bare list of instances (the CLI's `layout` key)."""
        if isinstance(data, list):
            instances = [Instance.from_dict(i) for i in data]
            tp = instances[0].tensor_parallel_size if instances else 1
            return cls(instances=instances, tensor_parallel_size=tp)
        return cls(
            instances=[Instance.from_dict(i) for i in data.get("instances") or []],
            tensor_parallel_size=int(data.get("tensor_parallel_size") or 1),
            idle_gpus=[int(g) for g in data.get("idle_gpus") or []],
            reasons=list(data.get("reasons") or []),
            warnings=list(data.get("warnings") or []),
            vllm_version=data.get("vllm_version"),
        )


# ------------------------------------------------------------------------------------------ helpers


def _gpu_list(gpus: list[int]) -> str:
    return ", ".join(f"GPU{g}" for g in gpus)


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FleetInputError(f"{name}: {value!r} is not a positive whole number; give e.g. 1, 2, 4 or 8")
    return value


def _numa_bind_by_vllm(vllm_version: str | None) -> bool:
    """Whether the release binds each worker itself (--numa-bind, 0.20+); None: the newest catalogued."""
    return flags.release(vllm_version or flags.newest_release()).has("--numa-bind")


def model_heads(config: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(attention heads, KV heads) from a config.json; multimodal configs nest them under `text_config`.

    A config without `num_key_value_heads` is multi-head attention: as many KV heads as attention heads.
    """
    merged = text_config(dict(config))  # the one merge of a wrapped config (plan.model): its section wins
    heads = merged.get("num_attention_heads")
    kv_heads = merged.get("num_key_value_heads", heads)
    for name, value in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise FleetInputError(f"model config: {name} is {value!r}; expected a whole number")
    return heads, kv_heads


@dataclass
class _Group:
    gpus: list[int]
    why: str


def placement_groups(topology: Topology) -> list[_Group]:
    """GPUs that may share an instance without crossing the SMP interconnect (or that NVLink joins)."""
    n = len(topology.gpus)
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: int, b: int) -> None:
        parent[find(a)] = find(b)

    numa = [g.numa_node for g in topology.gpus]
    for i in range(n):
        for j in range(i + 1, n):
            kind = link_kind(topology.link(i, j))
            if kind == "nvlink":
                union(i, j)
            elif numa[i] is not None and numa[j] is not None:
                if numa[i] == numa[j]:
                    union(i, j)
            elif kind in ("pcie", "unknown"):
                union(i, j)
    members: dict[int, list[int]] = {}
    for i in range(n):
        members.setdefault(find(i), []).append(i)
    groups = []
    for gpus in sorted(members.values(), key=lambda m: m[0]):
        kinds = {link_kind(topology.link(a, b)) for a in gpus for b in gpus if a < b}
        nodes = sorted({numa[g] for g in gpus if numa[g] is not None})
        if kinds == {"nvlink"}:
            why = "joined by NVLink"
        elif nodes and all(numa[g] is not None for g in gpus):
            why = f"on NUMA node {nodes[0]}" if len(nodes) == 1 else f"on NUMA nodes {nodes}"
            if "sys" in kinds:
                why += " (topo -m shows SYS between them even so: their PCIe traffic crosses the CPU)"
        elif kinds <= {"pcie"}:
            why = "joined by PCIe without crossing the SMP interconnect"
        else:
            why = "links unknown"
        groups.append(_Group(gpus=gpus, why=why))
    return groups


def _auto_tp(groups: list[_Group], heads: int | None, kv_heads: int | None) -> int:
    smallest = min(len(g.gpus) for g in groups)
    tp = 1
    while tp * 2 <= smallest:
        tp *= 2
    while tp > 1:
        try:
            check_heads(tp, heads, kv_heads)
            return tp
        except FleetInputError:
            tp //= 2
    return 1


def _carve(groups: list[_Group], tp: int) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """(instances inside one group, instances spanning groups, idle GPUs)."""
    inside: list[list[int]] = []
    leftovers: list[int] = []
    for group in groups:
        full = len(group.gpus) // tp * tp
        inside.extend(group.gpus[k : k + tp] for k in range(0, full, tp))
        leftovers.extend(group.gpus[full:])
    spanning = [leftovers[k : k + tp] for k in range(0, len(leftovers) // tp * tp, tp)]
    idle = leftovers[len(leftovers) // tp * tp :]
    return inside, spanning, idle


def _memory_node(topology: Topology, node: int) -> tuple[int, str | None]:
    """The node to take memory from: `node` itself unless it has none (memoryless NPS/CXL layouts)."""
    by_id = {n.id: n for n in topology.numa_nodes}
    own = by_id.get(node)
    if own is None or own.memory_mb != 0:
        return node, None
    with_memory = [n.id for n in topology.numa_nodes if n.memory_mb]
    if not with_memory:
        return node, None
    distance = topology.numa_distances.get(node, {})
    nearest = min(with_memory, key=lambda n: (distance.get(n, 1_000), n))
    return nearest, (
        f"NUMA node {node} has no memory of its own (0 MB in numactl --hardware): memory is bound to the "
        f"nearest "
        f"node with memory, {nearest}, instead (--membind={node} would fail every allocation)"
    )


def _binding(
    topology: Topology, gpus: list[int], numa_bind_by_vllm: bool, vllm_version: str | None
) -> tuple[dict[str, Any], int | None, list[str], list[str]]:
    nodes = [topology.gpus[g].numa_node for g in gpus]
    reasons: list[str] = []
    warnings: list[str] = []
    if any(n is None for n in nodes):
        unknown = [g for g in gpus if topology.gpus[g].numa_node is None]
        source = topology.gpus[unknown[0]].numa_source
        reasons.append(f"NUMA binding: none. The NUMA node of {_gpu_list(unknown)} is {source}.")
        if len(topology.numa_nodes) == 1:
            reasons.append(
                f"The host has a single NUMA node ({topology.numa_nodes[0].id}), so binding would change "
                "nothing anyway."
            )
        elif len(topology.numa_nodes) > 1:
            warnings.append(
                f"{_gpu_list(unknown)}: NUMA node unknown on a host with {len(topology.numa_nodes)} NUMA "
                "nodes: the instance runs unbound and may use memory far from its GPUs"
            )
        return {"mode": "none", "nodes": []}, None, reasons, warnings
    distinct = sorted({n for n in nodes if n is not None})
    if len(distinct) == 1:
        node = distinct[0]
        binding: dict[str, Any] = {"mode": "numactl", "nodes": [node]}
        reasons.append(
            f"NUMA binding: numactl --cpunodebind={node} --membind={node} around the whole vLLM process, "
            f"because all its GPUs sit on NUMA node {node}: its CPU threads, pinned host buffers (the CPU KV "
            "tier) and page cache stay beside the GPUs."
        )
        membind, why = _memory_node(topology, node)
        if why:
            binding["membind_nodes"] = [membind]
            warnings.append(why)
        return binding, node, reasons, warnings
    per_gpu = [int(n) for n in nodes if n is not None]
    if numa_bind_by_vllm:
        reasons.append(
            f"NUMA binding: vLLM's own (--numa-bind --numa-bind-nodes {' '.join(map(str, per_gpu))}), "
            f"because "
            f"the instance spans NUMA nodes {distinct}: each GPU worker is bound to its own GPU's node. No "
            "process-wide numactl wrapper: vLLM skips its own binding when the process is already "
            "constrained."
        )
        return {"mode": "vllm", "nodes": per_gpu}, None, reasons, warnings
    release = f"vLLM {vllm_version}" if vllm_version else "an unknown vLLM release"
    fit = 1
    while fit * 2 <= min(per_gpu.count(node) for node in distinct):
        fit *= 2
    warnings.append(
        f"{_gpu_list(gpus)} span NUMA nodes {distinct} and {release} has no per-worker NUMA binding "
        "(--numa-bind arrived in 0.20): the instance runs unbound. Prefer a tensor_parallel_size that "
        f"keeps each instance on one node (here {len(gpus) // fit} x TP{fit} instead of one TP{len(gpus)}), "
        "or give the vLLM version if it is >= 0.20."
    )
    reasons.append(f"NUMA binding: none, because the instance spans NUMA nodes {distinct} (see warnings).")
    return {"mode": "none", "nodes": []}, None, reasons, warnings


def _p2p(topology: Topology, gpus: list[int]) -> tuple[bool, bool, list[str]]:
    """(disable custom all-reduce, NCCL_P2P_DISABLE, reasons)."""
    if len(gpus) == 1:
        return False, False, ["One GPU: no all-reduce between GPUs, so P2P does not matter."]
    pairs = [(a, b) for a in gpus for b in gpus if a < b]
    all_nvlink = all(link_kind(topology.link(a, b)) == "nvlink" for a, b in pairs)
    has_matrix = topology.p2p_read is not None or topology.p2p_write is not None
    pcie_limit = (
        "custom all-reduce is off: vLLM supports it on more than two GPUs only over NVLink (it would "
        "disable it itself with a warning)"
    )
    if has_matrix:
        bad = [(a, b, topology.p2p_status(a, b)) for a, b in pairs if topology.p2p_status(a, b) != "OK"]
        if bad:
            listed = ", ".join(f"GPU{a}-GPU{b} {s} ({P2P_STATUSES.get(s or 'U', s)})" for a, b, s in bad)
            return (
                True,
                True,
                [
                    f"P2P is not available ({listed}): custom all-reduce off (--disable-custom-all-reduce) "
                    "and "
                    "NCCL_P2P_DISABLE=1 so NCCL stages transfers through host memory instead of trying "
                    "peer access."
                ],
            )
        p2p_note = "P2P reads/writes are OK between all its GPUs (nvidia-smi topo -p2p)"
    else:
        names = {topology.gpus[g].name or "" for g in gpus}
        no_p2p = sorted(n for n in names if any(model in n for model in _NO_P2P_MODELS))
        if no_p2p:
            return (
                True,
                True,
                [
                    f"{', '.join(no_p2p)} has no GPU peer-to-peer support: custom all-reduce off and "
                    "NCCL_P2P_DISABLE=1 (P2P was not probed; probe `nvidia-smi topo -p2p r` to confirm)."
                ],
            )
        if not all_nvlink and len(gpus) > 2:
            return True, False, [f"P2P was not probed; {pcie_limit}."]
        if not all_nvlink:
            return (
                False,
                False,
                [
                    "P2P was not probed: custom all-reduce left to vLLM, which tests P2P at start-up and "
                    "turns it off "
                    "itself when the test fails; give the `nvidia-smi topo -p2p r` output to decide here."
                ],
            )
        p2p_note = "P2P not probed, but NVLink joins all its GPUs, which gives P2P"
    if len(gpus) > 2 and not all_nvlink:
        return True, False, [f"{p2p_note}, but {pcie_limit}."]
    link = "NVLink" if all_nvlink else "PCIe"
    return False, False, [f"{p2p_note}: custom all-reduce allowed ({link})."]


def _cpu_layout(topology: Topology, base_port: int, tp: int | None) -> Layout:
    reasons = [
        "No NVIDIA GPU found: one vLLM instance on the CPU backend.",
        # what the lab runs: an info line, not a warning nobody can act on (issue 20)
        "KV cache: VLLM_CPU_KVCACHE_SPACE GiB of host memory (vllm_service_extra_env; the lab sets 1), not a "
        "GPU budget, unless vllm_service_kv_cache_memory_bytes is set; verify checks the size vLLM logs at "
        "startup ('CPU KV cache size: N tokens').",
    ]
    warnings = []
    if tp not in (None, 1):
        warnings.append(
            f"tensor_parallel_size {tp} ignored: the host has no GPUs, the CPU instance runs TP1."
        )
    nodes = [n for n in topology.numa_nodes if n.cpus]
    if nodes:
        node = 0 if any(n.id == 0 for n in nodes) else nodes[0].id
        binding: dict[str, Any] = {"mode": "numactl", "nodes": [node]}
        why = (
            f"NUMA binding: numactl --cpunodebind={node} --membind={node}, so the CPU backend's threads "
            f"and its KV "
            f"cache share one node (node {node}: CPUs "
            f"{format_cpu_list(next(n.cpus for n in nodes if n.id == node))})."
        )
        membind, note = _memory_node(topology, node)
        if note:
            binding["membind_nodes"] = [membind]
            warnings.append(note)
        numa_node: int | None = node
    else:
        binding, numa_node = {"mode": "none", "nodes": []}, None
        why = "NUMA binding: none, because no numactl --hardware / lscpu NUMA facts were given."
    instance = Instance(
        name="i0",
        gpus=[],
        numa_node=numa_node,
        tensor_parallel_size=1,
        port=base_port,
        cuda_visible_devices="",
        numa_binding=binding,
        disable_custom_all_reduce=False,
        env={},
        reasons=[why],
        device="cpu",
    )
    return Layout(instances=[instance], tensor_parallel_size=1, reasons=reasons, warnings=warnings)


# ------------------------------------------------------------------------------------------ the planner


def plan_layout(
    topology: Topology,
    tensor_parallel_size: int | None = None,
    *,
    num_attention_heads: int | None = None,
    num_key_value_heads: int | None = None,
    model_config: Mapping[str, Any] | None = None,
    vllm_version: str | None = None,
    base_port: int = 8000,
) -> Layout:
    """The instances to run on this host. `tensor_parallel_size=None` picks one (explained in `reasons`).

    Head counts given explicitly win over those read from `model_config` (the model's config.json).
    """
    if model_config:
        heads, kv_heads = model_heads(model_config)
        num_attention_heads = num_attention_heads if num_attention_heads is not None else heads
        num_key_value_heads = num_key_value_heads if num_key_value_heads is not None else kv_heads
    if not topology.complete:
        raise FleetInputError(
            f"topology: rows {', '.join(topology.missing_rows)} of the topo -m matrix are missing (a "
            "truncated paste?), so the links between those GPUs are unknown; give the whole "
            "`nvidia-smi topo -m` output"
        )
    port = _positive_int(base_port, "base_port")
    if port > 65535:
        raise FleetInputError(f"base_port: {port} is above 65535; give a free TCP port such as 8000")
    numa_bind_by_vllm = _numa_bind_by_vllm(vllm_version)
    n = len(topology.gpus)
    if n == 0:
        layout = _cpu_layout(topology, port, tensor_parallel_size)
        layout.vllm_version = vllm_version
        return layout
    groups = placement_groups(topology)
    reasons: list[str] = []
    warnings: list[str] = list(topology.warnings)
    if tensor_parallel_size is None:
        tp = _auto_tp(groups, num_attention_heads, num_key_value_heads)
        reasons.append(
            f"tensor_parallel_size not given: TP{tp}, the largest power of two that fits in the smallest "
            "placement group" + (" and divides the model's heads" if num_attention_heads else "") + "."
        )
    else:
        tp = _positive_int(tensor_parallel_size, "tensor_parallel_size")
        if tp > n:
            raise FleetInputError(
                f"tensor_parallel_size: {tp} but the host has {n} GPU{'s' if n > 1 else ''}; give at most {n}"
            )
    reasons.extend(check_heads(tp, num_attention_heads, num_key_value_heads))
    for group in groups:
        reasons.append(f"Placement group {_gpu_list(group.gpus)}: {group.why}.")
    inside, spanning, idle = _carve(groups, tp)
    if spanning:
        reasons.append(
            f"TP{tp} does not fit inside one placement group for "
            f"{', '.join(_gpu_list(c) for c in spanning)}: "
            "those instances span groups, so their all-reduce crosses the SMP interconnect."
        )
    if idle:
        warnings.append(
            f"{_gpu_list(idle)} left idle: {len(idle)} GPU(s) cannot form another TP{tp} instance."
        )
    reasons.append(
        "GPU numbers are nvidia-smi's (PCI bus order); CUDA_DEVICE_ORDER=PCI_BUS_ID makes CUDA count the "
        "same way "
        "(its default puts the fastest GPU first), so CUDA_VISIBLE_DEVICES names the GPUs planned here."
    )
    instances = []
    for k, gpus in enumerate(sorted(inside + spanning, key=lambda c: c[0])):
        binding, numa_node, why_numa, numa_warnings = _binding(
            topology, gpus, numa_bind_by_vllm, vllm_version
        )
        disable_car, nccl_p2p_off, why_p2p = _p2p(topology, gpus)
        visible = ",".join(str(g) for g in gpus)
        env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": visible}
        if nccl_p2p_off:
            env["NCCL_P2P_DISABLE"] = "1"
        links = sorted({topology.link(a, b) or "?" for a in gpus for b in gpus if a < b})
        what = f"{_gpu_list(gpus)} as TP{tp}" + (f", linked by {'/'.join(links)}" if links else "")
        instances.append(
            Instance(
                name=f"i{k}",
                gpus=list(gpus),
                numa_node=numa_node,
                tensor_parallel_size=tp,
                port=port + k,
                cuda_visible_devices=visible,
                numa_binding=binding,
                disable_custom_all_reduce=disable_car,
                env=env,
                reasons=[f"{what}; port {port + k}.", *why_numa, *why_p2p],
                warnings=numa_warnings,
            )
        )
    return Layout(
        instances=instances,
        tensor_parallel_size=tp,
        idle_gpus=idle,
        reasons=reasons,
        warnings=warnings + [w for i in instances for w in i.warnings],
        vllm_version=vllm_version,
    )


# ------------------------------------------------------------------------------------------ the report


def _matrix(labels: list[str], rows: list[list[str | None]]) -> list[str]:
    width = max([len(x) for x in labels] + [len(c or "?") for r in rows for c in r] + [2]) + 2
    first = max(len(x) for x in labels) + 4
    lines = [" " * first + "".join(label.ljust(width) for label in labels)]
    for label, row in zip(labels, rows, strict=True):
        lines.append(f"  {label}".ljust(first) + "".join((c or "?").ljust(width) for c in row))
    return [line.rstrip() for line in lines]


def format_probe_report(topology: Topology, layout: Layout) -> str:
    """The probe report: GPUs, links, P2P, PCIe links below max, NUMA nodes, and the plan with its reasons."""
    out: list[str] = []
    gpus = topology.gpus
    out.append(f"GPUs: {len(gpus)}" if gpus else "GPUs: none (no NVIDIA GPU found)")
    for g in gpus:
        memory = f"{g.memory_mib} MiB" if g.memory_mib is not None else "memory ?"
        numa = str(g.numa_node) if g.numa_node is not None else "unknown"
        pcie = ""
        if g.pcie_gen_max or g.pcie_width_max:
            pcie = f"  PCIe gen {g.pcie_gen_current or '?'}/{g.pcie_gen_max or '?'} "
            pcie += f"x{g.pcie_width_current or '?'}/x{g.pcie_width_max or '?'} (now/max)"
        out.append(
            f"  GPU{g.index}  {g.name or 'name ?'}  {memory}  bus {g.bus_id or '?'}  NUMA {numa}  "
            f"CPUs {g.cpu_affinity or '?'}{pcie}"
        )
        if g.numa_node is None:
            out.append(f"        NUMA node {g.numa_source}")
    if topology.links:
        labels = [f"GPU{g.index}" for g in gpus]
        out.append("")
        out.append("Links (nvidia-smi topo -m):")
        out.extend(_matrix(labels, topology.links))
        present = sorted({c for row in topology.links for c in row if c and c != "X"})
        for token in present:
            key = "NV#" if token.startswith("NV") else token
            meaning = LINK_MEANINGS.get(key, "")
            if key == "NV#":
                meaning = meaning.replace("#", token[2:])
            out.append(f"  {token} = {meaning}")
    if topology.nics:
        out.append(f"NICs: {', '.join(topology.nics)}")
    matrix = topology.p2p_matrix()
    if gpus:
        out.append("")
    if matrix is not None:
        kinds = [m.kind or "read" for m in (topology.p2p_read, topology.p2p_write) if m is not None]
        out.append(f"P2P (nvidia-smi topo -p2p, {' + '.join(kinds)}; worst of them):")
        out.extend(_matrix([f"GPU{g.index}" for g in gpus], [list(r) for r in matrix]))
    elif gpus:
        out.append("P2P: not probed")
    below = [(g.index, g.pcie_below_max()) for g in gpus if g.pcie_below_max()]
    if below:
        out.append(
            "PCIe links below their maximum (idle GPUs lower the link speed to save power: check under load):"
        )
        out.extend(f"  GPU{i}: {', '.join(b)}" for i, b in below)
    elif any(g.pcie_gen_max for g in gpus):
        out.append("PCIe links: every GPU at its maximum generation and width.")
    out.append("")
    if topology.numa_nodes:
        out.append(f"NUMA nodes: {len(topology.numa_nodes)}")
        for node in topology.numa_nodes:
            memory = f"{node.memory_mb} MB" if node.memory_mb is not None else "memory ?"
            out.append(f"  node {node.id}: CPUs {format_cpu_list(node.cpus) or 'none'}  {memory}")
    else:
        out.append("NUMA nodes: not probed")
    cpu = [
        x
        for x in (
            topology.cpu_model,
            f"{topology.sockets} socket(s)" if topology.sockets else None,
            f"{topology.cpu_count} CPUs" if topology.cpu_count else None,
            f"{topology.hypervisor} guest" if topology.hypervisor else None,
        )
        if x
    ]
    if cpu:
        out.append(f"CPU: {', '.join(cpu)}")
    out.append("")
    version = f" for vLLM {layout.vllm_version}" if layout.vllm_version else ""
    out.append(f"Plan{version}: {len(layout.instances)} instance(s) x TP{layout.tensor_parallel_size}")
    for instance in layout.instances:
        binding = instance.numa_binding.get("mode", "none")
        nodes = instance.numa_binding.get("nodes") or []
        target = "CPU" if instance.device == "cpu" else f"GPUs {instance.cuda_visible_devices}"
        car = "off" if instance.disable_custom_all_reduce else "allowed"
        if instance.device == "cpu":
            car = "n/a"
        out.append(
            f"  {instance.name}: {target}  TP{instance.tensor_parallel_size}  port {instance.port}  "
            f"NUMA binding {binding}{' ' + str(nodes) if nodes else ''}  custom all-reduce {car}"
        )
        if instance.env:
            out.append("      env: " + " ".join(f"{k}={v}" for k, v in instance.env.items()))
        out.extend(f"      - {reason}" for reason in instance.reasons)
    if layout.idle_gpus:
        out.append(f"  idle: {_gpu_list(layout.idle_gpus)}")
    if layout.reasons:
        out.append("Why:")
        out.extend(f"  - {reason}" for reason in layout.reasons)
    if layout.warnings:
        out.append("Warnings:")
        out.extend(f"  ! {warning}" for warning in layout.warnings)
    return "\n".join(out) + "\n"


def probe_report(
    host: str,
    topology: Topology,
    layout: Layout,
    *,
    cpu_only: bool,
    source: str,
    notes: list[str] | None = None,
    host_state: HostState | None = None,
) -> str:
    """The readable report of one host: `format_probe_report` under a header naming
    the host
    and where its data came from, plus the hugepages reserved per NUMA node and the probe's notes."""
    lines = [f"== {host} ({source}){': CPU-only host' if cpu_only else ''}"]
    lines.append(format_probe_report(topology, layout).rstrip("\n"))
    if host_state is not None and host_state.hugepages:
        lines.append("Hugepages reserved per NUMA node:")
        for (node, size_kb), count in sorted(host_state.hugepages.items()):
            size = f"{size_kb // 1024} MiB" if size_kb < 1048576 else f"{size_kb // 1048576} GiB"
            lines.append(f"  node {node}: {count} x {size}")
        if host_state.thp_enabled:
            lines.append(f"Transparent hugepages: {host_state.thp_enabled} (defrag {host_state.thp_defrag})")
    lines += [f"note: {n}" for n in notes or []]
    return "\n".join(lines)
