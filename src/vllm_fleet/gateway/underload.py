"""What a rollout under load did to the requests: `vllm bench serve` per-request results split by phase.

    bench_requests(result) -> [BenchRequest]             `--save-result --save-detailed` JSON, per request
    phase_figures(requests, start, end, output_len) -> {phase: PhaseFigures}  before, during, after

A request is failed when vLLM's benchmark recorded an error for it (no answer, an HTTP error, a cut stream),
and truncated when it came back with fewer output tokens than asked: with `--ignore-eos` every request must
generate exactly its output length, so fewer is a stream cut short. A request belongs to the phase its start
falls in; `start_times` are the benchmark process's `time.perf_counter()` (CLOCK_MONOTONIC), the clock the
controller's own `time.monotonic()` reads on the same kernel (lab hosts are containers of this machine).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from vllm_fleet.errors import FleetInputError

PHASES = ("before", "during", "after")


@dataclass(frozen=True)
class BenchRequest:
    start: float
    ttft_s: float | None  # None for a request that failed before its first token
    output_len: int
    error: str


@dataclass(frozen=True)
class PhaseFigures:
    requests: int
    failed: int
    truncated: int
    p99_ttft_ms: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def bench_requests(result: dict[str, Any]) -> list[BenchRequest]:
    """Every request of a detailed result (failed ones included: their error text is kept)."""
    try:
        starts = result["start_times"]
        ttfts, outputs, errors = result["ttfts"], result["output_lens"], result["errors"]
    except KeyError as exc:
        raise FleetInputError(
            f"vllm bench serve result: no {exc.args[0]!r}; run it with --save-result --save-detailed"
        ) from exc
    if not len(starts) == len(ttfts) == len(outputs) == len(errors):
        raise FleetInputError("vllm bench serve result: per-request lists of different lengths")
    return [
        BenchRequest(float(s), float(t) if t and not e else None, int(o or 0), str(e or ""))
        for s, t, o, e in zip(starts, ttfts, outputs, errors, strict=True)
    ]


def p99(values: list[float]) -> float | None:
    """The nearest-rank 99th percentile (None without values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def figures(requests: list[BenchRequest], output_len: int) -> PhaseFigures:
    failed = [r for r in requests if r.error]
    truncated = [r for r in requests if not r.error and r.output_len < output_len]
    ttfts = [r.ttft_s * 1000 for r in requests if r.ttft_s is not None]
    p = p99(ttfts)
    return PhaseFigures(len(requests), len(failed), len(truncated), round(p, 1) if p is not None else None)


def phase_of(start: float, rollout_start: float, rollout_end: float) -> str:
    if start < rollout_start:
        return "before"
    return "during" if start <= rollout_end else "after"


def phase_figures(
    requests: list[BenchRequest], rollout_start: float, rollout_end: float, output_len: int
) -> dict[str, PhaseFigures]:
    by_phase: dict[str, list[BenchRequest]] = {p: [] for p in PHASES}
    for request in requests:
        by_phase[phase_of(request.start, rollout_start, rollout_end)].append(request)
    return {phase: figures(items, output_len) for phase, items in by_phase.items()}
