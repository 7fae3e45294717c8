"""Named checks of a `LogReport` against the plan's expectations (`check_log`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from vllm_fleet.errors import FleetInputError
from vllm_fleet.verify.logcheck.lines import canonical_backend, canonical_kv_dtype
from vllm_fleet.verify.logcheck.records import LogReport


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


EXPECTATION_KEYS = (
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
    "world_size",
    "pp_ranks",
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


def world_checks(report: LogReport, expectations: dict[str, Any]) -> list[Check]:
    """The distributed world as planned: every worker of this log in a world of `world_size` (TP x PP), and
    its workers holding this host's pipeline stages `pp_ranks` (a rank of a multi-host instance: its own)."""
    checks: list[Check] = []
    workers = report.worker_ranks
    line = workers[0]["line"] if workers else None
    if "world_size" in expectations:
        size = int(expectations["world_size"])
        seen = sorted({w["world_size"] for w in workers})
        checks.append(
            Check(
                "world_size",
                bool(workers) and seen == [size],
                size,
                seen,
                line,
                f"workers in a world of {', '.join(map(str, seen))} (planned {size})"
                if workers
                else "no 'rank R in world size N' line: no worker of this log joined the world",
            )
        )
    if "pp_ranks" in expectations:
        # vLLM 0.32.0 logs the line of a host's first worker only (real logs: one line per start, whatever
        # the local world), so the check is that what the log shows is among this host's planned stages
        planned = sorted(int(n) for n in expectations["pp_ranks"])
        seen = sorted({w["pp_rank"] for w in workers if w["pp_rank"] is not None})
        foreign = [n for n in seen if n not in planned]
        detail = f"this log's workers hold pipeline stage(s) {seen} (planned {planned})"
        if not seen:
            detail = "no 'rank R in world size N ... PP rank P' line: no worker of this log joined a stage"
        elif foreign:
            detail += f"; stage(s) {foreign} belong to another host: the ranks are not as planned"
        checks.append(Check("pp_ranks", bool(seen) and not foreign, planned, seen, line, detail))
    return checks


def check_log(report: LogReport, expectations: dict[str, Any]) -> list[Check]:
    """Named checks of the report against the plan's expectations, in the order of the keys above."""
    unknown = sorted(set(expectations) - set(EXPECTATION_KEYS))
    if unknown:
        raise FleetInputError(
            f"log expectations: unknown key(s) {', '.join(unknown)}; known keys are "
            f"{', '.join(EXPECTATION_KEYS)}"
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
    checks.extend(world_checks(report, expectations))
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
