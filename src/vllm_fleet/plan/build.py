"""One function builds a host's plan from its facts, its variables, the model's config and the target release.

    build_host_plan(host, variables, topology, *, vllm_version, ...) -> HostPlan

Layout (`plan.layout`), serve command and its rules (`render.serve`, `render.validate`), capacity
(`plan.capacity`, through the renderer's rules) and the fleet-wide checks meet here once; preflight calls it,
tune, deploy, verify and rollout read what it returns. Errors are collected, not raised, so a run reports
every problem of every host at once; each names the variable the user set.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_fleet import flags
from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.host import HostNeeds, HostPlan, InstanceNeeds, InstancePlan
from vllm_fleet.plan.layout import Instance, Layout, format_probe_report, plan_layout
from vllm_fleet.plan.nodes import NodePlan, Peer, node_list, peer_of, plan_node
from vllm_fleet.probe.topology import Topology
from vllm_fleet.render.schema import PREFIX, ServeSpec
from vllm_fleet.render.serve import Rendered, render_instance

DEFAULT_UNIT_PREFIX = "vllm-fleet-"
DEFAULT_BASE_PORT = 8000
# Settings whose check needs the model's config.json (KV bytes per token, heads, positions).
CAPACITY_SETTINGS = ("max_model_len", "kv_cache_memory_bytes", "max_num_seqs", "kv_offload_cpu_bytes")


# The layout's arguments and the variables users set for them, so that a refusal names what to change.
LAYOUT_VARIABLES = {
    "tensor_parallel_size": "vllm_service_tensor_parallel_size",
    "base_port": "vllm_service_port",
}


def user_variable_message(message: str) -> str:
    """A layout refusal (`tensor_parallel_size: 3 does not divide ...`) worded with the inventory variable."""
    argument, sep, rest = message.partition(": ")
    return f"{LAYOUT_VARIABLES[argument]}: {rest}" if sep and argument in LAYOUT_VARIABLES else message


def unit_name(instance: str, unit_prefix: str = DEFAULT_UNIT_PREFIX) -> str:
    """The systemd unit of an instance: the one place its name is spelled."""
    return f"{unit_prefix}{instance}.service"


def serve_variables(variables: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in variables.items() if isinstance(k, str) and k.startswith(PREFIX)}


def missing_model_config_errors(spec: ServeSpec) -> list[str]:
    """No config.json known: each capacity-dependent setting the user gave is an error (unchecked)."""
    given = [name for name in CAPACITY_SETTINGS if getattr(spec, name) is not None]
    return [
        f"{PREFIX}{name}: cannot be checked before anything is installed because the model's config.json is "
        "not known; set vllm_service_model_config (a config.json path on the controller, or its mapping), or "
        "stage the model on the host where vllm_service_model points, or set vllm_service_capacity_check: "
        "false to deploy unchecked"
        for name in given
    ]


def instance_needs(spec: ServeSpec, instance: Instance, vllm_version: str, port: int) -> InstanceNeeds:
    tier = spec.kv_offload_cpu_bytes or 0
    binding = instance.numa_binding or {}
    nodes = binding.get("membind_nodes") or binding.get("nodes") or []
    in_shm = tier if tier and flags.supports(vllm_version, "cpu_kv_tier_in_shm") else 0
    return InstanceNeeds(
        cpu_kv_bytes=tier, shm_bytes=in_shm, numa_nodes=tuple(int(n) for n in nodes), port=port
    )


def instance_plan(
    host: str,
    spec: ServeSpec,
    instance: Instance,
    rendered: Rendered,
    *,
    env: Mapping[str, str],
    unit_prefix: str,
    node: NodePlan | None = None,
) -> InstancePlan:
    expectations = dict(rendered.expectations)
    return InstancePlan(
        name=rendered.name,
        host=host,
        unit=unit_name(rendered.name, unit_prefix),
        vllm_version=rendered.vllm_version,
        catalog_release=rendered.catalog_release,
        model=spec.model,
        served_model_name=(spec.served_model_name or (spec.model,))[0],
        max_model_len=spec.max_model_len,
        address=spec.host or "",
        port=instance.port,
        device=instance.device,
        gpus=list(instance.gpus),
        tensor_parallel_size=int(expectations.get("tensor_parallel_size") or instance.tensor_parallel_size),
        numa_binding=dict(instance.numa_binding),
        argv=list(rendered.argv),
        exec_start=rendered.exec_start,
        shell=rendered.shell,
        env=dict(sorted({**rendered.env, **env}.items())),
        secret_env_names=list(rendered.secret_env_names),
        prefix_caching=spec.enable_prefix_caching is not False,
        spec_decode=bool(spec.speculative_config),
        capacity=expectations.pop("capacity", None),
        expectations=expectations,
        needs=instance_needs(spec, instance, rendered.vllm_version, instance.port),
        layout=instance.to_dict(),
        warnings=list(rendered.warnings),
        node=node.to_dict() if node else None,
    )


def fleet_errors(instances: list[InstancePlan], topology: Topology) -> list[str]:
    """What no single instance can see: names and ports unique on the host, GPUs that exist."""
    errors: list[str] = []
    seen_ports: dict[int, str] = {}
    for plan in instances:
        if plan.port in seen_ports:
            errors.append(
                f"vllm_service_port: instances {seen_ports[plan.port]} and {plan.name} would both listen on "
                f"{plan.port}; "
                "the layout gives each instance the next port after vllm_service_port: leave --port out of "
                "vllm_service_extra_args"
            )
        seen_ports.setdefault(plan.port, plan.name)
        if plan.port > 65535:
            errors.append(
                f"vllm_service_port: instance {plan.name} would listen on {plan.port} (> 65535); lower "
                "vllm_service_port"
            )
        beyond = [g for g in plan.gpus if g >= len(topology.gpus)]
        if beyond:
            errors.append(
                f"{plan.name}: GPUs {beyond} do not exist on this host ({len(topology.gpus)} GPUs); "
                "re-run the probe"
            )
    names = [p.name for p in instances]
    for name in sorted({n for n in names if names.count(n) > 1}):
        errors.append(f"{name}: two instances of one host share the name; re-run the probe")
    return errors


def host_needs(instances: list[InstancePlan]) -> HostNeeds:
    bound = sorted({n for p in instances for n in p.needs.numa_nodes if p.numa_binding.get("mode") != "none"})
    return HostNeeds(
        cpu_kv_bytes=sum(p.needs.cpu_kv_bytes for p in instances),
        shm_bytes=sum(p.needs.shm_bytes for p in instances),
        cpu_kv_bytes_by_instance={p.name: p.needs.cpu_kv_bytes for p in instances if p.needs.cpu_kv_bytes},
        bound_numa_nodes=tuple(bound),
    )


def _layout_part(layout: Layout | None) -> dict[str, Any]:
    if layout is None:
        return {}
    data = layout.to_dict()
    data.pop("instances")
    return data


def _report(host: str, source: str, topology: Topology, layout: Layout | None) -> str:
    if layout is None:
        return ""
    header = f"== {host} ({source}){': CPU-only host' if topology.cpu_only else ''}"
    return header + "\n" + format_probe_report(topology, layout).rstrip("\n")


def node_reason(node: NodePlan) -> str:
    """The report's line for a host's part of an instance over several hosts."""
    layers = (
        f" ({', '.join(str(node.stage_layers[s]) for s in node.stages)} layers)" if node.stage_layers else ""
    )
    api = "headless: its workers only, the API is on rank 0" if node.headless else "the API server"
    return (
        f"Rank {node.rank} of {node.nnodes} ({', '.join(node.nodes)}): pipeline stage(s) "
        f"{', '.join(map(str, node.stages))} of {node.pipeline_parallel_size}{layers} as "
        f"TP{node.tensor_parallel_size}; master {node.master_address}:{node.master_port}; {api}."
    )


def _node_of(
    host: str,
    variables: Mapping[str, Any],
    topology: Topology,
    peers: Mapping[str, Peer] | None,
    *,
    release: str,
    api_port: int,
    model_config: Mapping[str, Any],
    interfaces: list[Mapping[str, Any]] | None,
) -> tuple[NodePlan | None, list[str]]:
    """This host's rank in the instance `vllm_service_nodes` names (None, no error: one host's instances)."""
    if not node_list(variables):
        return None, []
    peers = dict(peers or {})
    peers.setdefault(host, peer_of(host, variables, topology, vllm_version=release))
    return plan_node(
        host, variables, topology, peers, api_port=api_port, model_config=model_config, interfaces=interfaces
    )


def build_host_plan(
    host: str,
    variables: Mapping[str, Any],
    topology: Topology,
    *,
    vllm_version: str,
    source: str = "probed live",
    model_config: Mapping[str, Any] | None = None,
    model_config_source: str = "not known",
    peers: Mapping[str, Peer] | None = None,
    interfaces: list[Mapping[str, Any]] | None = None,
) -> HostPlan:
    """The plan of `host` for `vllm_version`; `plan.errors` lists every reason it must not be applied.

    `peers`: the run's hosts as `plan.nodes.Peer`s, read where `vllm_service_nodes` makes this host one rank
    of an instance over several hosts (its GPUs, all of them, are then one instance: TP GPUs x k stages);
    `interfaces`: the host's `ip -j addr show`, which names the interface of its address between the nodes."""
    release = flags.public_version(vllm_version)
    errors: list[str] = []
    warnings: list[str] = []
    config = dict(model_config or {})
    instances: list[InstancePlan] = []
    layout: Layout | None = None
    try:
        spec = ServeSpec.from_vars(serve_variables(variables))
    except FleetInputError as exc:
        errors.append(str(exc))
        spec = None
    node: NodePlan | None = None
    multi_host = bool(node_list(variables))
    if spec is not None:
        if not config and variables.get("vllm_service_capacity_check", True) is not False:
            errors += missing_model_config_errors(spec)
        node, node_errors = _node_of(
            host,
            variables,
            topology,
            peers,
            release=release,
            api_port=spec.port or DEFAULT_BASE_PORT,
            model_config=config,
            interfaces=interfaces,
        )
        errors += node_errors
        try:
            # a rank of a multi-host instance runs all its GPUs in one process (plan.nodes checks the heads
            # against the instance's TP, not against the host's GPU count)
            layout = plan_layout(
                topology,
                (len(topology.gpus) or None) if multi_host else spec.tensor_parallel_size,
                model_config={} if multi_host else config,
                vllm_version=release,
                base_port=spec.port or DEFAULT_BASE_PORT,
            )
        except FleetInputError as exc:
            errors.append(user_variable_message(str(exc)))
    if spec is not None and layout is not None and (node is not None or not multi_host):
        warnings += layout.warnings
        unit_prefix = str(variables.get("vllm_service_unit_prefix") or DEFAULT_UNIT_PREFIX)
        topology_data = topology.to_dict()
        for instance in layout.instances:
            if node is not None:
                instance.tensor_parallel_size = node.tensor_parallel_size
                instance.reasons.insert(0, node_reason(node))
            rendered = render_instance(
                spec, instance, vllm_version, model_config=config, topology=topology_data, node=node
            )
            errors += [f"{rendered.name}: {e}" for e in rendered.errors]
            warnings += [f"{rendered.name}: {w}" for w in rendered.warnings]
            instances.append(
                instance_plan(
                    host, spec, instance, rendered, env=spec.extra_env, unit_prefix=unit_prefix, node=node
                )
            )
        errors += fleet_errors(instances, topology)
    return HostPlan(
        host=host,
        vllm_version=release,
        source=source,
        cpu_only=topology.cpu_only,
        model_config_source=model_config_source if config else f"none ({model_config_source})",
        instances=instances,
        needs=host_needs(instances),
        layout=_layout_part(layout),
        report=_report(host, source, topology, layout),
        errors=list(dict.fromkeys(errors)),
        warnings=list(dict.fromkeys(warnings)),
    )
