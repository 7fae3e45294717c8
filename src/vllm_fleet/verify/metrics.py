"""vLLM's Prometheus `/metrics` text: samples, counters, histogram quantiles, and the summary verify reads.

Metric names are those of vLLM ≥ 0.12 (`vllm/v1/metrics/loggers.py`, vllm-facts §3). Every figure is a sum
over label sets (engines, model names) unless a label filter narrows it, so a DP deployment adds up.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from vllm_fleet.errors import FleetInputError

TTFT = "vllm:time_to_first_token_seconds"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
CACHE_CONFIG = "vllm:cache_config_info"
# The OffloadingConnector's own metrics (vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py,
# 0.26): flat names since the metrics redesign, `vllm:kv_offload_total_bytes{transfer_type}` before it (kept,
# deprecated). prometheus_client adds `_total` to counters. Series appear at the first transfer; the families'
# `# TYPE` lines are there from the start, so they show that the connector's metrics are registered.
KV_OFFLOAD_PREFIX = "vllm:kv_offload_"
KV_OFFLOAD_STORE_BYTES = "vllm:kv_offload_store_bytes_total"
KV_OFFLOAD_LOAD_BYTES = "vllm:kv_offload_load_bytes_total"
KV_OFFLOAD_TOTAL_BYTES = (
    "vllm:kv_offload_total_bytes_total"  # deprecated, transfer_type GPU_to_CPU / CPU_to_GPU
)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def _bad_line(text: str) -> tuple[int, str]:
    """The first line prometheus_client cannot read, with its number (its own error names neither)."""
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if raw.strip() and not raw.lstrip().startswith("#"):
            try:
                list(text_string_to_metric_families(raw + "\n"))
            except ValueError:
                return lineno, raw.strip()
    return 0, ""


def parse_prometheus(text: str) -> list[Sample]:
    """Parse Prometheus text format 0.0.4 (what vLLM's prometheus_client serves), with prometheus_client's own
    parser (escapes, NaN/+Inf, timestamps). Comments are skipped; samples keep their exposed names."""
    try:
        return [
            Sample(sample.name, dict(sample.labels), float(sample.value))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]
    except ValueError as exc:
        lineno, line = _bad_line(text)
        raise FleetInputError(
            f"/metrics line {lineno}: {line[:120]!r} is not a Prometheus sample ({exc}); "
            "pass the body of GET /metrics"
        ) from exc


def metric_families(text: str) -> dict[str, str]:
    """`{family: type}` from the `# TYPE name type` lines (a family with no series yet still has one)."""
    families: dict[str, str] = {}
    for raw in text.splitlines():
        if raw.startswith("# TYPE "):
            parts = raw.split()
            if len(parts) >= 4:
                families[parts[2]] = parts[3]
    return families


def _matches(sample: Sample, name: str, labels: dict[str, str] | None) -> bool:
    return sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items())


def metric_total(samples: list[Sample], name: str, labels: dict[str, str] | None = None) -> float | None:
    """Sum of every sample of `name` (matching `labels`); None when the metric is absent."""
    values = [s.value for s in samples if _matches(s, name, labels)]
    return sum(values) if values else None


def histogram_buckets(
    samples: list[Sample], name: str, labels: dict[str, str] | None = None
) -> list[tuple[float, float]]:
    """Cumulative buckets `[(le, count), ...]` of histogram `name`, summed over label sets, sorted by le."""
    totals: dict[float, float] = {}
    for sample in samples:
        if _matches(sample, f"{name}_bucket", labels) and "le" in sample.labels:
            bound = float(sample.labels["le"])
            totals[bound] = totals.get(bound, 0.0) + sample.value
    return sorted(totals.items())


def subtract_buckets(
    after: list[tuple[float, float]], before: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The buckets of what happened between two scrapes (a counter reset counts from zero)."""
    earlier = dict(before)
    out = []
    for bound, count in after:
        delta = count - earlier.get(bound, 0.0)
        out.append((bound, count if delta < 0 else delta))
    return out


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' `histogram_quantile`: linear interpolation inside the bucket holding rank q·count.

    None when there are no observations. A rank in the +Inf bucket gives the largest finite bound, as
    Prometheus does: the true value is only known to be above it.
    """
    if not 0.0 <= q <= 1.0:
        raise FleetInputError(f"quantile {q!r} must lie between 0 and 1")
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank and count > lower_count:
            if math.isinf(bound):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def _delta(after: float | None, before: float | None) -> float | None:
    if after is None:
        return None
    if before is None or after < before:
        return after
    return after - before


@dataclass
class MetricsSummary:
    """What verify reads from /metrics: figures over the verify window (after − before) where both exist."""

    ttft_count: int = 0
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    prefix_cache_hit_rate: float | None = None
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    spec_acceptance_rate: float | None = None
    kv_cache_usage: float | None = None
    preemptions: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    cache_config: dict[str, str] = field(default_factory=dict)
    kv_offload: dict[str, Any] | None = None  # None: /metrics has no vllm:kv_offload_* family

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize_metrics(after_text: str, before_text: str | None = None) -> MetricsSummary:
    """Summarise a /metrics scrape; given an earlier one, counters and TTFT cover only the window between."""
    after = parse_prometheus(after_text)
    before = parse_prometheus(before_text) if before_text else []

    def window(name: str) -> float | None:
        return _delta(metric_total(after, name), metric_total(before, name) if before else None)

    ttft = subtract_buckets(histogram_buckets(after, TTFT), histogram_buckets(before, TTFT))
    queries, hits = window(PREFIX_QUERIES), window(PREFIX_HITS)
    draft_tokens, accepted = window(SPEC_DRAFT_TOKENS), window(SPEC_ACCEPTED)
    cache_config = next((dict(s.labels) for s in after if s.name == CACHE_CONFIG), {})
    families = sorted(f for f in metric_families(after_text) if f.startswith(KV_OFFLOAD_PREFIX)) or sorted(
        {s.name for s in after if s.name.startswith(KV_OFFLOAD_PREFIX)}
    )
    kv_offload = None
    if families:

        def moved(new: str, direction: str) -> float | None:
            flat = window(new)
            if flat is not None:
                return flat
            label = {"transfer_type": direction}
            return _delta(
                metric_total(after, KV_OFFLOAD_TOTAL_BYTES, label),
                metric_total(before, KV_OFFLOAD_TOTAL_BYTES, label) if before else None,
            )

        kv_offload = {
            "families": families,
            "store_bytes": moved(KV_OFFLOAD_STORE_BYTES, "GPU_to_CPU"),
            "load_bytes": moved(KV_OFFLOAD_LOAD_BYTES, "CPU_to_GPU"),
        }
    return MetricsSummary(
        ttft_count=int(ttft[-1][1]) if ttft else 0,
        ttft_p50_s=histogram_quantile(0.5, ttft),
        ttft_p99_s=histogram_quantile(0.99, ttft),
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        prefix_cache_hit_rate=(hits / queries) if queries and hits is not None else None,
        spec_drafts=window(SPEC_DRAFTS),
        spec_draft_tokens=draft_tokens,
        spec_accepted_tokens=accepted,
        spec_acceptance_rate=(accepted / draft_tokens) if draft_tokens and accepted is not None else None,
        kv_cache_usage=metric_total(after, KV_USAGE),
        preemptions=window(PREEMPTIONS),
        prompt_tokens=window(PROMPT_TOKENS),
        generation_tokens=window(GENERATION_TOKENS),
        cache_config=cache_config,
        kv_offload=kv_offload,
    )
