"""The typed reader of `vllm bench serve --save-result --save-detailed` JSON, over real runs against a real
CPU vLLM (tests/fixtures/loadtest/README.md says how they were recorded). Expected figures are read off the
fixture files by hand (the JSON's own keys, the trace's lengths), not computed by the code under test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.loadtest.benchresult import load_bench_result, parse_bench_result

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "loadtest"


def _trace_output_lens(run: str) -> list[int]:
    lines = (FIX / run / "workload.jsonl").read_text().splitlines()
    return [json.loads(line)["output_length"] for line in lines]


def test_healthy_run_totals_and_percentiles() -> None:
    bench = load_bench_result(FIX / "healthy" / "bench.json")
    assert (bench.completed, bench.failed, bench.num_prompts, bench.max_concurrency) == (40, 0, 40, 4)
    assert bench.request_rate is None  # "inf": paced by --max-concurrency only
    assert (bench.total_input_tokens, bench.total_output_tokens) == (3040, 640)  # 30×32 + 10×208; 40×16
    assert bench.backend == "openai" and bench.model_id == "/srv/vllm-fleet-lab/models/tiny"
    assert bench.duration_s == pytest.approx(1.2447907509999823)
    assert bench.percentile_ms("ttft", 99) == pytest.approx(264.5780417000151)
    assert bench.percentile_ms("ttft", 50) == pytest.approx(60.60054099998524)
    assert bench.percentile_ms("itl", 99) == pytest.approx(41.3769623799908)
    assert sorted(bench.percentiles) == ["e2el", "itl", "tpot", "ttft"]
    assert sorted(bench.percentiles["ttft"].values) == [50.0, 90.0, 99.0]
    assert bench.percentiles["ttft"].mean is not None
    assert bench.request_throughput == pytest.approx(32.13391485104356)
    assert bench.spec_decode_acceptance_rate is None  # no speculative decoding on the lab instance


def test_healthy_run_per_request_records_follow_the_trace() -> None:
    bench = load_bench_result(FIX / "healthy" / "bench.json")
    assert bench.detailed and len(bench.requests) == 40
    trace = [json.loads(line) for line in (FIX / "healthy" / "workload.jsonl").read_text().splitlines()]
    # --no-self-timed keeps the file's order: every record has its line's input length
    assert [r.input_len for r in bench.requests] == [t["input_length"] for t in trace]
    assert all(r.output_len == 16 and not r.failed and r.error == "" for r in bench.requests)
    assert all(r.ttft_s is not None and r.ttft_s > 0 for r in bench.requests)
    assert len(bench.requests[0].itls_s) == 15  # 16 tokens: one TTFT and 15 gaps
    assert bench.failed_requests() == [] and bench.error_counts() == {}
    assert bench.truncated_requests(_trace_output_lens("healthy")) == []


def test_failed_requests_keep_their_error_and_no_ttft() -> None:
    bench = load_bench_result(FIX / "too_long" / "bench.json")
    assert (bench.completed, bench.failed) == (30, 10)
    failed = bench.failed_requests()
    assert [r.index for r in failed] == [6, 7, 15, 17, 21, 23, 26, 31, 34, 35]
    assert all(r.input_len == 288 and r.output_len == 0 and r.ttft_s is None for r in failed)
    assert bench.error_counts() == {"Bad Request": 10}
    # a failed request is not "truncated": it never completed
    assert bench.truncated_requests(_trace_output_lens("too_long")) == []


def test_a_request_cut_short_is_truncated() -> None:
    data = json.loads((FIX / "healthy" / "bench.json").read_text())
    data["output_lens"][3] = 5  # as a stream cut by an instance stopping mid-generation would end
    bench = parse_bench_result(data)
    assert [r.index for r in bench.truncated_requests(_trace_output_lens("healthy"))] == [3]
    with pytest.raises(FleetInputError, match="39 expected output lengths for 40"):
        bench.truncated_requests(_trace_output_lens("healthy")[1:])


def test_a_result_without_save_detailed_has_no_records() -> None:
    data = json.loads((FIX / "healthy" / "bench.json").read_text())
    for key in ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors"):
        del data[key]
    bench = parse_bench_result(data)
    assert not bench.detailed and bench.failed == 0
    assert bench.percentile_ms("ttft", 99) == pytest.approx(264.5780417000151)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("failed"), "no failed; this is not the JSON of `vllm bench serve --save-result`"),
        (lambda d: d.update(duration="1.2"), "'duration' is '1.2', not a number"),
        (lambda d: d["itls"].pop(), "the per-request lists are incomplete"),
        (lambda d: d.pop("errors"), r"missing \['errors'\]"),
    ],
)
def test_malformed_results_are_refused_with_what_is_wrong(change, message: str) -> None:
    data = json.loads((FIX / "healthy" / "bench.json").read_text())
    change(data)
    with pytest.raises(FleetInputError, match=message):
        parse_bench_result(data, "bench.json")


def test_unreadable_and_appended_files(tmp_path: Path) -> None:
    with pytest.raises(FleetInputError, match="cannot be read"):
        load_bench_result(tmp_path / "missing.json")
    text = (FIX / "healthy" / "bench.json").read_text()
    appended = tmp_path / "appended.json"
    appended.write_text(text + "\n" + text)  # what --append-result makes of two runs
    with pytest.raises(FleetInputError, match="one run per line"):
        load_bench_result(appended)
