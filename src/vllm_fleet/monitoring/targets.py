"""Prometheus scrape targets and prometheus.yml from the host plans.

Every instance of every plan is one target of job `vllm`, labelled with what the plan says it is (fleet, host,
instance, model, tp, numa_node, vllm_release, unit); node_exporter (job `node`) on every host and the NVML GPU
exporter (job `gpu`) on every host with GPUs. The instance label is the plan's instance name (i0, i1, ...),
not Prometheus's host:port default, so that rules and dashboards name instances as the plan does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.host import WILDCARD_ADDRESSES, HostPlan, InstancePlan

# Debian's prometheus-node-exporter listens on 9100; 9400 is the port DCGM exporter made the GPU exporter's
# (nvitop-exporter's own default, 8000, is vLLM's default API port).
NODE_EXPORTER_PORT = 9100
GPU_EXPORTER_PORT = 9400
JOB_VLLM, JOB_NODE, JOB_GPU = "vllm", "node", "gpu"


@dataclass(frozen=True)
class ScrapeTarget:
    job: str
    address: str  # host:port as Prometheus dials it
    labels: dict[str, str]


def join_host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def scrape_address(instance: InstancePlan, host_address: str) -> str:
    """Where a monitoring host reaches the instance: its --host, or the host's address on a wildcard.

    A loopback --host is reachable from the host itself only; Prometheus elsewhere cannot scrape it."""
    if (instance.address or "") in WILDCARD_ADDRESSES:
        return join_host_port(host_address, instance.port)
    return join_host_port(instance.address, instance.port)


def numa_node_label(numa_binding: Mapping[str, Any]) -> str:
    """The NUMA node(s) the instance is bound to ("0", "0,1"), "none" unbound (empty is no label)."""
    nodes = numa_binding.get("nodes") or []
    return ",".join(str(n) for n in nodes) if nodes else "none"


def instance_labels(fleet: str, instance: InstancePlan) -> dict[str, str]:
    return {
        "fleet": fleet,
        "host": instance.host,
        "instance": instance.name,
        "model": instance.served_model_name,
        "tp": str(instance.tensor_parallel_size),
        "numa_node": numa_node_label(instance.numa_binding),
        "vllm_release": instance.vllm_version,
        "unit": instance.unit,
    }


def vllm_targets(
    fleet: str, plans: Mapping[str, HostPlan], addresses: Mapping[str, str]
) -> list[ScrapeTarget]:
    return [
        ScrapeTarget(
            JOB_VLLM, scrape_address(instance, addresses.get(host, host)), instance_labels(fleet, instance)
        )
        for host, plan in plans.items()
        for instance in plan.instances
        if not instance.headless  # a headless rank has no API, so no /metrics
    ]


def exporter_targets(
    fleet: str,
    plans: Mapping[str, HostPlan],
    addresses: Mapping[str, str],
    *,
    node_exporter_port: int = NODE_EXPORTER_PORT,
    gpu_exporter_port: int = GPU_EXPORTER_PORT,
) -> list[ScrapeTarget]:
    """node_exporter on every host, the GPU exporter on hosts with GPUs; port 0 leaves that exporter out."""
    targets = []
    for host, plan in plans.items():
        address = addresses.get(host, host)
        labels = {"fleet": fleet, "host": host}
        if node_exporter_port:
            targets.append(ScrapeTarget(JOB_NODE, join_host_port(address, node_exporter_port), labels))
        if gpu_exporter_port and not plan.cpu_only:
            targets.append(ScrapeTarget(JOB_GPU, join_host_port(address, gpu_exporter_port), labels))
    return targets


def parse_duration_seconds(value: str, what: str) -> int:
    """Seconds of a Prometheus duration of one unit (15s, 1m); anything else names the option and the fix."""
    units = {"s": 1, "m": 60, "h": 3600}
    if len(value) >= 2 and value[-1] in units and value[:-1].isdigit() and int(value[:-1]) > 0:
        return int(value[:-1]) * units[value[-1]]
    raise FleetInputError(f"{what}: {value!r} is no duration; give a whole number of s, m or h (15s, 1m)")


def prometheus_config(
    targets: list[ScrapeTarget], *, scrape_interval: str = "15s", rule_files: tuple[str, ...] = ()
) -> dict[str, Any]:
    """prometheus.yml: one scrape job per kind of target, one static_config per target (its own labels)."""
    parse_duration_seconds(scrape_interval, "--scrape-interval")
    jobs: dict[str, list[dict[str, Any]]] = {}
    for target in targets:
        jobs.setdefault(target.job, []).append({"targets": [target.address], "labels": dict(target.labels)})
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": list(rule_files),
        "scrape_configs": [
            {"job_name": job, "metrics_path": "/metrics", "static_configs": configs}
            for job, configs in jobs.items()
        ],
    }
