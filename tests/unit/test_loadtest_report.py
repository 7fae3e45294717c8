"""The load-test report over real runs against a real CPU vLLM (tests/fixtures/loadtest/README.md): the
seed's figures (P99 TTFT, prefix-cache hit rate, speculative acceptance), failures, the SLO verdict, the
table and the tier comparison. Expected figures come from the fixture files themselves (bench.json keys and
/metrics counters read by hand), not from the code under test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.loadtest.benchresult import load_bench_result
from vllm_fleet.loadtest.report import (
    Slo,
    build_report,
    compare_reports,
    compare_text,
    load_reports,
    loadtest_table,
    percentile,
    read_report,
    save_report,
)
from vllm_fleet.loadtest.workload import workload_from_vars, workload_trace

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "loadtest"
KEY = "load-1/i0"


def report_of(run: str, slo: Slo | None = None, name: str | None = None) -> dict:
    folder = FIX / run
    return build_report(
        name=name or run,
        target_url="http://10.203.60.10:8000",
        bench=load_bench_result(folder / "bench.json"),
        workload=workload_from_vars(json.loads((folder / "variables.json").read_text())),
        metrics_before={KEY: (folder / "metrics-before.txt").read_text()},
        metrics_after={KEY: (folder / "metrics-after.txt").read_text()},
        slo=slo or Slo(),
        started="2026-12-03T18:13:37Z",
    )


@pytest.mark.parametrize("run", ["healthy", "too_long", "ngram"])
def test_the_recorded_trace_is_what_the_variables_generate(run: str) -> None:
    variables = json.loads((FIX / run / "variables.json").read_text())
    assert workload_trace(workload_from_vars(variables)) == (FIX / run / "workload.jsonl").read_text()


def test_healthy_run_holds_the_three_figures_and_failures() -> None:
    report = report_of("healthy")
    figures = report["figures"]
    assert figures["ttft_ms"]["p99"] == pytest.approx(264.5780417000151)  # bench.json p99_ttft_ms
    assert figures["ttft_ms"]["p50"] == pytest.approx(60.60054099998524)
    assert figures["itl_ms"]["p99"] == pytest.approx(41.3769623799908)
    assert (figures["failed"], figures["truncated"], figures["errors"]) == (0, 0, {})
    # /metrics: prefix_cache_queries_total 3360 -> 6400, hits 0 -> 768 over the run
    hit = figures["prefix_cache_hit_rate"]
    assert (hit["numerator"], hit["denominator"]) == (768.0, 3040.0)
    assert hit["value"] == pytest.approx(768 / 3040)
    # no speculative decoding on that instance: absent with the reason, not 0
    spec = figures["spec_acceptance_rate"]
    assert spec["value"] is None and "speculative decoding is not on" in spec["reason"]
    assert figures["request_throughput"] == pytest.approx(32.13391485104356)
    assert report["ok"] and [c["name"] for c in report["checks"]] == ["failed", "truncated"]
    assert report["instances"][KEY]["prefix_cache_hits"] == 768.0


def test_modes_split_the_long_and_short_prompts() -> None:
    modes = report_of("healthy")["modes"]
    assert modes["short"]["requests"] == 30 and modes["long"]["requests"] == 10
    assert modes["short"]["input_tokens_max"] == 32 and modes["long"]["input_tokens_p50"] == 208
    assert modes["long"]["ttft_ms_p99"] is not None


def test_speculative_acceptance_from_the_servers_counters() -> None:
    spec = report_of("ngram")["figures"]["spec_acceptance_rate"]
    # /metrics: spec_decode_num_draft_tokens_total 0 -> 376, accepted 0 -> 227 (bench.json: 60.37 %)
    assert (spec["numerator"], spec["denominator"]) == (227.0, 376.0)
    assert spec["value"] * 100 == pytest.approx(
        json.loads((FIX / "ngram" / "bench.json").read_text())["spec_decode_acceptance_rate"]
    )


def test_a_missed_slo_fails_the_run_with_the_figure_and_the_mark() -> None:
    report = report_of("healthy", Slo(ttft_p99_max_ms=200, prefix_hit_rate_min=0.5, spec_acceptance_min=0.3))
    assert not report["ok"]
    missed = {c["name"]: c for c in report["checks"] if not c["ok"]}
    assert sorted(missed) == ["prefix_cache_hit_rate", "spec_acceptance_rate", "ttft_p99"]
    assert (missed["ttft_p99"]["seen"], missed["ttft_p99"]["mark"]) == (264.6, "<= 200 ms")
    assert (missed["prefix_cache_hit_rate"]["seen"], missed["prefix_cache_hit_rate"]["mark"]) == (
        0.2526,
        ">= 0.5",
    )
    assert missed["spec_acceptance_rate"]["seen"] is None
    verdict = report["verdict"]
    assert "ttft_p99: 264.6, the SLO is <= 200 ms" in verdict
    assert "prefix_cache_hit_rate: 0.2526, the SLO is >= 0.5 (768/3040)" in verdict
    assert "spec_acceptance_rate: None, the SLO is >= 0.3 (no vllm:spec_decode_* series" in verdict


def test_failed_requests_fail_the_run_with_their_errors() -> None:
    report = report_of("too_long")
    assert not report["ok"]
    failed = next(c for c in report["checks"] if c["name"] == "failed")
    assert (failed["ok"], failed["seen"], failed["mark"], failed["detail"]) == (
        False,
        10,
        "<= 0",
        "10× Bad Request",
    )
    assert report["modes"]["long"] == {
        "requests": 10,
        "failed": 10,
        "input_tokens_p50": 288.0,
        "input_tokens_max": 288,
        "ttft_ms_p50": None,
        "ttft_ms_p99": None,
    }
    # a generous failure budget passes the same run
    assert report_of("too_long", Slo(failed_max=10))["ok"]


def test_metrics_read_only_once_is_refused() -> None:
    with pytest.raises(FleetInputError, match="read only before or only after"):
        build_report(
            name="x",
            target_url="u",
            bench=load_bench_result(FIX / "healthy" / "bench.json"),
            workload=workload_from_vars(json.loads((FIX / "healthy" / "variables.json").read_text())),
            metrics_before={KEY: (FIX / "healthy" / "metrics-before.txt").read_text()},
            metrics_after={},
            slo=Slo(),
        )


def test_saved_reports_print_as_the_table(tmp_path: Path) -> None:
    save_report(tmp_path, report_of("healthy"))
    save_report(tmp_path, report_of("too_long"))
    (tmp_path / "stray.json").write_text('{"host": "h"}')
    with pytest.raises(FleetInputError, match="not a load-test report"):
        load_reports(tmp_path)
    (tmp_path / "stray.json").unlink()
    lines = loadtest_table(load_reports(tmp_path)).splitlines()
    assert lines[0].split()[:3] == ["load", "test", "result"]
    healthy = next(line for line in lines if line.startswith("healthy"))
    assert "OK" in healthy and "60.6/264.6" in healthy and "25.3%" in healthy
    too_long = next(line for line in lines if line.startswith("too_long"))
    assert "FAIL" in too_long and too_long.rstrip().endswith("failed")
    assert lines[-1] == "1/2 load tests met their SLOs"
    assert read_report(tmp_path / "healthy.json")["figures"]["failed"] == 0


def test_compare_prints_the_p99_difference_of_the_same_workload() -> None:
    result = compare_reports(report_of("healthy"), report_of("ngram"))
    assert result["ttft_p99_ms"]["diff"] == pytest.approx(3232.750071650057 - 264.5780417000151)
    assert not result["b_improves_p99"]
    text = compare_text(result)
    assert "P99 TTFT: A 264.6 ms, B 3232.8 ms, B - A +2968.2 ms (+1121.9 %)" in text
    assert "ngram does not improve P99 TTFT under the same load" in text
    assert compare_reports(report_of("ngram"), report_of("healthy"))["b_improves_p99"]


def test_compare_refuses_different_workloads() -> None:
    with pytest.raises(FleetInputError, match=r"ran different workloads .*: modes differ"):
        compare_reports(report_of("healthy"), report_of("too_long"))


def test_percentile_is_numpys_linear_method() -> None:
    # numpy.percentile([1, 2, 3, 4], 99) == 3.97; ([5], 99) == 5
    assert percentile([4.0, 1.0, 3.0, 2.0], 99) == pytest.approx(3.97)
    assert percentile([5.0], 99) == 5.0 and percentile([], 50) is None
