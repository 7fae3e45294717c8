"""`vllm-fleet logcheck FILE`: what a vLLM log says, and checks against expectations (DESIGN §4).

Exit status: 0 when every requested check passes (or none was requested), 1 when a check fails, 2 when an
input is unusable (unreadable file, bad flag value). FILE may be `-` for standard input, and may carry any
surrounding text (a pasted issue, `journalctl -u ...` output).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from vllm_fleet.cli import emit
from vllm_fleet.errors import FleetInputError
from vllm_fleet.sizes import parse_human_int
from vllm_fleet.verify.logcheck import MAX_LINE_CHARS, Check, LogReport, check_log, parse_file, parse_stream


def _expectations(args: argparse.Namespace) -> dict[str, Any]:
    expected: dict[str, Any] = {}
    if args.expect_kv_tokens is not None:
        expected["kv_cache_tokens"] = parse_human_int(args.expect_kv_tokens, "--expect-kv-tokens")
    if args.tolerance is not None:
        try:
            expected["kv_tokens_tolerance"] = float(args.tolerance)
        except ValueError as exc:
            raise FleetInputError(f"--tolerance: {args.tolerance!r} is not a fraction such as 0.02") from exc
    if args.expect_concurrency is not None:
        try:
            expected["max_concurrency"] = float(args.expect_concurrency.rstrip("x"))
        except ValueError as exc:
            raise FleetInputError(
                f"--expect-concurrency: {args.expect_concurrency!r} is not a number"
            ) from exc
    if args.expect_max_model_len is not None:
        expected["max_model_len"] = parse_human_int(args.expect_max_model_len, "--expect-max-model-len")
    if args.expect_kv_dtype is not None:
        expected["kv_cache_dtype"] = args.expect_kv_dtype
    if args.expect_backend is not None:
        expected["attention_backend"] = args.expect_backend
    if args.expect_custom_all_reduce is not None:
        expected["custom_all_reduce_disabled"] = args.expect_custom_all_reduce == "disabled"
    if args.expect_numa_nodes is not None:
        try:
            expected["numa_nodes"] = [int(n) for n in args.expect_numa_nodes.split(",") if n.strip()]
        except ValueError as exc:
            raise FleetInputError(
                f"--expect-numa-nodes: {args.expect_numa_nodes!r} is not a comma-separated list of node ids"
            ) from exc
    if args.expect_ready:
        expected["ready"] = True
    if args.expect_no_errors:
        expected["no_errors"] = True
    if args.expect_kv_offload_cpu_bytes is not None:
        expected["kv_offload_cpu_bytes"] = parse_human_int(
            args.expect_kv_offload_cpu_bytes, "--expect-kv-offload-cpu-bytes"
        )
    return expected


def show(value: Any) -> str:
    """A value for the human report: `-` when unknown, thousands separators for counts."""
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _all_reduce(report: LogReport) -> str:
    if report.custom_all_reduce_disabled is None:
        return "-"
    if not report.custom_all_reduce_disabled:
        return "enabled"
    reason = report.custom_all_reduce_disabled_reason
    return f"disabled ({reason})" if reason else "disabled"


def format_report(report: LogReport, checks: list[Check]) -> str:
    """The human-readable report of `vllm-fleet logcheck`."""

    rows = [
        f"version               {show(report.version)}",
        f"KV cache tokens       {show(report.kv_cache_tokens)}"
        + (f" ({report.kv_cache_device})" if report.kv_cache_device else ""),
        f"max concurrency       {show(report.max_concurrency)}x at "
        f"{show(report.concurrency_max_model_len)} tokens"
        if report.max_concurrency is not None
        else "max concurrency       -",
    ]
    if report.gpu_blocks is not None:
        rows.append(f"GPU blocks            {show(report.gpu_blocks)} (CPU blocks {show(report.cpu_blocks)})")
    rows += [
        f"available KV memory   {show(report.available_kv_cache_gib)} GiB",
        f"kv-cache dtype        {show(report.kv_cache_dtype)}",
        f"attention backend     {show(report.attention_backend)}",
        f"custom all-reduce     {_all_reduce(report)}",
        f"NUMA nodes bound      {report.numa_nodes or '-'}",
        f"ready                 {'yes' if report.ready else 'no'}",
    ]
    if report.lines_cut:
        rows.append(
            f"long lines cut        {report.lines_cut} line(s) over {MAX_LINE_CHARS:,} characters, read up "
            "to there"
        )
    if report.engine_dead:
        death = report.engine_death or {}
        cause = death.get("root_cause")
        rows.append(
            f"engine died          {' after readiness' if death.get('after_ready') else ''}: "
            f"{str(death.get('line', '')).strip()}"
            + (f" (root cause {cause['exception']}: {cause['message']})" if cause else "")
        )
    if report.kv_offload:
        offload = report.kv_offload
        rows.append(
            f"KV offload            connector {show(offload.get('connector'))}, "
            f"spec {show(offload.get('spec'))}, "
            f"cpu_bytes_to_use {show(offload.get('cpu_bytes_configured'))}, CPU tensors "
            f"{show(offload.get('cpu_tensors'))}, {offload.get('transfer_intervals', 0)} transfer interval(s)"
        )
    if report.spec_decode:
        spec = report.spec_decode
        rows.append(
            f"spec decode           mean acceptance length {show(spec.get('mean_acceptance_length'))}, "
            f"draft acceptance {show(spec.get('avg_draft_acceptance_rate'))}%, per position "
            f"{spec.get('per_position')}"
        )
    if report.stats:
        stats = report.stats
        rows.append(
            f"last stats            {show(stats.get('running'))} running, {show(stats.get('waiting'))} "
            f"waiting, "
            f"KV usage {show(stats.get('kv_cache_usage_percent'))}%, prefix hits "
            f"{show(stats.get('prefix_cache_hit_rate_percent'))}%"
        )
    if report.settings:
        rows.append("settings              " + ", ".join(f"{k}={v}" for k, v in report.settings.items()))
    rows.extend(f"ERROR {error.kind}: {error.line.strip()}" for error in report.errors)
    rows.extend(f"{'PASS' if c.ok else 'FAIL'} {c.name}: {c.detail}" for c in checks)
    return "\n".join(rows)


def _handle(args: argparse.Namespace) -> int:
    if args.file == "-":
        report = parse_stream(sys.stdin)
    else:
        try:  # streamed: a journal of any size in flat memory
            report = parse_file(args.file)
        except OSError as exc:
            raise FleetInputError(f"logcheck FILE: cannot read {args.file!r}: {exc.strerror}") from exc
    checks = check_log(report, _expectations(args))
    result = report.to_dict()
    result.pop("evidence", None)
    result["errors"] = [{"kind": e.kind, "line": e.line, "values": e.values} for e in report.errors]
    result["checks"] = [c.to_dict() for c in checks]
    emit(result, args.json, format_report(report, checks))
    return 1 if any(not c.ok for c in checks) else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "logcheck",
        help="read a vLLM log and check it against expectations",
        description=(
            "Parse vLLM's startup and serving output (0.2 to 0.33; any prefixes, colours, journald) and "
            "print "
            "the KV cache size, concurrency, kv-cache dtype, attention backend, custom all-reduce state, "
            "NUMA "
            "binding, readiness, speculative-decoding and periodic stats, the KV offload tier, an engine "
            "that died while serving, and fatal errors. With --expect-* "
            "flags, exit 1 when a check fails."
        ),
    )
    parser.add_argument("file", metavar="FILE", help="the log (or - for standard input)")
    parser.add_argument("--expect-kv-tokens", metavar="N", help="planned GPU KV cache tokens")
    parser.add_argument("--tolerance", metavar="F", help="allowed fraction off for tokens (default 0.02)")
    parser.add_argument("--expect-concurrency", metavar="X", help="planned maximum concurrency")
    parser.add_argument("--expect-max-model-len", metavar="L")
    parser.add_argument("--expect-kv-dtype", metavar="D", help="fp8 and fp8_e4m3 are the same on CUDA")
    parser.add_argument("--expect-backend", metavar="B", help="FLASH_ATTN, FLASHINFER, TRITON_ATTN, ...")
    parser.add_argument("--expect-custom-all-reduce", choices=("disabled", "enabled"))
    parser.add_argument("--expect-numa-nodes", metavar="LIST", help="e.g. 0 or 0,1")
    parser.add_argument(
        "--expect-ready", action="store_true", help="the server must have announced readiness"
    )
    parser.add_argument("--expect-no-errors", action="store_true", help="no fatal error line allowed")
    parser.add_argument(
        "--expect-kv-offload-cpu-bytes",
        metavar="BYTES",
        help="planned CPU KV tier (OffloadingConnector + CPUOffloadingSpec, cpu_bytes_to_use); 0 = none",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_handle)
