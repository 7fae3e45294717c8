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

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_fleet.errors import FleetInputError

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_PROCESS_PREFIX = re.compile(r"^(?:\s*\([\w.-]+(?: rank=\d+)? pid=\d+\)\s?|\s*\[Stage-\d+\]\s?)+")
_JOURNAL_PREFIX = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [\w.@-]+(?:\[\d+\])?: ")
_CONTINUATION_START = re.compile(r"^(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\b|^\s*(?:File |Traceback|\[|\()")

# --- version ---------------------------------------------------------------------------------------------
_VERSION_PATTERNS = (
    re.compile(r"vLLM (?:API )?server version v?(?P<v>\d+\.\d+[\w.+-]*)"),
    re.compile(r"Initializing an? (?:V1 )?LLM engine \(v(?P<v>\d+\.\d+[\w.+-]*)\)"),
    re.compile(r"[\u2580-\u259f].*\bversion\s+v?(?P<v>\d+\.\d+\.\d+[\w.+-]*)"),
)
# --- KV cache size
_KV_TOKENS = re.compile(r"(?P<dev>GPU \+ host|[A-Z]{2,5}) KV cache size: (?P<tokens>[\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<x>[\d.]+)x")
_BLOCKS = re.compile(
    r"(?:^|[^\w])(?:# )?(?P<dev>GPU|cuda|CUDA|gpu) blocks: (?P<gpu>\d+)(?:, # CPU blocks: (?P<cpu>\d+))?"
)
_AVAILABLE = (
    re.compile(r"Available KV cache memory: (?P<gib>-?[\d.]+) GiB"),
    re.compile(r"kv_cache_size=(?P<gib>-?[\d.]+)GiB"),
    re.compile(r"reserved for KV Cache is (?P<gib>-?[\d.]+) ?GiB"),
    re.compile(r"reserved (?P<gib>-?[\d.]+) ?GiB memory for KV Cache as specified by kv_cache_memory_bytes"),
    re.compile(r"Explicitly set \((?P<gib>[\d.]+)/[\d.]+\) GiB for KV cache"),
)
# --- configuration in effect --------------------------------------------------------------------------------
_KV_DTYPE_CONFIG = re.compile(r"\bkv_cache_dtype=(?P<d>[\w]+)")
_KV_DTYPE_ARGS = re.compile(r"'kv_cache_dtype': '(?P<d>[\w]+)'")
_KV_DTYPE_USING = re.compile(r"Using (?P<d>[\w]+) data type to store kv cache")
_MAX_SEQ_LEN = re.compile(
    r"\bmax_seq_len=(?P<n>\d+)|'max_model_len': (?P<a>\d+)|Using max model len (?P<u>\d+)"
)
_TP = re.compile(r"\btensor_parallel_size=(?P<n>\d+)|'tensor_parallel_size': (?P<a>\d+)")
_DISABLE_CAR = re.compile(
    r"\bdisable_custom_all_reduce=(?P<v>True|False)|'disable_custom_all_reduce': (?P<a>True|False)"
)
# --- other settings and figures in effect: settings[name] = the last value seen ---------------------------
_SETTINGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "max_num_batched_tokens",
        (r"\bmax_num_batched_tokens=(?P<v>\d+)", r"'max_num_batched_tokens': (?P<v>\d+)"),
    ),
    ("max_num_seqs", (r"\bmax_num_seqs=(?P<v>\d+)", r"'max_num_seqs': (?P<v>\d+)")),
    ("model_dtype", (r"\bdtype=torch\.(?P<v>\w+)", r"'dtype': '(?P<v>\w+)'")),
    ("quantization", (r"\bquantization=(?P<v>\w+)", r"'quantization': '(?P<v>\w+)'")),
    ("architecture", (r"Resolved architecture: (?P<v>\w+)",)),
    ("speculative_method", (r"SpeculativeConfig\(method='(?P<v>\w+)'",)),
    ("num_speculative_tokens", (r"\bnum_spec_tokens=(?P<v>\d+)", r"'num_speculative_tokens': (?P<v>\d+)")),
    (
        "gpu_memory_utilization",
        (
            r"\bgpu_memory_utilization[=: ]+\(?(?P<v>\d+(?:\.\d+)?)",
            r"current --gpu-memory-utilization=(?P<v>\d+(?:\.\d+)?)",
            r"increase --gpu-memory-utilization from (?P<v>\d+(?:\.\d+)?)",
        ),
    ),
    (
        "gpu_memory_utilization_suggested",
        (r"increase --gpu-memory-utilization (?:from [\d.]+ )?to (?P<v>\d+(?:\.\d+)?)",),
    ),
    ("total_gpu_memory_gib", (r"total_gpu_memory[= ]\(?(?P<v>\d+(?:\.\d+)?) ?GiB",)),
    (
        "model_weights_gib",
        (
            r"Model loading took (?P<v>\d+(?:\.\d+)?) ?GiB",
            r"Loading model weights took (?P<v>\d+(?:\.\d+)?) GB",
        ),
    ),
    (
        "model_loading_seconds",
        (r"Model loading took [\d.]+ ?GiB(?: memory)? and (?P<v>\d+(?:\.\d+)?) seconds",),
    ),
    ("cudagraph_memory_gib", (r"Estimated CUDA graph memory: (?P<v>\d+(?:\.\d+)?) GiB",)),
    ("num_gpu_blocks_override", (r"num_gpu_blocks_override=(?P<v>\d+)",)),
    ("num_gpu_blocks", (r"num_gpu_blocks is: (?P<v>\d+)",)),
    ("flash_attention_version", (r"Using FlashAttention version (?P<v>\d+)",)),
)
_SETTING_PATTERNS = tuple((name, tuple(re.compile(p) for p in patterns)) for name, patterns in _SETTINGS)
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
_STATS_FIELDS = {
    "prompt_throughput": re.compile(r"Avg prompt throughput: (?P<v>[\d.]+) tokens/s"),
    "generation_throughput": re.compile(r"Avg generation throughput: (?P<v>[\d.]+) tokens/s"),
    "running": re.compile(r"Running: (?P<v>\d+) reqs"),
    "waiting": re.compile(r"Waiting: (?P<v>\d+) reqs"),
    "swapped": re.compile(r"Swapped: (?P<v>\d+) reqs"),
    "pending": re.compile(r"Pending: (?P<v>\d+) reqs"),
    "preemptions": re.compile(r"Preemptions: (?P<v>\d+)"),
    "kv_cache_usage_percent": re.compile(r"(?:GPU|[A-Z]{2,5}) KV cache usage: (?P<v>[\d.]+)%"),
    "cpu_kv_cache_usage_percent": re.compile(r"CPU KV cache usage: (?P<v>[\d.]+)%"),
    "prefix_cache_hit_rate_percent": re.compile(r"(?<!External )Prefix cache hit rate: (?P<v>[\d.]+)%"),
    "external_prefix_cache_hit_rate_percent": re.compile(r"External prefix cache hit rate: (?P<v>[\d.]+)%"),
}
_PREFIX_V0 = re.compile(r"Prefix cache hit rate: GPU: (?P<gpu>[\d.]+)%, CPU: (?P<cpu>[\d.]+)%")
# --- fatal errors
_ERRORS = (
    (
        "max_model_len_exceeds_kv_cache",
        re.compile(r"To serve at least one request with the models?'s? max seq len"),
    ),
    (
        "max_model_len_exceeds_kv_cache",
        re.compile(
            r"max seq len \(\d+\) is larger than the maximum number of tokens that can be stored in KV cache"
        ),
    ),
    ("no_kv_cache_memory", re.compile(r"No available memory for the cache blocks")),
    ("no_kv_cache_memory", re.compile(r"# (?:cuda|GPU) blocks: 0\b")),
    ("negative_kv_cache_memory", re.compile(r"Available KV cache memory: -\d")),
    ("negative_kv_cache_memory", re.compile(r"reserved for KV Cache is -\d")),
    (
        "insufficient_free_memory",
        re.compile(r"Free memory on device .*? on startup is less than desired GPU memory utilization"),
    ),
    (
        "cuda_oom",
        re.compile(r"CUDA out of memory|OutOfMemoryError|Failed to load model - not enough GPU memory"),
    ),
    ("unrecognized_arguments", re.compile(r"error: unrecognized arguments: (?P<args>.*)$")),
    ("invalid_kv_cache_dtype", re.compile(r"Invalid kv_cache_dtype")),
    (
        "engine_init_failed",
        re.compile(
            r"EngineCore failed to start|Engine core initialization failed|Error executing method "
            r"initialize_cache"
        ),
    ),
)
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


def _number(text: str) -> int | float | str:
    """`2048` -> 2048, `0.90` -> 0.9, anything else stays text."""
    if re.fullmatch(r"\d+", text):
        return int(text)
    if re.fullmatch(r"\d+\.\d*", text):
        return float(text)
    return text


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def clean_line(raw: str) -> str:
    """A log line without colour codes, journald / container prefixes and vLLM process tags."""
    line = _ANSI.sub("", raw).rstrip("\r\n")
    line = _JOURNAL_PREFIX.sub("", line)
    # `journalctl -o short-iso` and container runtimes put an ISO-8601 stamp (and maybe host + unit) first.
    line = re.sub(r"^\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)?\s+(?:\S+ [\w.@-]+\[\d+\]: )?", "", line)
    line = re.sub(r"^[\w.-]+\s+\|\s", "", line)  # docker compose service column
    return _PROCESS_PREFIX.sub("", line)


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
    errors: list[LogError] = field(default_factory=list)
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
    if "Avg prompt throughput" not in line:
        return None
    stats: dict[str, Any] = {}
    for key, pattern in _STATS_FIELDS.items():
        found = pattern.search(line)
        if found:
            value = found.group("v")
            stats[key] = (
                float(value) if "." in value or key.endswith(("percent", "throughput")) else int(value)
            )
    engine = re.search(r"Engine (?P<n>\d+):", line)
    stats["engine"] = int(engine.group("n")) if engine else None
    stats["line"] = line
    return stats


def _car_reason(why: str) -> str:
    for needle, code in _CAR_REASONS:
        if needle in why:
            return code
    return why.strip()


def _set(report: LogReport, name: str, value: Any, line: str) -> None:
    setattr(report, name, value)
    report.evidence[name] = line


def parse_log(text: str) -> LogReport:
    """Everything vLLM's output says about an instance, last value winning where a value repeats."""
    report = LogReport()
    lines = [clean_line(raw) for raw in text.splitlines()]
    dtype_rank = 0  # engine config (3) > "Using ... to store kv cache" (2) > non-default args (1)
    numa_nodes: set[int] = set()
    seen_errors: set[tuple[str, str]] = set()
    current = KvCacheReport()

    for index, line in enumerate(lines):
        if not line:
            continue
        for pattern in _VERSION_PATTERNS:
            match = pattern.search(line)
            if match:
                _set(report, "version", match.group("v"), line)
                break

        tokens = _KV_TOKENS.search(line)
        concurrency = _CONCURRENCY.search(line)
        blocks = _BLOCKS.search(line)
        if tokens:
            if current.tokens is not None or current.gpu_blocks is not None:
                current = KvCacheReport()
            current.tokens, current.device, current.line = (
                _int(tokens.group("tokens")),
                tokens.group("dev"),
                line,
            )
            report.kv_cache_reports.append(current)
            _set(report, "kv_cache_tokens", current.tokens, line)
            _set(report, "kv_cache_device", current.device, line)
        elif blocks and "KV cache" not in line:
            if current.gpu_blocks is not None or current.tokens is not None:
                current = KvCacheReport()
            current.gpu_blocks = int(blocks.group("gpu"))
            current.cpu_blocks = int(blocks.group("cpu")) if blocks.group("cpu") else None
            current.line = line
            report.kv_cache_reports.append(current)
            _set(report, "gpu_blocks", current.gpu_blocks, line)
            if current.cpu_blocks is not None:
                _set(report, "cpu_blocks", current.cpu_blocks, line)
        if concurrency:
            if current.max_concurrency is not None or not report.kv_cache_reports:
                current = KvCacheReport(line=line)
                report.kv_cache_reports.append(current)
            current.max_concurrency = float(concurrency.group("x"))
            current.concurrency_max_model_len = _int(concurrency.group("len"))
            _set(report, "max_concurrency", current.max_concurrency, line)
            _set(report, "concurrency_max_model_len", current.concurrency_max_model_len, line)

        for pattern in _AVAILABLE:
            match = pattern.search(line)
            if match:
                _set(report, "available_kv_cache_gib", float(match.group("gib")), line)
                break

        for pattern, rank in ((_KV_DTYPE_CONFIG, 3), (_KV_DTYPE_USING, 2), (_KV_DTYPE_ARGS, 1)):
            match = pattern.search(line)
            if match and rank >= dtype_rank:
                dtype_rank = rank
                _set(report, "kv_cache_dtype", match.group("d"), line)
                break
        match = _MAX_SEQ_LEN.search(line)
        if match:
            _set(report, "max_model_len", int(match.group("n") or match.group("a") or match.group("u")), line)
        match = _TP.search(line)
        if match:
            _set(report, "tensor_parallel_size", int(match.group("n") or match.group("a")), line)
        for name, patterns in _SETTING_PATTERNS:
            for pattern in patterns:
                match = pattern.search(line)
                if match:
                    report.settings[name] = _number(match.group("v"))
                    report.evidence[f"settings.{name}"] = line
                    break

        for pattern in (_BACKEND_POTENTIAL, _BACKEND_ENUM, _BACKEND_NAME, _BACKEND_WORDS):
            match = pattern.search(line)
            if match:
                _set(report, "attention_backend", canonical_backend(match.group("n")), line)
                break

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
                flag = (match.group("v") or match.group("a")) == "True"
                if flag:
                    _set(report, "custom_all_reduce_disabled", True, line)
                    _set(report, "custom_all_reduce_disabled_reason", "disable_custom_all_reduce=True", line)
                elif report.custom_all_reduce_disabled is None:
                    _set(report, "custom_all_reduce_disabled", False, line)

        match = _NUMA_WORKER.search(line)
        if match:
            binding = {
                "process": "worker",
                "local_rank": int(match.group("rank")),
                "gpu_index": int(match.group("gpu")),
                "nodes": [int(match.group("node"))],
                "cpus": match.group("cpus"),
                "line": line,
            }
            report.numa_bindings.append(binding)
            numa_nodes.add(int(match.group("node")))
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
            numa_nodes.update(nodes)
        match = _NUMA_SKIPPED.search(line)
        if match:
            _set(report, "numa_auto_binding_skipped", match.group("why"), line)

        match = _READY.search(line)
        if match:
            _set(report, "ready", True, line)
            url = match.group("url") or match.group("u2")
            if url:
                report.listen_url = url

        spec = _parse_spec(line)
        if spec:
            report.spec_decode_history.append(spec)
            if spec.get("avg_draft_acceptance_rate") is not None:
                _set(report, "spec_decode", spec, line)
        stats = _parse_stats(line)
        if stats:
            report.stats_history.append(stats)
            _set(report, "stats", stats, line)
            if "prefix_cache_hit_rate_percent" in stats:
                _set(report, "prefix_cache_hit_rate_percent", stats["prefix_cache_hit_rate_percent"], line)
        match = _PREFIX_V0.search(line)
        if match:
            _set(report, "prefix_cache_hit_rate_percent", float(match.group("gpu")), line)

        for kind, pattern in _ERRORS:
            if pattern.search(line) and (kind, line) not in seen_errors:
                seen_errors.add((kind, line))
                values: dict[str, Any] = {}
                if kind == "max_model_len_exceeds_kv_cache":
                    whole = _joined(lines, index)
                    found = _MAXLEN_VALUES.search(whole)
                    if found:
                        values = {
                            "max_model_len": int(found.group("len")),
                            "needed_gib": float(found.group("need")),
                            "available_gib": float(found.group("avail")),
                            "estimated_max_model_len": int(found.group("est"))
                            if found.group("est")
                            else None,
                        }
                    found = _MAXLEN_V0_VALUES.search(whole)
                    if found:
                        values = {
                            "max_model_len": int(found.group("len")),
                            "kv_cache_tokens": int(found.group("cap")),
                        }
                elif kind == "unrecognized_arguments":
                    found = pattern.search(line)
                    values = {"arguments": found.group("args").strip()} if found else {}
                report.errors.append(LogError(kind=kind, line=line, values=values))
                break

    report.numa_nodes = sorted(numa_nodes)
    if report.numa_bindings:
        report.evidence["numa_nodes"] = report.numa_bindings[-1]["line"]
    return report


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
        checks.append(
            Check(
                "ready",
                report.ready == ready,
                ready,
                report.ready,
                ev.get("ready"),
                "the server announced it is ready" if report.ready else "no readiness line",
            )
        )
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
    return checks
