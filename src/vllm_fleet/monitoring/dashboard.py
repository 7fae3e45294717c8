"""The Grafana dashboard of the fleet (DIR/grafana/vllm-fleet.json).

Variables fleet, host and instance (label_values of the vllm job's `up`); one panel per concern, each a
PromQL expression over vLLM's own series or the recording rules of vllm_fleet.monitoring.rules. A panel for a
feature no plan enables (speculative decoding, a CPU KV tier, GPUs) is left out rather than shown empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_fleet.monitoring.rules import BY
from vllm_fleet.monitoring.targets import JOB_GPU, JOB_NODE, JOB_VLLM
from vllm_fleet.plan.host import HostPlan

UID = "vllm-fleet"
SEL = 'fleet=~"$fleet", host=~"$host", instance=~"$instance"'
HOST_SEL = 'fleet=~"$fleet", host=~"$host"'
RATE = "$__rate_interval"


def _quantiles(metric: str) -> list[tuple[str, str]]:
    return [
        (
            f"{q} {{{{host}}}}/{{{{instance}}}}",
            f"histogram_quantile({q[1:]}, sum by ({BY}, le) (rate({metric}_bucket{{{SEL}}}[{RATE}])))",
        )
        for q in ("p0.5", "p0.9", "p0.99")
    ]


def panel_specs(plans: Mapping[str, HostPlan]) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(title, unit, [(legend, expr)]) for every panel the plans call for."""
    instances = [i for plan in plans.values() for i in plan.instances]
    legend = "{{host}}/{{instance}}"
    specs: list[tuple[str, str, list[tuple[str, str]]]] = [
        ("Instances up", "none", [(legend, f'up{{job="{JOB_VLLM}", {SEL}}}')]),
        ("KV cache usage", "percentunit", [(legend, f"sum by ({BY}) (vllm:kv_cache_usage_perc{{{SEL}}})")]),
    ]
    if any(i.capacity or i.expectations.get("kv_cache_tokens") for i in instances):
        specs.append(
            (
                "KV cache tokens in use against the planned capacity",
                "short",
                [
                    (f"in use {legend}", f"vllm_fleet:kv_cache_used_tokens{{{SEL}}}"),
                    (f"planned {legend}", f"vllm_fleet:planned_gpu_kv_tokens{{{SEL}}}"),
                ],
            )
        )
    specs += [
        ("Time to first token", "s", _quantiles("vllm:time_to_first_token_seconds")),
        ("Inter-token latency", "s", _quantiles("vllm:inter_token_latency_seconds")),
        (
            "Throughput (tokens/s)",
            "short",
            [
                (
                    f"generated {legend}",
                    f"sum by ({BY}) (rate(vllm:generation_tokens_total{{{SEL}}}[{RATE}]))",
                ),
                (f"prompt {legend}", f"sum by ({BY}) (rate(vllm:prompt_tokens_total{{{SEL}}}[{RATE}]))"),
            ],
        ),
        (
            "Requests running and waiting",
            "short",
            [
                (f"running {legend}", f"sum by ({BY}) (vllm:num_requests_running{{{SEL}}})"),
                (f"waiting {legend}", f"sum by ({BY}) (vllm:num_requests_waiting{{{SEL}}})"),
                (f"queue mark {legend}", f"vllm_fleet:planned_waiting_max{{{SEL}}}"),
            ],
        ),
        (
            "Preemptions (per second)",
            "short",
            [(legend, f"sum by ({BY}) (rate(vllm:num_preemptions_total{{{SEL}}}[{RATE}]))")],
        ),
    ]
    if any(i.prefix_caching for i in instances):
        hits = f"sum by ({BY}) (rate(vllm:prefix_cache_hits_total{{{SEL}}}[{RATE}]))"
        queries = f"sum by ({BY}) (rate(vllm:prefix_cache_queries_total{{{SEL}}}[{RATE}]))"
        specs.append(("Prefix-cache hit rate", "percentunit", [(legend, f"{hits} / {queries}")]))
    if any(i.spec_decode for i in instances):
        accepted = f"sum by ({BY}) (rate(vllm:spec_decode_num_accepted_tokens_total{{{SEL}}}[{RATE}]))"
        drafted = f"sum by ({BY}) (rate(vllm:spec_decode_num_draft_tokens_total{{{SEL}}}[{RATE}]))"
        specs.append(("Speculative acceptance rate", "percentunit", [(legend, f"{accepted} / {drafted}")]))
    if any(i.needs.cpu_kv_bytes for i in instances):
        specs.append(
            (
                "CPU KV tier traffic (bytes/s)",
                "Bps",
                [
                    (
                        f"GPU to CPU {legend}",
                        f"sum by ({BY}) (rate(vllm:kv_offload_store_bytes_total{{{SEL}}}[{RATE}]))",
                    ),
                    (
                        f"CPU to GPU {legend}",
                        f"sum by ({BY}) (rate(vllm:kv_offload_load_bytes_total{{{SEL}}}[{RATE}]))",
                    ),
                ],
            )
        )
    specs.append(
        (
            "Host CPU busy",
            "percentunit",
            [
                (
                    "{{host}}",
                    f'1 - avg by (fleet, host) (rate(node_cpu_seconds_total{{job="{JOB_NODE}", mode="idle", '
                    f"{HOST_SEL}}}[{RATE}]))",
                )
            ],
        )
    )
    if any(not plan.cpu_only for plan in plans.values()):
        specs.append(
            (
                "GPU utilisation",
                "percent",
                [("{{host}} GPU {{index}}", f'gpu_utilization_Percentage{{job="{JOB_GPU}", {HOST_SEL}}}')],
            )
        )
    return specs


def _variable(name: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": f"var-{name}"},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def _panel(number: int, title: str, unit: str, targets: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "id": number,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (number % 2), "y": 8 * (number // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + n), "expr": expr, "legendFormat": legend}
            for n, (legend, expr) in enumerate(targets)
        ],
    }


def dashboard(plans: Mapping[str, HostPlan]) -> dict[str, Any]:
    panels = [_panel(n, *spec) for n, spec in enumerate(panel_specs(plans))]
    return {
        "uid": UID,
        "title": "vLLM fleet",
        "tags": ["vllm", "vllm-fleet"],
        "timezone": "utc",
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                _variable("fleet", f'label_values(up{{job="{JOB_VLLM}"}}, fleet)'),
                _variable("host", f'label_values(up{{job="{JOB_VLLM}", fleet=~"$fleet"}}, host)'),
                _variable("instance", f'label_values(up{{job="{JOB_VLLM}", {HOST_SEL}}}, instance)'),
            ]
        },
        "panels": panels,
    }


def expressions(board: Mapping[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard's panels."""
    return [target["expr"] for panel in board["panels"] for target in panel["targets"]]
