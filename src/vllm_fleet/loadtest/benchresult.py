"""The JSON that `vllm bench serve --save-result --save-detailed` writes, read into a typed object.

Layout from vLLM's own writer (`vllm/benchmarks/serve.py`, 0.32.0: `benchmark()` builds `result`, `main_async`
adds the setup keys and drops the per-request lists unless `--save-detailed`):

- run setup: `date`, `backend`, `model_id`, `tokenizer_id`, `num_prompts`, `request_rate` (a number or "inf"),
  `burstiness`, `max_concurrency`;
- totals: `duration` (s), `completed`, `failed`, `total_input_tokens`, `total_output_tokens`,
  `request_throughput` (req/s), `output_throughput` and `total_token_throughput` (tok/s);
- percentiles, in ms, for each metric of `--percentile-metrics` (ttft, tpot, itl, e2el) and each percentile
  of `--metric-percentiles`: `p99_ttft_ms`, `mean_ttft_ms`, `median_ttft_ms`, `std_ttft_ms`, ... (a percentile
  that is not a whole number keeps its point: `p99.9_ttft_ms`);
- per request, in the order the requests were sampled (with `--disable-shuffle`: the dataset's order):
  `input_lens`, `output_lens`, `ttfts` (s), `itls` (a list of s each), `latencies` (s), `start_times`,
  `errors` (the error text, "" when none);
- with speculative decoding, `spec_decode_acceptance_rate` (percent) and friends, from the /metrics of the
  URL it targeted only (one instance behind a gateway): the load test reads every instance's /metrics itself.

A failed request is recorded with ttft 0, no ITLs, output length 0 and its error; vLLM's writer does not keep
the request's `success` flag, and an HTTP error with an empty reason leaves `errors[i]` empty, so a request
counts as failed when it has an error or produced no token (`RequestRecord.failed`). The totals' `failed`
is vLLM's own count (requests that did not succeed).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_fleet.errors import FleetInputError

PERCENTILE_KEY = re.compile(r"^p(?P<p>\d+(?:\.\d+)?)_(?P<metric>[a-z0-9_]+)_ms$")
STAT_KEYS = ("mean", "median", "std")
PER_REQUEST_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "errors")
# vLLM 0.26's --save-detailed writes no per-request "latencies" (0.32's does): read when present.
OPTIONAL_PER_REQUEST_KEYS = ("latencies",)
REQUIRED_KEYS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens")


@dataclass(frozen=True)
class RequestRecord:
    """One request as `vllm bench serve --save-detailed` recorded it (times in seconds)."""

    index: int
    input_len: int
    output_len: int
    ttft_s: float | None  # None when the request failed (vLLM records 0)
    itls_s: tuple[float, ...]
    latency_s: float | None  # None when the bench wrote no per-request latencies (vLLM 0.26)
    start_time_s: float | None
    error: str

    @property
    def failed(self) -> bool:
        return bool(self.error) or self.output_len == 0

    def truncated(self, expected_output_len: int) -> bool:
        """Completed with fewer tokens than asked: with `--ignore-eos` every request runs to its output
        length, so a shorter one was cut (an instance stopped mid-stream: vLLM aborts it and closes the
        stream)."""
        return not self.failed and self.output_len < expected_output_len


@dataclass(frozen=True)
class Percentiles:
    """One metric's statistics in ms: `{percentile: value}` plus mean, median and std when vLLM wrote them."""

    values: dict[float, float]
    mean: float | None = None
    median: float | None = None
    std: float | None = None

    def at(self, percentile: float) -> float | None:
        return self.values.get(float(percentile))


@dataclass(frozen=True)
class BenchResult:
    """A `vllm bench serve` run: its setup, totals, per-metric percentiles (ms) and per-request records."""

    date: str
    backend: str
    model_id: str
    tokenizer_id: str
    num_prompts: int | None
    request_rate: float | None  # None: "inf" (every request at once, bounded by max_concurrency)
    burstiness: float | None
    max_concurrency: int | None
    duration_s: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    percentiles: dict[str, Percentiles]
    requests: tuple[RequestRecord, ...] = ()
    spec_decode_acceptance_rate: float | None = None  # percent, as vLLM writes it; one URL's /metrics only
    extra: dict[str, Any] = field(default_factory=dict)  # `--metadata KEY=VALUE` and keys this reader skips

    def percentile_ms(self, metric: str, percentile: float) -> float | None:
        stats = self.percentiles.get(metric)
        return stats.at(percentile) if stats else None

    @property
    def detailed(self) -> bool:
        return bool(self.requests)

    def failed_requests(self) -> list[RequestRecord]:
        return [r for r in self.requests if r.failed]

    def error_counts(self) -> dict[str, int]:
        """How many requests failed with each error text (the text's first line; "" as "no error text")."""
        counts: dict[str, int] = {}
        for record in self.failed_requests():
            text = record.error.strip().splitlines()[0][:200] if record.error.strip() else "no error text"
            counts[text] = counts.get(text, 0) + 1
        return counts

    def truncated_requests(self, expected_output_lens: Sequence[int]) -> list[RequestRecord]:
        """Completed requests cut short, given the output lengths asked for, in the same order."""
        if len(expected_output_lens) != len(self.requests):
            raise FleetInputError(
                f"{len(expected_output_lens)} expected output lengths for {len(self.requests)} recorded "
                "requests; pass the workload the run sent (with --disable-shuffle its order is the file's)"
            )
        return [
            r for r, want in zip(self.requests, expected_output_lens, strict=True) if r.truncated(int(want))
        ]


KNOWN_KEYS = {
    "date",
    "endpoint_type",
    "backend",
    "label",
    "model_id",
    "tokenizer_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "start_times",
    "queue_times",
    "generated_texts",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "rtfx",
    "spec_decode_acceptance_rate",
    *REQUIRED_KEYS,
    *PER_REQUEST_KEYS,
}


def _number(data: Mapping[str, Any], key: str, source: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FleetInputError(
            f"{source}: {key!r} is {value!r}, not a number; "
            "pass the file `vllm bench serve --save-result` wrote"
        )
    return float(value)


def _optional_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isinf(float(value)) else float(value)


def read_percentiles(data: Mapping[str, Any]) -> dict[str, Percentiles]:
    """`{metric: Percentiles}` from the `p<P>_<metric>_ms` / `mean_<metric>_ms` keys of a result."""
    values: dict[str, dict[float, float]] = {}
    for key, value in data.items():
        match = PERCENTILE_KEY.match(key)
        if match and _optional_number(value) is not None:
            values.setdefault(match["metric"], {})[float(match["p"])] = float(value)
    return {
        metric: Percentiles(
            values=dict(sorted(points.items())),
            **{stat: _optional_number(data.get(f"{stat}_{metric}_ms")) for stat in STAT_KEYS},
        )
        for metric, points in sorted(values.items())
    }


def read_requests(data: Mapping[str, Any], source: str) -> tuple[RequestRecord, ...]:
    """The per-request records of a `--save-detailed` result; () when the run saved none."""
    present = [k for k in PER_REQUEST_KEYS if k in data]
    if not present:
        return ()
    missing = [k for k in PER_REQUEST_KEYS if k not in data]
    lists = {k: data[k] for k in [*present, *(k for k in OPTIONAL_PER_REQUEST_KEYS if k in data)]}
    lengths = {k: len(v) for k, v in lists.items() if isinstance(v, list)}
    if missing or len(lengths) != len(lists) or len(set(lengths.values())) != 1:
        raise FleetInputError(
            f"{source}: the per-request lists are incomplete (missing {missing}, lengths {lengths}); "
            "pass a result of `vllm bench serve --save-result --save-detailed`, whole"
        )
    starts = data.get("start_times") if isinstance(data.get("start_times"), list) else None
    latencies = lists.get("latencies")
    records = []
    for i, (inp, out, ttft, itls, error) in enumerate(
        zip(*(lists[k] for k in PER_REQUEST_KEYS), strict=True)
    ):
        records.append(
            RequestRecord(
                index=i,
                input_len=int(inp or 0),
                output_len=int(out or 0),
                ttft_s=float(ttft) if ttft and not error else None,
                itls_s=tuple(float(x) for x in (itls or [])),
                latency_s=float(latencies[i] or 0.0) if latencies is not None else None,
                start_time_s=float(starts[i]) if starts and i < len(starts) else None,
                error=str(error or ""),
            )
        )
    return tuple(records)


def parse_bench_result(data: Mapping[str, Any], source: str = "bench result") -> BenchResult:
    """A `vllm bench serve --save-result` JSON object as a `BenchResult`; FleetInputError names what is
    missing (a truncated file, another tool's JSON, a `--append-result` file of several runs)."""
    if not isinstance(data, Mapping):
        raise FleetInputError(f"{source}: a JSON object was expected, got {type(data).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise FleetInputError(
            f"{source}: no {', '.join(missing)}; this is not the JSON of `vllm bench serve --save-result` "
            "(one run per file: --append-result files hold several)"
        )
    concurrency = data.get("max_concurrency")
    return BenchResult(
        date=str(data.get("date", "")),
        backend=str(data.get("backend") or data.get("endpoint_type") or ""),
        model_id=str(data.get("model_id", "")),
        tokenizer_id=str(data.get("tokenizer_id", "")),
        num_prompts=int(data["num_prompts"]) if isinstance(data.get("num_prompts"), int) else None,
        request_rate=_optional_number(data.get("request_rate")),
        burstiness=_optional_number(data.get("burstiness")),
        max_concurrency=int(concurrency) if isinstance(concurrency, int) else None,
        duration_s=_number(data, "duration", source),
        completed=int(_number(data, "completed", source)),
        failed=int(_number(data, "failed", source)),
        total_input_tokens=int(_number(data, "total_input_tokens", source)),
        total_output_tokens=int(_number(data, "total_output_tokens", source)),
        request_throughput=_optional_number(data.get("request_throughput")) or 0.0,
        output_throughput=_optional_number(data.get("output_throughput")) or 0.0,
        total_token_throughput=_optional_number(data.get("total_token_throughput")) or 0.0,
        percentiles=read_percentiles(data),
        requests=read_requests(data, source),
        spec_decode_acceptance_rate=_optional_number(data.get("spec_decode_acceptance_rate")),
        extra={
            k: v
            for k, v in data.items()
            if k not in KNOWN_KEYS
            and not PERCENTILE_KEY.match(k)
            and not k.startswith(tuple(f"{s}_" for s in STAT_KEYS))
        },
    )


def load_bench_result(path: str | os.PathLike[str]) -> BenchResult:
    """Read and parse one `vllm bench serve --save-result` file."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise FleetInputError(
            f"bench result {source!r} cannot be read ({exc.strerror}); check the path"
        ) from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise FleetInputError(
            f"bench result {source!r} is not one JSON object ({exc}); a --append-result file holds one run "
            "per line: split it"
        ) from exc
    return parse_bench_result(data, source)
