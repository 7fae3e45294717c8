"""The text vLLM prints, as tables: literal needles and the regexes that read values out of a line."""

from __future__ import annotations

import re


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


class _Banner:
    """vLLM's start banner, `▄▄ ... version X.Y.Z`: the last `version` word after the first block character.

    As one regex (`[\u2580-\u259f].*\bversion\\s+...`) `re` tries `.*` from every block character to the end
    of the line: a line of 20,000 block characters took 4.9 s, of 100,000 over two minutes.
    """

    _BLOCK = re.compile(r"[\u2580-\u259f]")
    _VERSION = re.compile(r"version\s+v?(?P<v>\d+\.\d+\.\d+[\w.+-]*)")

    def search(self, line: str) -> re.Match[str] | None:
        block = self._BLOCK.search(line)
        if block is None:
            return None
        end = len(line)
        while (start := line.rfind("version", block.end(), end)) != -1:
            before = line[start - 1]  # start > block.end() - 1 >= 0
            if not (before.isalnum() or before == "_"):  # the regex's \b
                match = self._VERSION.match(line, start)
                if match:
                    return match
            end = start + len("version") - 1
        return None


class _Then:
    """`first.*?then` as a search: the first `first`, then `then` anywhere after it. As one regex `re`
    scans from every `first` to the end of the line: a line of `first` repeated is quadratic."""

    def __init__(self, first: str, then: str) -> None:
        self.first = first
        self.then = re.compile(then)

    def search(self, line: str) -> re.Match[str] | None:
        start = line.find(self.first)
        return None if start == -1 else self.then.search(line, start + len(self.first))


_PROCESS_PREFIX = re.compile(r"^(?:\s*\([\w.-]+(?: rank=\d+)? pid=\d+\)\s?|\s*\[Stage-\d+\]\s?)+")
_JOURNAL_PREFIX = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [\w.@-]+(?:\[\d+\])?: ")
# `journalctl -o short-iso` and container runtimes put an ISO-8601 stamp (and maybe host + unit) first.
_ISO_PREFIX = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)?\s+(?:\S+ [\w.@-]+\[\d+\]: )?")
_COMPOSE_PREFIX = re.compile(r"^[\w.-]+\s+\|\s")
_CONTINUATION_START = re.compile(r"^(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\b|^\s*(?:File |Traceback|\[|\()")

# --- version ---------------------------------------------------------------------------------------------
_VERSION_PATTERNS: tuple[re.Pattern[str] | _Banner, ...] = (
    re.compile(r"vLLM (?:API )?server version v?(?P<v>\d+\.\d+[\w.+-]*)"),
    re.compile(r"Initializing an? (?:V1 )?LLM engine \(v(?P<v>\d+\.\d+[\w.+-]*)\)"),
    _Banner(),
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
# `Using <NAME> backend.` where NAME holds one of _BACKEND_NAME_WORDS after its first letter (`lines.
# backend_name`; as `[A-Z][A-Z0-9_]*(?:ATTN|...)[A-Z0-9_]*` a name of ATTN repeated backtracks quadratically)
_BACKEND_NAME = re.compile(r"Using (?P<n>[A-Z][A-Z0-9_]*) backend\.")
_BACKEND_NAME_WORDS = ("ATTN", "FLASHINFER", "SDPA", "MLA", "ATTENTION", "XFORMERS")
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
# the reason runs to ". To silence" or to the line's end (`lines.car_disabled_reason`)
_CAR_DISABLED = re.compile(r"Custom allreduce is disabled (?:because |due to )")
_CAR_LAUNCHER = re.compile(r"custom all-reduce OFF", re.IGNORECASE)
_CAR_REASONS = (
    ("lacks GPU P2P capability", "no_p2p"),
    ("more than two PCIe-only GPUs", "more_than_two_pcie_gpus"),
    ("unsupported world size", "unsupported_world_size"),
    ("missing custom allreduce library", "missing_library"),
    ("spans across nodes", "spans_nodes"),
)
# --- the distributed world: one line per worker (vllm/distributed/parallel_state.py, 0.11+), e.g.
# `rank 1 in world size 2 is assigned as DP rank 0, PP rank 1, PCP rank 0, TP rank 0, ...` ---
_WORKER_RANK = re.compile(r"rank (?P<rank>\d+) in world size (?P<world>\d+) is assigned as ")
_WORKER_PP_RANK = re.compile(r"\bPP rank (?P<n>\d+)")
_WORKER_TP_RANK = re.compile(r"\bTP rank (?P<n>\d+)")
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
_ERROR_TABLE: tuple[tuple[str, tuple[str, ...], re.Pattern[str] | _Then], ...] = (
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
        _Then("Free memory on device ", r" on startup is less than desired GPU memory utilization"),
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
_PYDANTIC_INPUT = re.compile(r"\[type=\w+, input_value=")  # to the end, with the blanks before it
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
# `k=v, k=v` where a key may hold `:('GPU_to_CPU',)` (0.26's labelled keys) and every value is a number:
# the value after each `=` (lines._transfer_fields)
_TRANSFER_VALUE = re.compile(r"(?P<v>-?[\d.]+(?:e[-+]?\d+)?)(?:, |$)")
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
_INT_TEXT = re.compile(r"\d+")
_FLOAT_TEXT = re.compile(r"\d+\.\d*")
