"""What a log says, as dataclasses (`LogReport` and its parts), and the bounds on what it keeps."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

HISTORY_LIMIT = 500  # stats / spec-decode / KV-cache / NUMA entries kept (the last ones)
# A line longer than this is cut here and the rest of it dropped (`lines_cut` counts them): no vLLM line is
# near it (an engine-config line is a few kB), and a 100 MB line must not be held, cleaned and searched whole.
MAX_LINE_CHARS = 1 << 20
ERRORS_PER_KIND = 20  # lines kept per error kind (the first ones); error_counts counts every one


@dataclass
class KvCacheReport:
    """One KV-cache announcement (a log may hold several: DP engines, restarts)."""

    tokens: int | None = None
    max_concurrency: float | None = None
    concurrency_max_model_len: int | None = None
    gpu_blocks: int | None = None
    cpu_blocks: int | None = None
    device: str | None = None
    line: str = ""


@dataclass
class LogError:
    kind: str
    line: str
    values: dict[str, Any] = field(default_factory=dict)


@dataclass
class LogReport:
    """Everything `parse_log` found; `evidence` maps a field name to the line that shows it."""

    version: str | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    concurrency_max_model_len: int | None = None
    gpu_blocks: int | None = None
    cpu_blocks: int | None = None
    kv_cache_device: str | None = None
    kv_cache_reports: list[KvCacheReport] = field(default_factory=list)
    available_kv_cache_gib: float | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    decode_context_parallel_size: int | None = None
    attention_backend: str | None = None
    custom_all_reduce_disabled: bool | None = None
    custom_all_reduce_disabled_reason: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    # one per worker of this log: {rank, world_size, pp_rank, tp_rank} (a rank of a multi-host instance logs
    # its own workers only)
    worker_ranks: list[dict[str, Any]] = field(default_factory=list)
    numa_bindings: list[dict[str, Any]] = field(default_factory=list)
    numa_nodes: list[int] = field(default_factory=list)
    numa_auto_binding_skipped: str | None = None
    ready: bool = False
    listen_url: str | None = None
    spec_decode: dict[str, Any] | None = None
    spec_decode_history: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] | None = None
    stats_history: list[dict[str, Any]] = field(default_factory=list)
    prefix_cache_hit_rate_percent: float | None = None
    kv_offload: dict[str, Any] | None = None
    engine_dead: bool = False
    engine_death: dict[str, Any] | None = None
    # the exception that ends the first traceback of a start that never became ready: the root cause
    # (vLLM's own wrapper, "Engine core initialization failed. See root cause above", comes after it)
    start_exception: dict[str, Any] | None = None
    stop: dict[str, Any] | None = None  # a deliberate stop (SIGINT/SIGTERM) and what it printed after
    errors: list[LogError] = field(default_factory=list)
    error_counts: dict[str, int] = field(default_factory=dict)
    lines_read: int = 0
    lines_cut: int = 0  # lines over MAX_LINE_CHARS, read up to it
    evidence: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _set(report: LogReport, name: str, value: Any, line: str) -> None:
    setattr(report, name, value)
    report.evidence[name] = line


def _keep_last(items: list[Any]) -> None:
    """Bound a history list to its last HISTORY_LIMIT entries (trimmed in halves: amortised O(1))."""
    if len(items) > 2 * HISTORY_LIMIT:
        del items[:-HISTORY_LIMIT]
