"""The seed's tier comparison ("keep the CPU tier only if P99 improves under the same load") over two
real runs of vLLM 0.26.0 on one NVIDIA H200 (tests/fixtures/gpu-h200-vllm-0.26.0-tier/README.md): Llama 3.1
8B's geometry with random weights, 2 GiB of GPU KV, (a) no CPU tier, (b) `--kv-offloading-size 16`. The GPU
cannot exist here: its outputs were recorded there. Expected figures are read off the fixture files
(bench.json keys, /metrics counters), not computed by the code under test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fleet.cli import main
from vllm_fleet.loadtest.benchresult import load_bench_result
from vllm_fleet.loadtest.report import build_report, read_report
from vllm_fleet.loadtest.run import slo_from_vars
from vllm_fleet.loadtest.workload import workload_from_vars, workload_trace
from vllm_fleet.verify.metrics import metric_total, parse_prometheus

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "gpu-h200-vllm-0.26.0-tier"
RUN = FIX / "run2"
VARIABLES = json.loads((FIX / "variables.json").read_text())
KEY = "h200/i0"  # tier_run.py's instance key


def _counter(run: str, name: str) -> float:
    """A /metrics counter over the run: after − before."""
    after = metric_total(parse_prometheus((RUN / run / "metrics-after.txt").read_text()), name)
    before = metric_total(parse_prometheus((RUN / run / "metrics-before.txt").read_text()), name)
    return (after or 0.0) - (before or 0.0)


def test_compare_prints_the_p99_difference_of_the_two_real_runs(capsys) -> None:
    a, b = RUN / "reports" / "tier-off.json", RUN / "reports" / "tier-cpu16.json"
    assert main(["loadtest", "--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    # p99_ttft_ms of run2/tier-off/bench.json 1033.978..., of run2/tier-cpu16/bench.json 1154.464...
    assert "P99 TTFT: A 1034.0 ms, B 1154.5 ms, B - A +120.5 ms (+11.7 %)" in out
    assert "failed: A 0, B 0; prefix-cache hit rate: A 12.9%, B 16.8%" in out
    assert "tier-cpu16 does not improve P99 TTFT under the same load: do not keep what it adds" in out
    assert out == (RUN / "compare.txt").read_text().removesuffix("compare rc=0\n")  # what the H200 printed
    assert main(["loadtest", "--compare", str(a), str(b), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ttft_p99_ms"]["diff"] == pytest.approx(1154.4644363499654 - 1033.9783125999897)
    assert result["b_improves_p99"] is False


def test_both_runs_sent_the_same_workload() -> None:
    workload = workload_from_vars(VARIABLES)
    trace = workload_trace(workload)
    reports = [read_report(RUN / "reports" / f"{run}.json") for run in ("tier-off", "tier-cpu16")]
    expected = json.loads(json.dumps({**workload.to_dict(), "digest": workload.digest}))
    assert reports[0]["workload"] == reports[1]["workload"] == expected
    for run in ("tier-off", "tier-cpu16"):
        assert (RUN / run / "workload.jsonl").read_text() == trace
        bench = json.loads((RUN / run / "bench.json").read_text())
        assert (bench["completed"], bench["failed"], bench["total_input_tokens"]) == (96, 0, 349213)


@pytest.mark.parametrize("run", ["tier-off", "tier-cpu16"])
def test_the_saved_reports_are_what_the_project_builds_from_the_raw_files(run: str) -> None:
    saved = read_report(RUN / "reports" / f"{run}.json")
    assert {r.latency_s for r in load_bench_result(RUN / run / "bench.json").requests} == {None}
    rebuilt = build_report(
        name=run,
        target_url="http://127.0.0.1:8000",
        bench=load_bench_result(RUN / run / "bench.json"),  # vLLM 0.26: no per-request "latencies"
        workload=workload_from_vars(VARIABLES),
        metrics_before={KEY: (RUN / run / "metrics-before.txt").read_text()},
        metrics_after={KEY: (RUN / run / "metrics-after.txt").read_text()},
        slo=slo_from_vars(VARIABLES),
        started=saved["started"],
    )
    assert json.loads(json.dumps(rebuilt)) == saved
    assert saved["ok"] and (saved["figures"]["failed"], saved["figures"]["truncated"]) == (0, 0)


def test_the_cpu_tier_served_prefixes_from_host_memory_and_the_gpu_only_run_had_none() -> None:
    # vllm:external_prefix_cache_hits_total 0 -> 21344 tokens; kv_offload load 2,797,600,768 B
    assert _counter("tier-cpu16", "vllm:external_prefix_cache_hits_total") == 21344
    assert _counter("tier-off", "vllm:external_prefix_cache_hits_total") == 0
    offload = read_report(RUN / "reports" / "tier-cpu16.json")["instances"][KEY]["kv_offload"]
    assert (offload["load_bytes"], offload["store_bytes"]) == (2797600768.0, 28357689344.0)
    assert read_report(RUN / "reports" / "tier-off.json")["instances"][KEY]["kv_offload"] is None
    # the GPU KV cache was the one planned: 2 GiB, 16,384 tokens of Llama 3.1 8B, in both runs
    for run in ("tier-off", "tier-cpu16"):
        assert "GPU KV cache size: 16,384 tokens" in (RUN / f"{run}.server.log").read_text()
