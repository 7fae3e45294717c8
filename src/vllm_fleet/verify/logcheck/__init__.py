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

The package: `patterns` (the tables of text vLLM prints), `lines` (one line's text to values), `records` (the
report's dataclasses), `parser` (the streaming pass), `checks` (the report against the plan).
"""

from vllm_fleet.verify.logcheck.checks import EXPECTATION_KEYS, Check, check_log
from vllm_fleet.verify.logcheck.lines import canonical_backend, canonical_kv_dtype, clean_line
from vllm_fleet.verify.logcheck.parser import (
    BLOCK_CHARS,
    LogParser,
    parse_file,
    parse_lines,
    parse_log,
    parse_stream,
)
from vllm_fleet.verify.logcheck.records import (
    ERRORS_PER_KIND,
    HISTORY_LIMIT,
    MAX_LINE_CHARS,
    KvCacheReport,
    LogError,
    LogReport,
)

__all__ = [
    "BLOCK_CHARS",
    "ERRORS_PER_KIND",
    "EXPECTATION_KEYS",
    "HISTORY_LIMIT",
    "MAX_LINE_CHARS",
    "Check",
    "KvCacheReport",
    "LogError",
    "LogParser",
    "LogReport",
    "canonical_backend",
    "canonical_kv_dtype",
    "check_log",
    "clean_line",
    "parse_file",
    "parse_lines",
    "parse_log",
    "parse_stream",
]
