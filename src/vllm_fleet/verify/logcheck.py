"""Read vLLM's own output (0.2.x to 0.33) and check it against a plan.

Public API (the verify role and `vllm-fleet logcheck` call it; keep it stable):

    parse_log(text: str) -> LogReport
    check_log(report: LogReport, expectations: dict) -> list[Check]
    Check(name, ok, expected, seen, line, detail)          # `line` is the log line that shows it
    LogReport.to_dict()                                    # the JSON of `vllm-fleet logcheck --json`

Expectation keys (unknown keys are a FleetInputError):
    kv_cache_tokens (int) with kv_tokens_tolerance (fraction, default 0.02)
    max_concurrency (float, same tolerance, at least 0.01)
    max_model_len (int)                 the N of "Maximum concurrency for N tokens per request" or max_seq_len
    kv_cache_dtype (str)                fp8 and fp8_e4m3 are the same on CUDA
    attention_backend (str)             canonical enum name, e.g. FLASH_ATTN, FLASHINFER, TRITON_ATTN
    custom_all_reduce_disabled (bool)
    numa_nodes (list[int])              the nodes vLLM bound its workers / EngineCore to
    ready (bool)                        "Application startup complete" / "Starting vLLM server on"
    no_errors (bool)                    True: no fatal error line in the log

The input may be anything a person pastes: process prefixes (`(EngineCore_DP0 pid=1)`), journald prefixes
(`Nov 29 12:00:00 host vllm[123]: `), container timestamps, ANSI colours, interleaved processes, lines wrapped
by a terminal. Messages are matched by their text anywhere in the line, never by position.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import ahocorasick_rs

from vllm_fleet.errors import FleetInputError


class _Literal:
    """Regexes that each start with a literal, tried in turn; a leading `\\b` is checked by hand.

    `re` finds a pattern that starts with a literal by skipping to that literal; a leading `\\b` or an
    alternation makes it try every position instead, which costs 50x on a 3 kB engine-config line.
    """

    def __init__(self, *patterns: str) -> None:
        self.patterns = tuple(
            (re.compile(p[2:]), True) if p.startswith("\\b") else (re.compile(p), False) for p in patterns
        )

    def search(self, line: str) -> re.Match[str] | None:
        for pattern, word in self.patterns:
            for match in pattern.finditer(line):
                start = match.start()
                if not word or start == 0 or not (line[start - 1].isalnum() or line[start - 1] == "_"):
                    return match
        return None


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_PROCESS_PREFIX = re.compile(r"^(?:\s*\([\w.-]+(?: rank=\d+)? pid=\d+\)\s?|\s*\[Stage-\d+\]\s?)+")
_JOURNAL_PREFIX = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [\w.@-]+(?:\[\d+\])?: ")
# `journalctl -o short-iso` and container runtimes put an ISO-8601 stamp (and maybe host + unit) first.
_ISO_PREFIX = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)?\s+(?:\S+ [\w.@-]+\[\d+\]: )?")
_COMPOSE_PREFIX = re.compile(r"^[\w.-]+\s+\|\s")
_CONTINUATION_START = re.compile(r"^(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\b|^\s*(?:File |Traceback|\[|\()")

# --- version ---------------------------------------------------------------------------------------------
_VERSION_PATTERNS = (
    re.compile(r"vLLM (?:API )?server version v?(?P<v>\d+\.\d+[\w.+-]*)"),
    re.compile(r"Initializing an? (?:V1 )?LLM engine \(v(?P<v>\d+\.\d+[\w.+-]*)\)"),
    re.compile(r"[\u2580-\u259f].*\bversion\s+v?(?P<v>\d+\.\d+\.\d+[\w.+-]*)"),
)
# --- KV cache size
_KV_TOKENS = re.compile(r"(?P<dev>GPU \+ host|[A-Z]{2,5}) KV cache size: (?P<tokens>[\d,]+) tokens")
_KV_TOKENS_TEXT = " KV cache size: "  # in every _KV_TOKENS match
_CONCURRENCY = re.compile(r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<x>[\d.]+)x")
_BLOCKS = _Literal(
    *(
        rf"\b{dev} blocks: (?P<gpu>\d+)(?:, # CPU blocks: (?P<cpu>\d+))?"
        for dev in ("GPU", "cuda", "CUDA", "gpu")
    )
)
_AVAILABLE = (
    re.compile(r"Available KV cache memory: (?P<gib>-?[\d.]+) GiB"),
    re.compile(r"kv_cache_size=(?P<gib>-?[\d.]+)GiB"),
    re.compile(r"reserved for KV Cache is (?P<gib>-?[\d.]+) ?GiB"),
    re.compile(r"reserved (?P<gib>-?[\d.]+) ?GiB memory for KV Cache as specified by kv_cache_memory_bytes"),
    re.compile(r"Explicitly set \((?P<gib>[\d.]+)/[\d.]+\) GiB for KV cache"),
)
# --- configuration in effect --------------------------------------------------------------------------------
_KV_DTYPE_CONFIG = _Literal(r"\bkv_cache_dtype=(?P<d>[\w]+)")
_KV_DTYPE_ARGS = re.compile(r"'kv_cache_dtype': '(?P<d>[\w]+)'")
_KV_DTYPE_USING = re.compile(r"Using (?P<d>[\w]+) data type to store kv cache")
_MAX_SEQ_LEN = _Literal(
    r"\bmax_seq_len=(?P<n>\d+)", r"'max_model_len': (?P<n>\d+)", r"Using max model len (?P<n>\d+)"
)
_TP = _Literal(r"\btensor_parallel_size=(?P<n>\d+)", r"'tensor_parallel_size': (?P<n>\d+)")
_PARALLEL_SIZES = (
    (
        "pipeline_parallel_size",
        _Literal(r"\bpipeline_parallel_size=(?P<n>\d+)", r"'pipeline_parallel_size': (?P<n>\d+)"),
    ),
    (
        "decode_context_parallel_size",
        _Literal(r"\bdecode_context_parallel_size=(?P<n>\d+)", r"'decode_context_parallel_size': (?P<n>\d+)"),
    ),
)
_DISABLE_CAR = _Literal(
    r"\bdisable_custom_all_reduce=(?P<v>True|False)", r"'disable_custom_all_reduce': (?P<v>True|False)"
)
# --- other settings and figures in effect: settings[name] = the last value seen ---------------------------
# (name, literal needles, patterns): a pattern is tried only when the line holds one of the needles.
_SETTINGS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    (
        "max_num_batched_tokens",
        ("max_num_batched_tokens",),
        (r"\bmax_num_batched_tokens=(?P<v>\d+)", r"'max_num_batched_tokens': (?P<v>\d+)"),
    ),
    ("max_num_seqs", ("max_num_seqs",), (r"\bmax_num_seqs=(?P<v>\d+)", r"'max_num_seqs': (?P<v>\d+)")),
    ("model_dtype", ("dtype=torch.", "'dtype': '"), (r"\bdtype=torch\.(?P<v>\w+)", r"'dtype': '(?P<v>\w+)'")),
    ("quantization", ("quantization",), (r"\bquantization=(?P<v>\w+)", r"'quantization': '(?P<v>\w+)'")),
    ("architecture", ("Resolved architecture",), (r"Resolved architecture: (?P<v>\w+)",)),
    ("speculative_method", ("SpeculativeConfig(method=",), (r"SpeculativeConfig\(method='(?P<v>\w+)'",)),
    (
        "num_speculative_tokens",
        ("num_spec_tokens=", "'num_speculative_tokens'"),
        (r"\bnum_spec_tokens=(?P<v>\d+)", r"'num_speculative_tokens': (?P<v>\d+)"),
    ),
    (
        "gpu_memory_utilization",
        ("gpu_memory_utilization", "gpu-memory-utilization"),
        (
            r"\bgpu_memory_utilization[=: ]+\(?(?P<v>\d+(?:\.\d+)?)",
            r"current --gpu-memory-utilization=(?P<v>\d+(?:\.\d+)?)",
            r"increase --gpu-memory-utilization from (?P<v>\d+(?:\.\d+)?)",
        ),
    ),
    (
        "gpu_memory_utilization_suggested",
        ("gpu-memory-utilization",),
        (r"increase --gpu-memory-utilization (?:from [\d.]+ )?to (?P<v>\d+(?:\.\d+)?)",),
    ),
    ("total_gpu_memory_gib", ("total_gpu_memory",), (r"total_gpu_memory[= ]\(?(?P<v>\d+(?:\.\d+)?) ?GiB",)),
    (
        "model_weights_gib",
        ("Model loading took", "Loading model weights took"),
        (
            r"Model loading took (?P<v>\d+(?:\.\d+)?) ?GiB",
            r"Loading model weights took (?P<v>\d+(?:\.\d+)?) GB",
        ),
    ),
    (
        "model_loading_seconds",
        ("Model loading took",),
        (r"Model loading took [\d.]+ ?GiB(?: memory)? and (?P<v>\d+(?:\.\d+)?) seconds",),
    ),
    (
        "cudagraph_memory_gib",
        ("Estimated CUDA graph memory",),
        (r"Estimated CUDA graph memory: (?P<v>\d+(?:\.\d+)?) GiB",),
    ),
    ("num_gpu_blocks_override", ("num_gpu_blocks_override=",), (r"num_gpu_blocks_override=(?P<v>\d+)",)),
    ("num_gpu_blocks", ("num_gpu_blocks is:",), (r"num_gpu_blocks is: (?P<v>\d+)",)),
    (
        "flash_attention_version",
        ("Using FlashAttention version",),
        (r"Using FlashAttention version (?P<v>\d+)",),
    ),
)
_SETTING_PATTERNS = tuple(
    (name, needles, tuple(_Literal(p) for p in patterns)) for name, needles, patterns in _SETTINGS
)
# --- attention backend (vllm-facts §2) ---------------------------------------------------------------------
_BACKEND_POTENTIAL = re.compile(
    r"Using (?:AttentionBackendEnum\.)?(?P<n>[A-Z][A-Z0-9_]+) attention backend out of potential backends"
)
_BACKEND_ENUM = re.compile(r"Using (?:AttentionBackendEnum\.|_Backend\.)(?P<n>[A-Z][A-Z0-9_]+) backend")
_BACKEND_NAME = re.compile(
    r"Using (?P<n>[A-Z][A-Z0-9_]*(?:ATTN|FLASHINFER|SDPA|MLA|ATTENTION|XFORMERS)[A-Z0-9_]*) backend\."
)
_BACKEND_WORDS = re.compile(
    r"Using (?P<n>Flash Attention|FlashInfer|Triton|FlexAttention|XFormers|Torch SDPA|ROCmFlashAttention|"
    r"CPU SDPA|Pallas|IPEX|FlashMLA|Triton MLA|CUTLASS MLA) backend"
)
_BACKEND_CANONICAL = {
    "flash attention": "FLASH_ATTN",
    "flashinfer": "FLASHINFER",
    "triton": "TRITON_ATTN",
    "flexattention": "FLEX_ATTENTION",
    "xformers": "XFORMERS",
    "torch sdpa": "TORCH_SDPA",
    "rocmflashattention": "ROCM_FLASH",
    "cpu sdpa": "TORCH_SDPA",
    "pallas": "PALLAS",
    "ipex": "IPEX",
    "flashmla": "FLASHMLA",
    "triton mla": "TRITON_MLA",
    "cutlass mla": "CUTLASS_MLA",
    "flash_attn_vllm_v1": "FLASH_ATTN",
    "triton_attn_vllm_v1": "TRITON_ATTN",
    "flashinfer_vllm_v1": "FLASHINFER",
}
# --- custom all-reduce
_CAR_DISABLED = re.compile(
    r"Custom allreduce is disabled (?:because |due to )(?P<why>.*?)(?:\. To silence.*|\.?\s*$)"
)
_CAR_LAUNCHER = re.compile(r"custom all-reduce OFF", re.IGNORECASE)
_CAR_REASONS = (
    ("lacks GPU P2P capability", "no_p2p"),
    ("more than two PCIe-only GPUs", "more_than_two_pcie_gpus"),
    ("unsupported world size", "unsupported_world_size"),
    ("missing custom allreduce library", "missing_library"),
    ("spans across nodes", "spans_nodes"),
)
# --- NUMA binding (vllm-facts §5) ---------------------------------------------------------------------------
_NUMA_WORKER = re.compile(
    r"Binding worker subprocess \(local_rank=(?P<rank>\d+), gpu_index=(?P<gpu>\d+)\) to "
    r"(?:CPUs (?P<cpus>\S+) and )?NUMA node (?P<node>\d+)"
)
_NUMA_ENGINE = re.compile(
    r"Binding EngineCore subprocess \(local_rank=(?P<rank>\d+)\) to NUMA nodes (?P<nodes>.+)$"
)
_NUMA_AUTO = re.compile(r"Auto-detected NUMA nodes for GPUs: (?P<nodes>.+)$")
_NUMA_SKIPPED = re.compile(
    r"(?P<why>CPU affinity is already constrained for this process|User lacks permission to set NUMA memory "
    r"policy|Failed to run `numactl --show`)"
)
# --- readiness ----------------------------------------------------------------------------------------------
_READY = re.compile(
    r"Application startup complete|Starting vLLM (?:API )?server(?: \d+)? on (?P<url>\S+)|Uvicorn running "
    r"on (?P<u2>\S+)"
)
# --- speculative decoding
_SPEC_V1 = re.compile(r"SpecDecoding metrics: (?P<body>.*)$")
_SPEC_V0 = re.compile(r"Speculative metrics: (?P<body>.*)$")
_SPEC_FIELDS = {
    "mean_acceptance_length": re.compile(r"Mean acceptance length: (?P<v>[\d.]+)"),
    "accepted_throughput": re.compile(r"Accepted throughput: (?P<v>[\d.]+) tokens/s"),
    "drafted_throughput": re.compile(r"Drafted throughput: (?P<v>[\d.]+) tokens/s"),
    "accepted_tokens": re.compile(r"Accepted: (?P<v>\d+) tokens"),
    "drafted_tokens": re.compile(r"Drafted: (?P<v>\d+) tokens"),
}
_SPEC_RATE_NEW = re.compile(r"Avg Draft acceptance rate: (?P<v>[\d.]+)%")
_SPEC_RATE_OLD = re.compile(r"(?<!Avg )Draft acceptance rate: (?P<v>[\d.]+)(?P<pct>%?)")
_SPEC_PER_POSITION = re.compile(
    r"Per-position acceptance rate: (?P<v>[\d.]+(?:, [\d.]+)*)(?=, Avg Draft|\s*$|,?\s*$)"
)
_SPEC_V0_FIELDS = {
    "system_efficiency": re.compile(r"System efficiency: (?P<v>[\d.]+)"),
    "num_speculative_tokens": re.compile(r"Number of speculative tokens: (?P<v>\d+)"),
    "accepted_tokens": re.compile(r"Number of accepted tokens: (?P<v>\d+)"),
    "drafted_tokens": re.compile(r"Number of draft tokens: (?P<v>\d+)"),
    "emitted_tokens": re.compile(r"Number of emitted tokens: (?P<v>\d+)"),
}
# --- periodic stats -----------------------------------------------------------------------------------------
_STATS_KEYS = {
    "Avg prompt throughput": "prompt_throughput",
    "Avg generation throughput": "generation_throughput",
    "Running": "running",
    "Waiting": "waiting",
    "Swapped": "swapped",
    "Pending": "pending",
    "Preemptions": "preemptions",
    "Prefix cache hit rate": "prefix_cache_hit_rate_percent",
    "External prefix cache hit rate": "external_prefix_cache_hit_rate_percent",
}
_PREFIX_V0 = re.compile(r"Prefix cache hit rate: GPU: (?P<gpu>[\d.]+)%, CPU: (?P<cpu>[\d.]+)%")
# --- fatal errors: (kind, literal needles, pattern); the first kind that matches a line wins ----------------
_ERROR_TABLE: tuple[tuple[str, tuple[str, ...], re.Pattern[str]], ...] = (
    (
        "max_model_len_exceeds_kv_cache",
        ("To serve at least one request",),
        re.compile(r"To serve at least one request with the models?'s? max seq len"),
    ),
    (
        "max_model_len_exceeds_kv_cache",
        ("is larger than the maximum number of tokens",),
        re.compile(
            r"max seq len \(\d+\) is larger than the maximum number of tokens that can be stored in KV cache"
        ),
    ),
    ("no_kv_cache_memory", ("No available memory",), re.compile(r"No available memory for the cache blocks")),
    ("no_kv_cache_memory", (" blocks: 0",), re.compile(r"# (?:cuda|GPU) blocks: 0\b")),
    ("negative_kv_cache_memory", ("KV cache memory: -",), re.compile(r"Available KV cache memory: -\d")),
    ("negative_kv_cache_memory", ("KV Cache is -",), re.compile(r"reserved for KV Cache is -\d")),
    (
        "insufficient_free_memory",
        ("less than desired GPU memory",),
        re.compile(r"Free memory on device .*? on startup is less than desired GPU memory utilization"),
    ),
    (
        "cuda_oom",
        ("out of memory", "OutOfMemoryError", "not enough GPU memory"),
        re.compile(r"CUDA out of memory|OutOfMemoryError|Failed to load model - not enough GPU memory"),
    ),
    (
        "unrecognized_arguments",
        ("unrecognized arguments",),
        re.compile(r"error: unrecognized arguments: (?P<args>.*)$"),
    ),
    ("invalid_kv_cache_dtype", ("Invalid kv_cache_dtype",), re.compile(r"Invalid kv_cache_dtype")),
    (
        "engine_init_failed",
        ("EngineCore failed to start", "Engine core initialization failed", "initialize_cache"),
        re.compile(
            r"EngineCore failed to start|Engine core initialization failed|Error executing method "
            r"initialize_cache"
        ),
    ),
)
_ERRORS = tuple((kind, pattern) for kind, _, pattern in _ERROR_TABLE)
# --- an engine that dies after readiness (vllm/v1/engine/core.py, core_client.py, exceptions.py; V0's
# AsyncEngineDeadError); before readiness the start-up kinds above name the cause ----------------------------
_DEATH_NEEDLES = (
    "EngineDeadError",
    "EngineCore encountered a fatal error",
    "died unexpectedly",
    "Engine loop has died",
    "Background loop has errored",
)
_ENGINE_DEATH = re.compile("|".join(re.escape(n) for n in _DEATH_NEEDLES))
# Only printed once the engine runs: these need no readiness line before them.
_RUNNING_ENGINE_DEATH = re.compile(
    r"EngineDeadError|EngineCore encountered a fatal error|Engine core proc \S+ died unexpectedly|"
    r"Engine loop has died|Background loop has errored"
)
_HTTP_5XX = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>5\d\d)\b')
# `ERROR 05-12 01:48:42 [api_router.py:72] ` (pasted logs sometimes garble the bracket: `[async_llm.py:485[]`)
_LEVEL_PREFIX = re.compile(
    r"^(?:\[rank\d+\]: |(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d [\d:.]+ \[?[^\]]*\] ?)"
)
_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*(?P<exc>[A-Z]\w*(?:Error|Exception|Exit|Interrupt))(?::\s*(?P<msg>.*))?$"
)
TRACEBACK_MAX_LINES = 400
# pydantic's echo of the input after its message: ` [type=value_error, input_value=ArgsKwargs((), {...`
_PYDANTIC_INPUT = re.compile(r"\s*\[type=\w+, input_value=.*$")
_DEAD_ERRORS = ("EngineDeadError", "AsyncEngineDeadError")
# A deliberate stop (LogParser._on_stop): vLLM 0.26's signal handlers, uvicorn's own line.
_STOP_SIGNAL = re.compile(
    r"\[shutdown\] (?:API server: shutdown triggered|EngineCore: trigger received signal=(?P<sig>SIG[A-Z]+))"
)
_UVICORN_STOP = re.compile(r"^INFO:\s+Shutting down$")
_STOP_EXCEPTIONS = ("CancelledError", "KeyboardInterrupt")
# --- KV offload tier (vllm/distributed/kv_transfer/kv_connector/factory.py, vllm/v1/kv_offload/factory.py,
# vllm/v1/kv_offload/cpu/gpu_worker.py, vllm/distributed/kv_transfer/kv_connector/v1/metrics.py) -------------
_OFFLOAD_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("connector", re.compile(r"Creating v1 connector with name: (?P<v>\w+)")),
    ("spec", re.compile(r"Creating offloading spec with name: (?P<v>\w+)")),
    ("cpu_tensors", re.compile(r"Allocating (?P<v>\d+) CPU tensors")),
    # DEBUG only: one line per tensor, `num_cpu_blocks×page_bytes (x GB)`.
    ("cpu_bytes_allocated", re.compile(r"pinned tensor (?P<blocks>\d+)\D(?P<page>\d+) \(")),
    ("transfer_metrics", re.compile(r"KV Transfer metrics: (?P<v>.*)$")),
    ("cpu_bytes_configured", re.compile(r"""['"]cpu_bytes_to_use['"]: (?P<v>\d+)""")),
    ("configured_connector", re.compile(r"""kv_connector=['"](?P<v>\w+)""")),
    ("configured_connector", re.compile(r"""['"]kv_connector['"]: ['"](?P<v>\w+)""")),
)
# `k=v, k=v` where a key may hold `:('GPU_to_CPU',)` (0.26's labelled keys) and every value is a number.
_TRANSFER_FIELD = re.compile(r"(?P<k>[^=]+?)=(?P<v>-?[\d.]+(?:e[-+]?\d+)?)(?:, |$)")
_MAXLEN_VALUES = re.compile(
    r"max seq len \((?P<len>\d+)\), \((?P<need>[\d.]+) GiB KV cache is needed, which is larger than the "
    r"available "
    r"KV cache memory \((?P<avail>[\d.]+) GiB\)(?:\. Based on the available memory, the estimated maximum "
    r"model "
    r"length is (?P<est>\d+))?"
)
_MAXLEN_V0_VALUES = re.compile(
    r"max seq len \((?P<len>\d+)\) is larger than the maximum number of tokens that can be stored in KV "
    r"cache \((?P<cap>\d+)\)"
)

_FP8_SAME = {"fp8": "fp8_e4m3"}
HISTORY_LIMIT = 500  # stats / spec-decode / KV-cache / NUMA entries kept (the last ones)
ERRORS_PER_KIND = 20  # lines kept per error kind (the first ones); error_counts counts every one


_INT_TEXT = re.compile(r"\d+")
_FLOAT_TEXT = re.compile(r"\d+\.\d*")


def _number(text: str) -> int | float | str:
    """`2048` -> 2048, `0.90` -> 0.9, anything else stays text."""
    if _INT_TEXT.fullmatch(text):
        return int(text)
    if _FLOAT_TEXT.fullmatch(text):
        return float(text)
    return text


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def clean_line(raw: str) -> str:
    """A log line without colour codes, journald / container prefixes and vLLM process tags.

    Each prefix regex runs only where a character it needs is in place (a journald date has a space at 3,
    an ISO date a dash at 4, a compose column a `|`, a process tag starts with `(`, `[` or a space): most
    lines need none of the four, and test_logcheck_reference checks these tests against the bare regexes.
    """
    line = (_ANSI.sub("", raw) if "\x1b" in raw else raw).rstrip("\r\n")
    # match + slice, not sub: each prefix regex is anchored (one match at most) and a slice is cheaper.
    if line[3:4] == " " and (found := _JOURNAL_PREFIX.match(line)):
        line = line[found.end() :]
    if line[4:5] == "-" and (found := _ISO_PREFIX.match(line)):
        line = line[found.end() :]
    if "|" in line and (found := _COMPOSE_PREFIX.match(line)):
        line = line[found.end() :]  # docker compose service column
    first = line[:1]
    if (first == "(" or first == "[" or first.isspace()) and (found := _PROCESS_PREFIX.match(line)):
        line = line[found.end() :]
    return line


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
    evidence: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Check:
    """One named comparison of the log against the plan."""

    name: str
    ok: bool
    expected: Any
    seen: Any
    line: str | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def canonical_backend(name: str) -> str:
    """`Flash Attention` / `FLASH_ATTN` / `AttentionBackendEnum.FLASH_ATTN` -> `FLASH_ATTN`."""
    text = name.strip().split(".")[-1]
    return _BACKEND_CANONICAL.get(text.lower(), text.upper())


def canonical_kv_dtype(name: str) -> str:
    """fp8 is fp8_e4m3 on CUDA; everything else is compared as written."""
    text = name.strip().lower()
    return _FP8_SAME.get(text, text)


def _joined(lines: list[str], index: int) -> str:
    """The line plus continuation lines that a terminal or a paste hard-wrapped (no prefix, no level)."""
    text = lines[index]
    for follow in lines[index + 1 : index + 4]:
        if not follow or _CONTINUATION_START.match(follow) or _KV_TOKENS.search(follow):
            break
        text += follow
    return text


def _parse_spec(line: str) -> dict[str, Any] | None:
    match = _SPEC_V1.search(line)
    if match:
        body = match.group("body")
        result: dict[str, Any] = {"format": "v1"}
        for key, pattern in _SPEC_FIELDS.items():
            found = pattern.search(body)
            if found:
                value = found.group("v")
                result[key] = int(value) if key.endswith("_tokens") else float(value)
        rate = _SPEC_RATE_NEW.search(body) or _SPEC_RATE_OLD.search(body)
        result["avg_draft_acceptance_rate"] = float(rate.group("v")) if rate else None
        positions = _SPEC_PER_POSITION.search(body)
        result["per_position"] = [float(v) for v in positions.group("v").split(", ")] if positions else None
        result["line"] = line
        return result
    match = _SPEC_V0.search(line)
    if match:
        body = match.group("body")
        result = {"format": "v0"}
        rate = _SPEC_RATE_OLD.search(body)
        if rate:
            value = float(rate.group("v"))
            # V0 prints a 0-1 fraction; the report is in percent like V1's.
            result["avg_draft_acceptance_rate"] = value if rate.group("pct") else round(value * 100, 4)
        else:
            result["avg_draft_acceptance_rate"] = None
        for key, pattern in _SPEC_V0_FIELDS.items():
            found = pattern.search(body)
            if found:
                value = found.group("v")
                result[key] = float(value) if key == "system_efficiency" else int(value)
        result["mean_acceptance_length"] = None
        result["per_position"] = None
        result["line"] = line
        return result
    return None


def _parse_stats(line: str) -> dict[str, Any] | None:
    """The periodic stats line, by its `Key: value` parts (plain string splits: the line comes every 10 s)."""
    start = line.find("Avg prompt throughput")
    if start == -1:
        return None
    stats: dict[str, Any] = {}
    for part in line[start:].split(", "):
        key, _, value = part.partition(": ")
        name = _STATS_KEYS.get(key)
        if name is None and key.endswith(" KV cache usage"):
            number = _stats_number(value, "kv_cache_usage_percent")
            if number is not None:
                if key.endswith("CPU KV cache usage"):
                    stats.setdefault("cpu_kv_cache_usage_percent", number)
                stats.setdefault("kv_cache_usage_percent", number)  # the first device (GPU) in V0's two
            continue
        if name is None or name in stats:
            continue
        number = _stats_number(value, name)
        if number is not None:
            stats[name] = number
    engine = line.find("Engine ")
    digits = line[engine + 7 : line.find(":", engine)] if engine != -1 else ""
    stats["engine"] = int(digits) if digits.isdigit() else None
    stats["line"] = line
    return stats


def _stats_number(value: str, name: str) -> int | float | None:
    """`9.2 tokens/s` / `0 reqs` / `12.5%` -> the number (float for rates and percentages), else None."""
    text = value.split(" ", 1)[0].rstrip(".%")
    if not text or not text.replace(".", "", 1).isdigit():
        return None
    return float(text) if "." in text or name.endswith(("percent", "throughput")) else int(text)


def _car_reason(why: str) -> str:
    for needle, code in _CAR_REASONS:
        if needle in why:
            return code
    return why.strip()


def _set(report: LogReport, name: str, value: Any, line: str) -> None:
    setattr(report, name, value)
    report.evidence[name] = line


def _keep_last(items: list[Any]) -> None:
    """Bound a history list to its last HISTORY_LIMIT entries (trimmed in halves: amortised O(1))."""
    if len(items) > 2 * HISTORY_LIMIT:
        del items[:-HISTORY_LIMIT]


def _transfer_fields(body: str) -> dict[str, int | float | str]:
    """`k=v, k=v` of a `KV Transfer metrics:` line (vLLM joins `reduce()`'s dict with ", ")."""
    return {m.group("k"): _number(m.group("v")) for m in _TRANSFER_FIELD.finditer(body)}


class LogParser:
    """One streaming pass over a log: `feed(line)` per line, then `finish()` for the report.

    Each handler below is guarded by literal substrings (`_HANDLERS`), all found in one automaton pass per
    block (`_line_masks`); a line that contains none of them costs no Python code and is never cleaned.
    History lists keep their last HISTORY_LIMIT entries
    and each error kind its first ERRORS_PER_KIND lines (`error_counts` counts them all), so memory stays
    flat whatever the journal's length.
    """

    def __init__(self) -> None:
        self.report = LogReport()
        self.dtype_rank = 0  # engine config (3) > "Using ... to store kv cache" (2) > non-default args (1)
        self.numa_nodes: set[int] = set()
        self.seen_errors: set[tuple[str, str]] = set()
        self.current = KvCacheReport()
        self.joins: list[tuple[LogError, list[str]]] = []  # errors whose message may continue on next lines
        # [first line, lines seen, after readiness?] of the traceback being read
        self.traceback: list[Any] | None = None
        self.start_detail = 0  # indented lines after the start exception that still belong to its message
        self.serving = False  # readiness announced since the last start banner (a journal may hold restarts)
        self.stopping = 0  # 0 running; 1 uvicorn said "Shutting down"; 2 a SIGINT/SIGTERM handler said so
        self.stats_lines: list[str] = []
        self.prefix_line: tuple[str, str] | None = None  # the last line that showed the prefix-cache hit rate

    # --- the loop ------------------------------------------------------------------------------------------
    def feed_block(self, block: str) -> None:
        """Whole lines (a block ending at a line end, or the input's last line).

        One pass of the needle automaton (`_MATCHER`, in Rust) over the block finds the lines that hold a
        needle and which handlers each needs; only those lines are cut out, cleaned and handed over. A line
        that holds no needle is never touched by Python code (unless a traceback or wrapped error is open),
        which is what makes a journal of access logs cheap to read. A stats line that only the stats handler
        reads is kept raw (cleaned in finish(), for the last HISTORY_LIMIT only).
        """
        if not block:
            return
        self.report.lines_read += block.count("\n") + (not block.endswith("\n"))
        if "\x1b" in block:
            block = _ANSI.sub("", block)
        pos = 0
        for start, end, mask in zip(*_line_masks(block), strict=True):
            if self._open():
                pos = self._follow_until(block, pos, start)
                following = self._open()
            else:
                following = False
            if mask == _STATS_MASK and not following:
                self._on_stats_raw(block[start:end])
            else:
                line = clean_line(block[start:end])
                if following:
                    self._follow(line)
                if line:
                    for handler in _MASK_HANDLERS[mask]:
                        handler(self, line)
            pos = end + 1
        if self._open():
            self._follow_until(block, pos, len(block))

    def _open(self) -> bool:
        """Whether the next lines belong to something already seen (a traceback, a wrapped error, the
        cause of a start exception), so every line is read, needle or not."""
        return bool(self.joins or self.traceback is not None or self.start_detail)

    def feed(self, raw: str) -> None:
        """One line (with or without its newline)."""
        self.feed_block(raw if raw.endswith("\n") else raw + "\n")

    def _follow_until(self, block: str, pos: int, stop: int) -> int:
        """Lines from `pos` up to `stop` for `_follow`, while a traceback or a wrapped error is open."""
        while pos < stop and self._open():
            end = block.find("\n", pos)
            end = len(block) if end == -1 else end
            self._follow(clean_line(block[pos:end]))
            pos = end + 1
        return pos

    def finish(self) -> LogReport:
        for error, parts in self.joins:
            _maxlen_values(error, "".join(parts))
        self.joins = []
        self._finish_stats()
        report = self.report
        self._finish_start()
        for history in (report.spec_decode_history, report.kv_cache_reports, report.numa_bindings):
            del history[:-HISTORY_LIMIT]
        report.numa_nodes = sorted(self.numa_nodes)
        if report.numa_bindings:
            report.evidence["numa_nodes"] = report.numa_bindings[-1]["line"]
        return report

    def _follow(self, line: str) -> None:
        """Continuation lines of a hard-wrapped error, and the exception that ends a traceback."""
        still = []
        for error, parts in self.joins:
            if (
                not line
                or _CONTINUATION_START.match(line)
                or (_KV_TOKENS_TEXT in line and _KV_TOKENS.search(line))
            ):
                _maxlen_values(error, "".join(parts))
                continue
            parts.append(line)
            if len(parts) >= 4:
                _maxlen_values(error, "".join(parts))
            else:
                still.append((error, parts))
        self.joins = still
        if self.start_detail:
            self._start_detail(line)
        if self.traceback is not None:
            self.traceback[1] += 1
            message = _LEVEL_PREFIX.sub("", line, count=1)
            if not message or message[0] in " \t^~" or self.traceback[1] > TRACEBACK_MAX_LINES:
                if self.traceback[1] > TRACEBACK_MAX_LINES:
                    self.traceback = None
                return
            # The first line at the traceback's own indentation ends it: the exception, or something else.
            after_ready = self.traceback[2]
            self.traceback = None
            found = _EXCEPTION_LINE.match(message)
            if not found:
                return
            values = {"exception": found.group("exc"), "message": (found.group("msg") or "").strip()}
            if not after_ready:
                self._start_exception(line, values)
                return
            if self._stop_noise("traceback_after_ready", values["exception"]):
                return
            self._error("traceback_after_ready", line, values)
            death = self.report.engine_death
            if (
                death is not None
                and death.get("root_cause") is None
                and values["exception"] not in _DEAD_ERRORS
            ):
                death["root_cause"] = values

    def _error(self, kind: str, line: str, values: dict[str, Any] | None = None) -> LogError | None:
        """Record one fatal line; None when this kind already holds ERRORS_PER_KIND lines or this line."""
        report = self.report
        count = report.error_counts.get(kind, 0)
        report.error_counts[kind] = count + 1
        if count >= ERRORS_PER_KIND or (kind, line) in self.seen_errors:
            return None
        self.seen_errors.add((kind, line))
        error = LogError(kind=kind, line=line, values=values or {})
        report.errors.append(error)
        return error

    def _finish_start(self) -> None:
        """A start that never became ready, whose known fatal lines (if any) do not name the cause: the
        first start-up traceback's exception is the error (`start_exception`)."""
        report = self.report
        if report.ready:
            report.start_exception = None
        named = {e.kind for e in report.errors} - {"engine_init_failed"}
        if report.start_exception is None or named:
            return
        values = {k: v for k, v in report.start_exception.items() if k != "line"}
        self._error("start_exception", report.start_exception["line"], values)
        report.evidence["start_exception"] = report.start_exception["line"]

    # --- handlers, one per kind of line -------------------------------------------------------------------
    def _on_version(self, line: str) -> None:
        for pattern in _VERSION_PATTERNS:
            match = pattern.search(line)
            if match:
                _set(self.report, "version", match.group("v"), line)
                self.serving = False
                self.stopping = 0
                return

    def _on_kv_report(self, line: str) -> None:
        report = self.report
        # `in` first: _KV_TOKENS starts with an alternation, so `re` tries it at every position of the line.
        tokens = _KV_TOKENS.search(line) if _KV_TOKENS_TEXT in line else None
        blocks = None if tokens or " blocks: " not in line else _BLOCKS.search(line)
        if tokens:
            if self.current.tokens is not None or self.current.gpu_blocks is not None:
                self.current = KvCacheReport()
            current = self.current
            current.tokens, current.device, current.line = (
                _int(tokens.group("tokens")),
                tokens.group("dev"),
                line,
            )
            report.kv_cache_reports.append(current)
            _keep_last(report.kv_cache_reports)
            _set(report, "kv_cache_tokens", current.tokens, line)
            _set(report, "kv_cache_device", current.device, line)
        elif blocks and "KV cache" not in line:
            if self.current.gpu_blocks is not None or self.current.tokens is not None:
                self.current = KvCacheReport()
            current = self.current
            current.gpu_blocks = int(blocks.group("gpu"))
            current.cpu_blocks = int(blocks.group("cpu")) if blocks.group("cpu") else None
            current.line = line
            report.kv_cache_reports.append(current)
            _keep_last(report.kv_cache_reports)
            _set(report, "gpu_blocks", current.gpu_blocks, line)
            if current.cpu_blocks is not None:
                _set(report, "cpu_blocks", current.cpu_blocks, line)
        concurrency = _CONCURRENCY.search(line)
        if concurrency:
            if self.current.max_concurrency is not None or not report.kv_cache_reports:
                self.current = KvCacheReport(line=line)
                report.kv_cache_reports.append(self.current)
            self.current.max_concurrency = float(concurrency.group("x"))
            self.current.concurrency_max_model_len = _int(concurrency.group("len"))
            _set(report, "max_concurrency", self.current.max_concurrency, line)
            _set(report, "concurrency_max_model_len", self.current.concurrency_max_model_len, line)

    def _on_available(self, line: str) -> None:
        for pattern in _AVAILABLE:
            match = pattern.search(line)
            if match:
                _set(self.report, "available_kv_cache_gib", float(match.group("gib")), line)
                return

    def _on_kv_dtype(self, line: str) -> None:
        for pattern, rank in ((_KV_DTYPE_CONFIG, 3), (_KV_DTYPE_USING, 2), (_KV_DTYPE_ARGS, 1)):
            match = pattern.search(line)
            if match and rank >= self.dtype_rank:
                self.dtype_rank = rank
                _set(self.report, "kv_cache_dtype", match.group("d"), line)
                return

    def _on_max_len(self, line: str) -> None:
        match = _MAX_SEQ_LEN.search(line)
        if match:
            value = int(match.group("n"))
            _set(self.report, "max_model_len", value, line)

    def _on_parallel(self, line: str) -> None:
        match = _TP.search(line)
        if match:
            _set(self.report, "tensor_parallel_size", int(match.group("n")), line)
        for name, pattern in _PARALLEL_SIZES:
            match = pattern.search(line)
            if match:
                _set(self.report, name, int(match.group("n")), line)

    def _on_backend(self, line: str) -> None:
        for pattern in (_BACKEND_POTENTIAL, _BACKEND_ENUM, _BACKEND_NAME, _BACKEND_WORDS):
            match = pattern.search(line)
            if match:
                _set(self.report, "attention_backend", canonical_backend(match.group("n")), line)
                return

    def _on_all_reduce(self, line: str) -> None:
        report = self.report
        match = _CAR_DISABLED.search(line)
        if match:
            _set(report, "custom_all_reduce_disabled", True, line)
            _set(report, "custom_all_reduce_disabled_reason", _car_reason(match.group("why")), line)
        elif _CAR_LAUNCHER.search(line):
            _set(report, "custom_all_reduce_disabled", True, line)
            _set(report, "custom_all_reduce_disabled_reason", "launcher: " + line.strip(), line)
        else:
            match = _DISABLE_CAR.search(line)
            if match:
                if match.group("v") == "True":
                    _set(report, "custom_all_reduce_disabled", True, line)
                    _set(report, "custom_all_reduce_disabled_reason", "disable_custom_all_reduce=True", line)
                elif report.custom_all_reduce_disabled is None:
                    _set(report, "custom_all_reduce_disabled", False, line)

    def _on_numa(self, line: str) -> None:
        report = self.report
        match = _NUMA_WORKER.search(line)
        if match:
            report.numa_bindings.append(
                {
                    "process": "worker",
                    "local_rank": int(match.group("rank")),
                    "gpu_index": int(match.group("gpu")),
                    "nodes": [int(match.group("node"))],
                    "cpus": match.group("cpus"),
                    "line": line,
                }
            )
            _keep_last(report.numa_bindings)
            self.numa_nodes.add(int(match.group("node")))
        match = _NUMA_ENGINE.search(line)
        if match:
            nodes = [int(n) for n in re.findall(r"\d+", match.group("nodes"))]
            report.numa_bindings.append(
                {
                    "process": "EngineCore",
                    "local_rank": int(match.group("rank")),
                    "gpu_index": None,
                    "nodes": nodes,
                    "cpus": None,
                    "line": line,
                }
            )
            _keep_last(report.numa_bindings)
            self.numa_nodes.update(nodes)
        match = _NUMA_SKIPPED.search(line)
        if match:
            _set(report, "numa_auto_binding_skipped", match.group("why"), line)

    def _on_ready(self, line: str) -> None:
        match = _READY.search(line)
        if match:
            _set(self.report, "ready", True, line)
            self.serving = True
            url = match.group("url") or match.group("u2")
            if url:
                self.report.listen_url = url

    def _on_spec(self, line: str) -> None:
        spec = _parse_spec(line)
        if spec:
            self.report.spec_decode_history.append(spec)
            _keep_last(self.report.spec_decode_history)
            if spec.get("avg_draft_acceptance_rate") is not None:
                _set(self.report, "spec_decode", spec, line)

    def _on_stats(self, line: str) -> None:
        # Kept as text and parsed in finish(): only the last HISTORY_LIMIT are reported, and a serving journal
        # has one every 10 s.
        self.stats_lines.append(line)
        _keep_last(self.stats_lines)
        if "Prefix cache hit rate: " in line:
            self.prefix_line = ("stats", line)

    def _on_stats_raw(self, raw: str) -> None:
        """`_on_stats` of a raw line (cleaned in finish(), only the last HISTORY_LIMIT are)."""
        self.stats_lines.append(raw)
        _keep_last(self.stats_lines)
        if "Prefix cache hit rate: " in raw:
            self.prefix_line = ("stats", raw)

    def _on_prefix_v0(self, line: str) -> None:
        if _PREFIX_V0.search(line):
            self.prefix_line = ("v0", line)

    def _finish_stats(self) -> None:
        report = self.report
        for line in map(clean_line, self.stats_lines[-HISTORY_LIMIT:]):
            stats = _parse_stats(line)
            if stats:
                report.stats_history.append(stats)
                _set(report, "stats", stats, line)
        if self.prefix_line is not None:
            kind, line = self.prefix_line[0], clean_line(self.prefix_line[1])
            if kind == "v0":
                match = _PREFIX_V0.search(line)
                value = float(match.group("gpu")) if match else None
            else:
                value = (_parse_stats(line) or {}).get("prefix_cache_hit_rate_percent")
            if value is not None:
                _set(report, "prefix_cache_hit_rate_percent", value, line)

    def _on_offload(self, line: str) -> None:
        """The KV offload tier in effect: connector and spec created, CPU tensors, periodic transfers."""
        report = self.report
        offload = report.kv_offload
        for key, pattern in _OFFLOAD_PATTERNS:
            match = pattern.search(line)
            if not match:
                continue
            if offload is None:
                offload = report.kv_offload = {"transfer_intervals": 0, "transfer_totals": {}}
            if key == "transfer_metrics":
                fields = _transfer_fields(match.group("v"))
                offload["transfer_metrics"] = fields
                offload["transfer_intervals"] += 1
                totals = offload["transfer_totals"]
                for name, value in fields.items():
                    if isinstance(value, int | float):
                        totals[name] = totals.get(name, 0) + value
            elif key == "cpu_bytes_allocated":
                blocks, page = int(match.group("blocks")), int(match.group("page"))
                offload[key] = offload.get(key, 0) + blocks * page
            else:
                offload[key] = _number(match.group("v"))
            report.evidence[f"kv_offload.{key}"] = line

    def _on_fatal(self, line: str) -> None:
        for kind, pattern in _ERRORS:
            if not pattern.search(line):
                continue
            error = self._error(kind, line)
            if error is None:
                return
            if kind == "max_model_len_exceeds_kv_cache":
                self.joins.append((error, [line]))
            elif kind == "unrecognized_arguments":
                found = pattern.search(line)
                error.values = {"arguments": found.group("args").strip()} if found else {}
            return

    def _on_engine_death(self, line: str) -> None:
        """An engine that dies while serving (a death during start-up is one of the fatal kinds above).

        EngineDeadError, `EngineCore encountered a fatal error` and `Engine core proc ... died unexpectedly`
        only exist once the engine runs (vllm/v1/engine/core.py run_busy_loop, core_client.py's monitor), so
        they count with or without a readiness line in the log; a worker that dies counts once ready.
        """
        report = self.report
        if not _ENGINE_DEATH.search(line) or not (self.serving or _RUNNING_ENGINE_DEATH.search(line)):
            return
        if self._stop_noise("engine_dead", "EngineDeadError" if "DeadError" in line else "engine death"):
            return
        self.serving = True  # the traceback that follows is the root cause
        report.engine_dead = True
        if report.engine_death is None:
            report.engine_death = {"line": line, "after_ready": report.ready, "root_cause": None}
            report.evidence["engine_death"] = line
        self._error("engine_dead", line)

    def _on_traceback(self, line: str) -> None:
        """A traceback while serving is an error; one during start-up is kept as the start's root cause
        (the first one: the wrappers that re-raise it come after), reported only if the start never became
        ready (`finish`), since a start may log a traceback it recovers from."""
        if "Traceback (most recent call last)" not in line:
            return
        if self.serving:
            self.traceback = [line, 0, True]
        elif self.report.start_exception is None and " WARNING " not in line:
            # a traceback logged as a WARNING (a kernel probe falling back) is not why a start fails
            self.traceback = [line, 0, False]

    def _start_exception(self, line: str, values: dict[str, Any]) -> None:
        if self.stopping:
            return
        self.report.start_exception = {**values, "line": line}
        # huggingface_hub's validation error names its cause on the next, indented line; pydantic's
        # "1 validation error for VllmConfig" on the next one or two (a field name, then "Value error, ...")
        pydantic = values["exception"] == "ValidationError" and "validation error" in values["message"]
        self.start_detail = 2 if pydantic else 1 if values["message"].endswith(":") else 0

    def _start_detail(self, line: str) -> None:
        detail = _LEVEL_PREFIX.sub("", line, count=1)
        if detail[:1] not in (" ", "\t") or not detail.strip() or "For further information visit" in detail:
            self.start_detail = 0
            return
        self.start_detail -= 1
        exception = self.report.start_exception
        text = _PYDANTIC_INPUT.sub("", detail.strip())
        exception["message"] = f"{exception['message']} {text}"
        if text.startswith("Value error,"):
            self.start_detail = 0

    def _on_stop(self, line: str) -> None:
        """A deliberate stop: vLLM's SIGINT/SIGTERM handlers (0.26: launcher.py "[shutdown] API server:
        shutdown triggered", core.py "[shutdown] EngineCore: trigger received signal=SIGINT"), or uvicorn's
        "Shutting down", which it also prints when vLLM stops it after an engine death (logged first)."""
        match = _STOP_SIGNAL.search(line)
        level = 2 if match else 1 if _UVICORN_STOP.search(line) else 0
        if not level:
            return
        report = self.report
        if report.stop is None or level > self.stopping:
            ignored = report.stop["ignored"] if report.stop else {}
            report.stop = {"line": line, "signal": None, "after_ready": report.ready, "ignored": ignored}
            report.evidence["stop"] = line
        self.stopping = max(self.stopping, level)
        if match and match.group("sig"):
            report.stop["signal"] = match.group("sig")

    def _stop_noise(self, kind: str, exception: str) -> bool:
        """Whether this error line is what a deliberate stop prints (counted in `stop.ignored`, not an error).

        After a signal handler's line, the engine client's EngineDeadError ("AsyncLLM output_handler failed",
        the engine was told to exit) and any traceback are the stop's own; after uvicorn's line alone only
        the asyncio cancellation of its tasks (CancelledError, KeyboardInterrupt) is."""
        if not self.stopping or (self.stopping == 1 and exception not in _STOP_EXCEPTIONS):
            return False
        ignored = self.report.stop["ignored"] if self.report.stop else {}
        ignored[kind] = ignored.get(kind, 0) + 1
        return True

    def _on_http_5xx(self, line: str) -> None:
        match = _HTTP_5XX.search(line)
        if match:
            self._error(
                "http_server_error",
                line,
                {
                    "status": int(match.group("status")),
                    "method": match.group("method"),
                    "path": match.group("path"),
                },
            )


def _maxlen_values(error: LogError, whole: str) -> None:
    found = _MAXLEN_VALUES.search(whole)
    if found:
        error.values = {
            "max_model_len": int(found.group("len")),
            "needed_gib": float(found.group("need")),
            "available_gib": float(found.group("avail")),
            "estimated_max_model_len": int(found.group("est")) if found.group("est") else None,
        }
    found = _MAXLEN_V0_VALUES.search(whole)
    if found:
        error.values = {"max_model_len": int(found.group("len")), "kv_cache_tokens": int(found.group("cap"))}


def _setting_handler(name: str, patterns: tuple[Any, ...]) -> Callable[[LogParser, str], None]:
    """The handler of one setting: `settings[name]` = the first of its patterns that matches the line (each
    setting is its own handler, so the needle automaton picks exactly the settings a line holds)."""

    def on_setting(parser: LogParser, line: str) -> None:
        for pattern in patterns:
            match = pattern.search(line)
            if match:
                parser.report.settings[name] = _number(match.group("v"))
                parser.report.evidence[f"settings.{name}"] = line
                return

    on_setting.__name__ = on_setting.__qualname__ = f"_on_setting_{name}"
    return on_setting


# (literal substrings, handler): a handler runs when the raw line holds one of its substrings. Every regex the
# handler uses needs one of them to match, so the prefilter never hides a line the regex would have found.
_HANDLERS: tuple[tuple[tuple[str, ...], Callable[[LogParser, str], None]], ...] = (
    (("version", "LLM engine (v"), LogParser._on_version),
    (("KV cache size:", " blocks: ", "Maximum concurrency for"), LogParser._on_kv_report),
    (("Available KV cache memory", "kv_cache_size=", "KV Cache", "for KV cache"), LogParser._on_available),
    (("kv_cache_dtype", "to store kv cache"), LogParser._on_kv_dtype),
    (("max_seq_len=", "'max_model_len'", "Using max model len"), LogParser._on_max_len),
    (("parallel_size",), LogParser._on_parallel),
    *((needles, _setting_handler(name, patterns)) for name, needles, patterns in _SETTING_PATTERNS),
    (("backend",), LogParser._on_backend),
    (
        ("Custom allreduce", "-reduce", "-Reduce", "-REDUCE", "disable_custom_all_reduce"),
        LogParser._on_all_reduce,
    ),
    (
        ("Binding ", "CPU affinity is already", "lacks permission to set NUMA", "numactl --show"),
        LogParser._on_numa,
    ),
    (("Application startup complete", "Starting vLLM", "Uvicorn running on"), LogParser._on_ready),
    (("SpecDecoding metrics:", "Speculative metrics:"), LogParser._on_spec),
    (("Avg prompt throughput",), LogParser._on_stats),
    (("Prefix cache hit rate: GPU:",), LogParser._on_prefix_v0),
    (
        (
            "connector with name:",
            "offloading spec with name:",
            "CPU tensors",
            "pinned tensor",
            "KV Transfer metrics:",
            "cpu_bytes_to_use",
            "kv_connector=",
        ),
        LogParser._on_offload,
    ),
    (tuple(needle for _, needles, _ in _ERROR_TABLE for needle in needles), LogParser._on_fatal),
    (_DEATH_NEEDLES, LogParser._on_engine_death),
    (("Traceback (most recent call last)",), LogParser._on_traceback),
    (
        ("[shutdown] API server: shutdown triggered", "trigger received signal=", "Shutting down"),
        LogParser._on_stop,
    ),
    (('HTTP/1.1" 5',), LogParser._on_http_5xx),
)
# One Aho-Corasick automaton of every needle above (ahocorasick_rs, the Rust `aho-corasick` crate): one pass
# over a block finds every occurrence of every needle, instead of one `str.find` pass per needle or gate.
_NEEDLES = tuple(dict.fromkeys(needle for needles, _ in _HANDLERS for needle in needles))
_NEEDLE_BITS = tuple(
    sum(1 << bit for bit, (needles, _) in enumerate(_HANDLERS) if needle in needles) for needle in _NEEDLES
)
_MATCHER = ahocorasick_rs.AhoCorasick(_NEEDLES, implementation=ahocorasick_rs.Implementation.DFA)


class _MaskHandlers(dict):
    """handler bit mask -> the handlers its bits name, in `_HANDLERS` order."""

    def __missing__(self, mask: int) -> tuple[Callable[[LogParser, str], None], ...]:
        handlers = tuple(handler for bit, (_, handler) in enumerate(_HANDLERS) if mask >> bit & 1)
        self[mask] = handlers
        return handlers


_MASK_HANDLERS = _MaskHandlers()  # at most one entry per distinct mask a line produces (a few dozen)
_STATS_MASK = next(1 << bit for bit, (_, handler) in enumerate(_HANDLERS) if handler is LogParser._on_stats)
BLOCK_CHARS = 1 << 20  # characters read per block (whole lines)


def _line_masks(block: str) -> tuple[list[int], list[int], list[int]]:
    """(starts, ends, handler masks) of the block's lines that hold a needle, in order; a line's mask has the
    bit of every handler one of whose needles the line holds (overlapping matches: every needle is seen)."""
    find, rfind = block.find, block.rfind
    starts: list[int] = []
    ends: list[int] = []
    masks: list[int] = []
    line_end = -1
    for index, start, end in _MATCHER.find_matches_as_indexes(block, overlapping=True):
        # Matches come in the order of their ends and no needle holds a newline: a match that ends past the
        # current line is on a later one.
        if end > line_end:
            line_end = find("\n", end)
            if line_end == -1:
                line_end = len(block)
            starts.append(rfind("\n", 0, start) + 1)
            ends.append(line_end)
            masks.append(_NEEDLE_BITS[index])
        else:
            masks[-1] |= _NEEDLE_BITS[index]
    return starts, ends, masks


def parse_lines(lines: Iterable[str]) -> LogReport:
    """Everything vLLM's output says about an instance, in one pass; the last value wins where one repeats."""
    parser = LogParser()
    batch: list[str] = []
    size = 0
    for raw in lines:
        batch.append(raw if raw.endswith("\n") else raw + "\n")
        size += len(raw)
        if size >= BLOCK_CHARS:
            parser.feed_block("".join(batch))
            batch, size = [], 0
    parser.feed_block("".join(batch))
    return parser.finish()


def parse_log(text: str) -> LogReport:
    """`parse_lines` over a text (any newline convention)."""
    return parse_stream(io.StringIO(text, newline=None))


def parse_stream(handle: TextIO) -> LogReport:
    """A text stream read block by block (BLOCK_CHARS at a time, cut at a line end): memory stays flat."""
    parser = LogParser()
    rest = ""
    while True:
        chunk = handle.read(BLOCK_CHARS)
        if not chunk:
            break
        chunk = rest + chunk
        cut = chunk.rfind("\n") + 1
        if cut == 0:
            rest = chunk
            continue
        parser.feed_block(chunk[:cut])
        rest = chunk[cut:]
    parser.feed_block(rest)
    return parser.finish()


def parse_file(path: str | Path) -> LogReport:
    """`parse_stream` over a file (undecodable bytes replaced)."""
    with open(path, encoding="utf-8", errors="replace", newline=None) as handle:
        return parse_stream(handle)


_EXPECTATION_KEYS = (
    "kv_cache_tokens",
    "kv_tokens_tolerance",
    "max_concurrency",
    "max_model_len",
    "kv_cache_dtype",
    "attention_backend",
    "custom_all_reduce_disabled",
    "numa_nodes",
    "ready",
    "no_errors",
    "kv_offload_cpu_bytes",
)


def _compare(
    name: str,
    expected: Any,
    seen: Any,
    line: str | None,
    what: str,
    verdict: Callable[[Any], tuple[bool, str]],
) -> Check:
    """One check: failed with 'no line shows ...' when the log is silent, else `verdict(seen)`."""
    if seen is None:
        return Check(name, False, expected, None, None, f"the log has no line that shows {what}")
    ok, detail = verdict(seen)
    return Check(name, ok, expected, seen, line, detail)


def check_log(report: LogReport, expectations: dict[str, Any]) -> list[Check]:
    """Named checks of the report against the plan's expectations, in the order of the keys above."""
    unknown = sorted(set(expectations) - set(_EXPECTATION_KEYS))
    if unknown:
        raise FleetInputError(
            f"log expectations: unknown key(s) {', '.join(unknown)}; known keys are "
            f"{', '.join(_EXPECTATION_KEYS)}"
        )
    tolerance = float(expectations.get("kv_tokens_tolerance", 0.02))
    if not 0 <= tolerance < 1:
        raise FleetInputError(
            f"kv_tokens_tolerance: {tolerance} must be a fraction between 0 and 1 (e.g. 0.02)"
        )
    checks: list[Check] = []
    ev = report.evidence

    if "kv_cache_tokens" in expectations:
        tokens = int(expectations["kv_cache_tokens"])
        if report.kv_cache_tokens is None and report.gpu_blocks is not None:
            checks.append(
                Check(
                    "kv_cache_tokens",
                    False,
                    tokens,
                    None,
                    ev.get("gpu_blocks"),
                    "this vLLM prints blocks, not tokens; compare gpu_blocks × block_size",
                )
            )
        else:

            def tokens_verdict(seen: int) -> tuple[bool, str]:
                off = abs(seen - tokens) / tokens if tokens else float(seen != 0)
                return off <= tolerance, (
                    f"{seen:,} tokens vs planned {tokens:,} ({off:.2%} off, tolerance {tolerance:.0%})"
                )

            checks.append(
                _compare(
                    "kv_cache_tokens",
                    tokens,
                    report.kv_cache_tokens,
                    ev.get("kv_cache_tokens"),
                    "the KV cache size",
                    tokens_verdict,
                )
            )
    if "max_concurrency" in expectations:
        times = float(expectations["max_concurrency"])
        allowed = max(0.01, tolerance * times)
        checks.append(
            _compare(
                "max_concurrency",
                times,
                report.max_concurrency,
                ev.get("max_concurrency"),
                "the maximum concurrency",
                lambda seen: (
                    abs(seen - times) <= allowed + 1e-9,
                    f"{seen:.2f}x vs planned {times:.2f}x (allowed ±{allowed:.2f})",
                ),
            )
        )
    if "max_model_len" in expectations:
        length = int(expectations["max_model_len"])
        checks.append(
            _compare(
                "max_model_len",
                length,
                report.concurrency_max_model_len or report.max_model_len,
                ev.get("concurrency_max_model_len") or ev.get("max_model_len"),
                "the max model length",
                lambda seen: (seen == length, f"vLLM runs with max_model_len {seen:,} (planned {length:,})"),
            )
        )
    if "kv_cache_dtype" in expectations:
        dtype = str(expectations["kv_cache_dtype"])
        checks.append(
            _compare(
                "kv_cache_dtype",
                dtype,
                report.kv_cache_dtype,
                ev.get("kv_cache_dtype"),
                "the kv-cache dtype in effect",
                lambda seen: (
                    canonical_kv_dtype(seen) == canonical_kv_dtype(dtype),
                    f"kv cache stored as {seen} (planned {dtype}; fp8 = fp8_e4m3 on CUDA)",
                ),
            )
        )
    if "attention_backend" in expectations:
        backend = canonical_backend(str(expectations["attention_backend"]))
        checks.append(
            _compare(
                "attention_backend",
                backend,
                report.attention_backend,
                ev.get("attention_backend"),
                "the attention backend",
                lambda seen: (seen == backend, f"attention backend {seen} (planned {backend})"),
            )
        )
    if "custom_all_reduce_disabled" in expectations:
        disabled = bool(expectations["custom_all_reduce_disabled"])
        reason = report.custom_all_reduce_disabled_reason
        checks.append(
            _compare(
                "custom_all_reduce_disabled",
                disabled,
                report.custom_all_reduce_disabled,
                ev.get("custom_all_reduce_disabled"),
                "the custom all-reduce state",
                lambda seen: (
                    seen == disabled,
                    f"custom all-reduce {'disabled' if seen else 'enabled'}"
                    + (f" ({reason})" if reason else ""),
                ),
            )
        )
    if "numa_nodes" in expectations:
        nodes = sorted(int(n) for n in expectations["numa_nodes"])
        if not report.numa_nodes:
            detail = "no 'Binding ... to NUMA node' line"
            if report.numa_auto_binding_skipped:
                detail += f"; vLLM says: {report.numa_auto_binding_skipped}"
            checks.append(Check("numa_nodes", False, nodes, [], ev.get("numa_auto_binding_skipped"), detail))
        else:
            checks.append(
                Check(
                    "numa_nodes",
                    report.numa_nodes == nodes,
                    nodes,
                    report.numa_nodes,
                    ev.get("numa_nodes"),
                    f"vLLM bound its processes to NUMA node(s) {report.numa_nodes} (planned {nodes})",
                )
            )
    if "ready" in expectations:
        ready = bool(expectations["ready"])
        alive = report.ready and not report.engine_dead
        if report.engine_dead:
            death = report.engine_death or {}
            cause = death.get("root_cause") or {}
            detail = "the engine died" + (" after the server announced it is ready" if report.ready else "")
            if cause:
                detail += f" ({cause.get('exception')}: {cause.get('message')})"
            line = death.get("line")
        else:
            detail = "the server announced it is ready" if report.ready else "no readiness line"
            line = ev.get("ready")
        checks.append(Check("ready", alive == ready, ready, alive, line, detail))
    if expectations.get("no_errors"):
        first = report.errors[0] if report.errors else None
        checks.append(
            Check(
                "no_errors",
                first is None,
                [],
                [e.kind for e in report.errors],
                first.line if first else None,
                "no fatal error line"
                if first is None
                else f"{len(report.errors)} fatal error line(s), first: {first.kind}",
            )
        )
    if "kv_offload_cpu_bytes" in expectations:
        checks.append(_offload_check(report, int(expectations["kv_offload_cpu_bytes"])))
    return checks


def _offload_check(report: LogReport, planned: int) -> Check:
    """The CPU tier the plan asked for is in effect: OffloadingConnector + CPUOffloadingSpec created, the
    configured `cpu_bytes_to_use` equal to the plan's when the log prints it (0 planned: no tier at all)."""
    offload = report.kv_offload or {}
    ev = report.evidence
    connector, spec = offload.get("connector"), offload.get("spec")
    if planned == 0:
        ok = connector is None
        return Check(
            "kv_offload_cpu_bytes",
            ok,
            0,
            offload.get("cpu_bytes_configured"),
            ev.get("kv_offload.connector"),
            "no KV connector created"
            if ok
            else f"vLLM created the {connector} connector, the plan has no CPU tier",
        )
    seen = offload.get("cpu_bytes_configured")
    problems = []
    if connector != "OffloadingConnector":
        problems.append(f"connector {connector or 'not created'} (planned OffloadingConnector)")
    if spec != "CPUOffloadingSpec":
        problems.append(f"offloading spec {spec or 'not created'} (planned CPUOffloadingSpec)")
    if seen is not None and seen != planned:
        problems.append(f"cpu_bytes_to_use {seen:,} (planned {planned:,})")
    if problems:
        detail = "; ".join(problems)
    else:
        detail = f"OffloadingConnector with CPUOffloadingSpec, cpu_bytes_to_use {planned:,}" + (
            "" if seen is not None else " (the log does not print the bytes)"
        )
        intervals = offload.get("transfer_intervals", 0)
        detail += f", {intervals} KV Transfer metrics line(s)"
    line = (
        ev.get("kv_offload.spec")
        or ev.get("kv_offload.connector")
        or ev.get("kv_offload.cpu_bytes_configured")
    )
    return Check("kv_offload_cpu_bytes", not problems, planned, seen, line, detail)
