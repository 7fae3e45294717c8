"""Alert and recording rules from the plans and verify's limits (DIR/rules/vllm-fleet.rules.yml).

Recording rules are fleet-wide (by fleet, host, instance); alert rules are written per planned instance, each
with the threshold its own plan gives: the KV tokens and concurrency it was sized for, the unit systemd runs,
whether it enables prefix caching, speculative decoding or a CPU KV tier. verify's pass marks
(`vllm_verify_spec_acceptance_min`, `vllm_verify_ttft_p99_max`, `vllm_verify_max_restarts`,
`vllm_fleet.verify.report.Thresholds`) are the same marks here, so an instance that passed verify and then
drifts past them alerts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_fleet.monitoring.targets import JOB_GPU, JOB_NODE, JOB_VLLM
from vllm_fleet.plan.host import HostPlan, InstancePlan
from vllm_fleet.verify.report import Thresholds

BY = "fleet, host, instance"
RUNBOOK = "docs/runbook.md"  # one `## <alert>` heading per alert


@dataclass(frozen=True)
class Limits:
    """The marks the alerts use; verify's where it has one, else monitoring's own (fleet_monitoring_*)."""

    ttft_p99_max_s: float = 2.0  # used when verify judges no TTFT (vllm_verify_ttft_p99_max: 0)
    spec_acceptance_min: float = 0.3
    max_restarts: int = 0
    kv_usage_max: float = 0.9  # fraction of the planned GPU KV blocks in use
    prefix_hit_rate_min: float = 0.05
    window: str = "5m"  # the rate() window of the recording rules
    for_: str = "10m"  # how long a condition must hold before it fires
    # how long an instance's /metrics must fail to answer before VllmInstanceDown fires: long enough that
    # one missed scrape (a slow answer under load) does not page, short enough to page before users notice
    down_for: str = "2m"


def limits_from(thresholds: Thresholds, **monitoring: Any) -> Limits:
    """verify's Thresholds where set; None there (not judged by verify) falls back to monitoring's mark."""
    base = Limits(**monitoring)
    values = {
        "ttft_p99_max_s": thresholds.ttft_p99_max_s or base.ttft_p99_max_s,
        "spec_acceptance_min": (
            base.spec_acceptance_min
            if thresholds.spec_acceptance_min is None
            else thresholds.spec_acceptance_min
        ),
        "max_restarts": thresholds.max_restarts,
    }
    return Limits(**{**monitoring, **values})


def planned_kv_tokens(instance: InstancePlan) -> int | None:
    """The GPU KV tokens the plan sized the instance for (capacity), else what verify expects in the log."""
    capacity = instance.capacity or {}
    tokens = capacity.get("gpu_kv_tokens") or instance.expectations.get("kv_cache_tokens")
    return int(tokens) if tokens else None


def queue_limit(instance: InstancePlan) -> int:
    """Waiting requests beyond the sequences the plan says the KV cache holds at once (at least 1)."""
    capacity = instance.capacity or {}
    concurrency = capacity.get("concurrency_at_avg_input_len") or capacity.get("max_concurrency")
    concurrency = concurrency or instance.expectations.get("max_concurrency") or 1
    return max(1, math.floor(float(concurrency)))


def selector(instance: InstancePlan, fleet: str) -> str:
    return f'fleet="{fleet}", host="{instance.host}", instance="{instance.name}"'


def recording_rules(window: str) -> list[dict[str, Any]]:
    """Quantiles, rates and ratios every alert and panel reads, by fleet, host and instance."""

    def quantile(q: str, metric: str) -> str:
        return f"histogram_quantile({q}, sum by ({BY}, le) (rate({metric}_bucket[{window}])))"

    def ratio(numerator: str, denominator: str) -> str:
        return f"sum by ({BY}) (rate({numerator}[{window}])) / sum by ({BY}) (rate({denominator}[{window}]))"

    w = window
    return [
        {
            "record": f"vllm_fleet:time_to_first_token_seconds:p50_{w}",
            "expr": quantile("0.5", "vllm:time_to_first_token_seconds"),
        },
        {
            "record": f"vllm_fleet:time_to_first_token_seconds:p99_{w}",
            "expr": quantile("0.99", "vllm:time_to_first_token_seconds"),
        },
        {
            "record": f"vllm_fleet:inter_token_latency_seconds:p50_{w}",
            "expr": quantile("0.5", "vllm:inter_token_latency_seconds"),
        },
        {
            "record": f"vllm_fleet:inter_token_latency_seconds:p99_{w}",
            "expr": quantile("0.99", "vllm:inter_token_latency_seconds"),
        },
        {
            "record": f"vllm_fleet:generation_tokens:rate_{w}",
            "expr": f"sum by ({BY}) (rate(vllm:generation_tokens_total[{w}]))",
        },
        {
            "record": f"vllm_fleet:prompt_tokens:rate_{w}",
            "expr": f"sum by ({BY}) (rate(vllm:prompt_tokens_total[{w}]))",
        },
        {
            "record": f"vllm_fleet:num_preemptions:rate_{w}",
            "expr": f"sum by ({BY}) (rate(vllm:num_preemptions_total[{w}]))",
        },
        {
            "record": f"vllm_fleet:prefix_cache_hit_rate:ratio_{w}",
            "expr": ratio("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
        },
        # accepted / proposed draft tokens: vLLM's own acceptance rate (vllm/v1/spec_decode/metrics.py)
        {
            "record": f"vllm_fleet:spec_decode_acceptance_rate:ratio_{w}",
            "expr": ratio(
                "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"
            ),
        },
        # the CPU KV tier's traffic (OffloadingConnector: kv_transfer/kv_connector/v1/offloading/metrics.py)
        {
            "record": f"vllm_fleet:kv_offload_store_bytes:rate_{w}",
            "expr": f"sum by ({BY}) (rate(vllm:kv_offload_store_bytes_total[{w}]))",
        },
        {
            "record": f"vllm_fleet:kv_offload_load_bytes:rate_{w}",
            "expr": f"sum by ({BY}) (rate(vllm:kv_offload_load_bytes_total[{w}]))",
        },
    ]


def planned_rules(plans: Mapping[str, HostPlan], fleet: str) -> list[dict[str, Any]]:
    """The plan's figures as series (the dashboard's capacity and queue lines) and the KV tokens in use
    against the planned capacity."""
    rules: list[dict[str, Any]] = []
    for plan in plans.values():
        for instance in plan.instances:
            labels = {"fleet": fleet, "host": instance.host, "instance": instance.name}
            # every plan has it (a CPU plan has no KV capacity): VllmRequestsQueueing's mark, drawn on the
            # dashboard beside the waiting queue
            rules.append(
                {
                    "record": "vllm_fleet:planned_waiting_max",
                    "expr": f"vector({queue_limit(instance)})",
                    "labels": labels,
                }
            )
            tokens = planned_kv_tokens(instance)
            if tokens:
                rules.append(
                    {
                        "record": "vllm_fleet:planned_gpu_kv_tokens",
                        "expr": f"vector({tokens})",
                        "labels": labels,
                    }
                )
            if instance.needs.cpu_kv_bytes:
                rules.append(
                    {
                        "record": "vllm_fleet:planned_cpu_kv_bytes",
                        "expr": f"vector({instance.needs.cpu_kv_bytes})",
                        "labels": labels,
                    }
                )
    rules.append(
        {
            "record": "vllm_fleet:kv_cache_used_tokens",
            "expr": f"sum by ({BY}) (vllm:kv_cache_usage_perc) * on ({BY}) vllm_fleet:planned_gpu_kv_tokens",
        }
    )
    return rules


def _alert(
    name: str, expr: str, for_: str, severity: str, summary: str, description: str, labels: Mapping[str, str]
) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity, **labels},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook": f"{RUNBOOK}#{name.lower()}",
        },
    }


def instance_alerts(instance: InstancePlan, fleet: str, limits: Limits) -> list[dict[str, Any]]:
    """Every alert of one instance, its thresholds from its plan and the limits."""
    sel, w, where = selector(instance, fleet), limits.window, f"{instance.host}/{instance.name}"
    labels = {"fleet": fleet, "host": instance.host, "instance": instance.name}
    alerts = [
        _alert(
            "VllmInstanceDown",
            f'up{{job="{JOB_VLLM}", {sel}}} == 0',
            limits.down_for,
            "critical",
            f"{where}: /metrics not answering",
            f"Prometheus cannot scrape {instance.unit} ({instance.base_url} on the host).",
            labels,
        ),
        _alert(
            "VllmInstanceRestarted",
            f'increase(node_systemd_service_restart_total{{job="{JOB_NODE}", fleet="{fleet}", '
            f'host="{instance.host}", name="{instance.unit}"}}[1h]) > {limits.max_restarts}',
            "0m",
            "warning",
            f"{where}: {instance.unit} restarted",
            f"systemd restarted {instance.unit} more than {limits.max_restarts} time(s) in the last hour "
            "(vllm_verify_max_restarts).",
            labels,
        ),
        _alert(
            "VllmTTFTP99High",
            f"vllm_fleet:time_to_first_token_seconds:p99_{w}{{{sel}}} > {limits.ttft_p99_max_s:g}",
            limits.for_,
            "warning",
            f"{where}: TTFT P99 above {limits.ttft_p99_max_s:g} s",
            f"Time to first token P99 over {w} is {{{{ $value | humanizeDuration }}}}, the mark is "
            f"{limits.ttft_p99_max_s:g} s.",
            labels,
        ),
        _alert(
            "VllmRequestsQueueing",
            f"sum by ({BY}) (vllm:num_requests_waiting{{{sel}}}) > {queue_limit(instance)}",
            limits.for_,
            "warning",
            f"{where}: more than {queue_limit(instance)} requests waiting",
            f"The plan sizes the KV cache for about {queue_limit(instance)} concurrent sequences; "
            "{{ $value }} requests wait for a slot.",
            labels,
        ),
        _alert(
            "VllmPreempting",
            f"vllm_fleet:num_preemptions:rate_{w}{{{sel}}} > 0",
            limits.for_,
            "warning",
            f"{where}: requests are being preempted",
            "vLLM evicts running requests because the KV cache ran out: the load exceeds what the plan "
            "sized it for.",
            labels,
        ),
    ]
    tokens = planned_kv_tokens(instance)
    planned = f"the planned {tokens:,} tokens" if tokens else "its KV blocks"
    alerts.append(
        _alert(
            "VllmKVCacheNearFull",
            f"sum by ({BY}) (vllm:kv_cache_usage_perc{{{sel}}}) > {limits.kv_usage_max:g}",
            limits.for_,
            "warning",
            f"{where}: KV cache above {limits.kv_usage_max:.0%} of {planned}",
            f"{{{{ $value | humanizePercentage }}}} of {planned} are in use.",
            labels,
        )
    )
    if instance.prefix_caching:
        alerts.append(
            _alert(
                "VllmPrefixHitRateLow",
                f"vllm_fleet:prefix_cache_hit_rate:ratio_{w}{{{sel}}} < {limits.prefix_hit_rate_min:g}",
                limits.for_,
                "info",
                f"{where}: prefix-cache hit rate collapsed",
                f"{{{{ $value | humanizePercentage }}}} of prompt tokens hit the prefix cache (mark "
                f"{limits.prefix_hit_rate_min:.0%}).",
                labels,
            )
        )
    if instance.spec_decode:
        alerts.append(
            _alert(
                "VllmSpecAcceptanceLow",
                f"vllm_fleet:spec_decode_acceptance_rate:ratio_{w}{{{sel}}} < {limits.spec_acceptance_min:g}",
                limits.for_,
                "warning",
                f"{where}: speculative acceptance below {limits.spec_acceptance_min:.0%}",
                "{{ $value | humanizePercentage }} of draft tokens are accepted "
                "(vllm_verify_spec_acceptance_min).",
                labels,
            )
        )
    if instance.needs.cpu_kv_bytes:
        alerts.append(
            _alert(
                "VllmCPUOffloadAllocationFailing",
                f"increase(vllm:kv_offload_allocation_failure_total{{{sel}}}[{w}]) > 0",
                "0m",
                "warning",
                f"{where}: the CPU KV tier is full",
                f"Stores to the {instance.needs.cpu_kv_bytes / 2**30:.0f} GiB CPU KV tier fail to allocate.",
                labels,
            )
        )
    return alerts


def exporter_alerts(fleet: str) -> list[dict[str, Any]]:
    return [
        _alert(
            name,
            f'up{{job="{job}", fleet="{fleet}"}} == 0',
            "5m",
            "warning",
            f"{{{{ $labels.host }}}}: {what} not answering",
            f"Prometheus cannot scrape {what} on {{{{ $labels.host }}}}.",
            {},
        )
        for name, job, what in (
            ("NodeExporterDown", JOB_NODE, "node_exporter"),
            ("GpuExporterDown", JOB_GPU, "the GPU exporter"),
        )
    ]


def rule_file(
    plans: Mapping[str, HostPlan],
    fleet: str,
    limits: Limits,
    host_limits: Mapping[str, Limits] | None = None,
) -> dict[str, Any]:
    """The whole rules file: records first (alerts read them), then every instance's alerts.

    `host_limits` gives a host its own marks (its vllm_verify_* variables); others use `limits`."""
    host_limits = host_limits or {}
    alerts = [
        alert
        for host, plan in plans.items()
        for instance in plan.instances
        for alert in instance_alerts(instance, fleet, host_limits.get(host, limits))
    ]
    return {
        "groups": [
            {"name": "vllm-fleet.records", "rules": recording_rules(limits.window)},
            {"name": "vllm-fleet.planned", "rules": planned_rules(plans, fleet)},
            {"name": "vllm-fleet.alerts", "rules": alerts + exporter_alerts(fleet)},
        ]
    }
