"""A load-test run's report: the figures the seed judges a deployment by (P99 TTFT, prefix-cache hit rate,
speculative acceptance, under load), failures, throughput; the SLO checks; the table; the tier comparison.

The latency figures are the client's (`vllm bench serve`: every request's TTFT and ITLs, exact percentiles);
the hit rate and acceptance are the servers' (every instance's /metrics, after − before the run, summed over
instances: behind a gateway no single /metrics sees the whole load). A figure that cannot be measured is
None with a reason, never 0: an acceptance of 0 would read as "every draft rejected".
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vllm_fleet.errors import FleetInputError
from vllm_fleet.jsonfile import write_json
from vllm_fleet.loadtest.benchresult import BenchResult, RequestRecord
from vllm_fleet.loadtest.workload import Workload, WorkloadRequest, workload_requests
from vllm_fleet.texttable import fmt, text_table
from vllm_fleet.verify.metrics import MetricsSummary, summarize_metrics

REPORT_KIND = "vllm-fleet-loadtest"
REPORT_VERSION = 1
LATENCY_METRICS = ("ttft", "itl", "tpot", "e2el")
PERCENTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True)
class Slo:
    """Pass marks (None: the figure is reported, not judged)."""

    ttft_p99_max_ms: float | None = None
    failed_max: int = 0
    truncated_max: int = 0
    prefix_hit_rate_min: float | None = None
    spec_acceptance_min: float | None = None


@dataclass(frozen=True)
class SloCheck:
    """One SLO against its figure: the name, the verdict, the mark and the figure (and why it is absent)."""

    name: str
    ok: bool
    mark: str
    seen: Any
    detail: str = ""


def percentile(values: Sequence[float], p: float) -> float | None:
    """numpy's default percentile (linear between closest ranks), the method `vllm bench serve` uses, so a
    mode's P99 and the run's agree; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class ServerFigure:
    """A ratio of counters summed over the instances' /metrics windows, or None and why."""

    value: float | None
    numerator: float | None
    denominator: float | None
    reason: str


def prefix_hit_rate(summaries: Mapping[str, MetricsSummary]) -> ServerFigure:
    """Prefix-cache hit tokens over queried tokens, summed over every instance, over the run."""
    if not summaries:
        return ServerFigure(None, None, None, "no instance /metrics was read")
    off = [
        k
        for k, s in summaries.items()
        if str(s.cache_config.get("enable_prefix_caching", "")).lower() == "false"
    ]
    queries = [s.prefix_cache_queries for s in summaries.values() if s.prefix_cache_queries is not None]
    hits = [s.prefix_cache_hits for s in summaries.values() if s.prefix_cache_hits is not None]
    if len(off) == len(summaries):
        return ServerFigure(
            None, None, None, "prefix caching is off on every instance (vllm:cache_config_info)"
        )
    if not queries or not sum(queries):
        return ServerFigure(None, sum(hits) if hits else None, 0.0, "no prefix-cache queries during the run")
    return ServerFigure(sum(hits) / sum(queries), sum(hits), sum(queries), f"{len(queries)} instance(s)")


def spec_acceptance(summaries: Mapping[str, MetricsSummary]) -> ServerFigure:
    """Accepted draft tokens over proposed draft tokens, summed over every instance, over the run."""
    drafted = [s.spec_draft_tokens for s in summaries.values() if s.spec_draft_tokens is not None]
    accepted = [s.spec_accepted_tokens for s in summaries.values() if s.spec_accepted_tokens is not None]
    if not drafted:
        return ServerFigure(
            None,
            None,
            None,
            "no vllm:spec_decode_* series on any instance: speculative decoding is not on",
        )
    if not sum(drafted):
        return ServerFigure(
            None, sum(accepted), 0.0, "speculative decoding is on but proposed no draft token"
        )
    return ServerFigure(
        sum(accepted) / sum(drafted), sum(accepted), sum(drafted), f"{len(drafted)} instance(s)"
    )


def latency_figures(bench: BenchResult) -> dict[str, dict[str, float | None]]:
    """`{metric: {"p50": ms, "p90": ms, "p99": ms, "mean": ms}}` as `vllm bench serve` computed them."""
    out: dict[str, dict[str, float | None]] = {}
    for metric in LATENCY_METRICS:
        stats = bench.percentiles.get(metric)
        out[metric] = {f"p{int(p)}": (stats.at(p) if stats else None) for p in PERCENTILES}
        out[metric]["mean"] = stats.mean if stats else None
    return out


def mode_figures(
    requests: Sequence[RequestRecord], sent: Sequence[WorkloadRequest]
) -> dict[str, dict[str, Any]]:
    """Per mode (short, long, ...): requests, failures, measured prompt tokens, TTFT percentiles."""
    if len(requests) != len(sent):
        return {}
    modes: dict[str, list[RequestRecord]] = {}
    for record, request in zip(requests, sent, strict=True):
        modes.setdefault(request.mode, []).append(record)
    out = {}
    for name, records in modes.items():
        ok = [r for r in records if not r.failed]
        ttfts = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
        out[name] = {
            "requests": len(records),
            "failed": len(records) - len(ok),
            "input_tokens_p50": percentile([r.input_len for r in records], 50),
            "input_tokens_max": max((r.input_len for r in records), default=None),
            "ttft_ms_p50": percentile(ttfts, 50),
            "ttft_ms_p99": percentile(ttfts, 99),
        }
    return out


def _check_max(
    name: str, seen: float | None, mark: float | None, unit: str = "", reason: str = ""
) -> SloCheck | None:
    if mark is None:
        return None
    if seen is None:
        return SloCheck(name, False, f"<= {mark:g}{unit}", None, reason or "not measured")
    return SloCheck(name, seen <= mark, f"<= {mark:g}{unit}", seen, reason)


def _check_min(name: str, figure: ServerFigure, mark: float | None) -> SloCheck | None:
    if mark is None:
        return None
    if figure.value is None:
        return SloCheck(name, False, f">= {mark:g}", None, figure.reason)
    return SloCheck(
        name,
        figure.value >= mark,
        f">= {mark:g}",
        round(figure.value, 4),
        f"{figure.numerator:g}/{figure.denominator:g}",
    )


def judge(figures: Mapping[str, Any], slo: Slo) -> list[SloCheck]:
    """Every SLO that has a mark, against the report's figures (failed and truncated are always judged)."""
    checks = [
        _check_max("ttft_p99", _ms(figures["ttft_ms"]["p99"]), slo.ttft_p99_max_ms, " ms"),
        _check_max("failed", figures["failed"], slo.failed_max, reason=detail_of(figures.get("errors"))),
        _check_max(
            "truncated", figures["truncated"], slo.truncated_max, reason=figures.get("truncated_reason", "")
        ),
        _check_min(
            "prefix_cache_hit_rate", ServerFigure(**figures["prefix_cache_hit_rate"]), slo.prefix_hit_rate_min
        ),
        _check_min(
            "spec_acceptance_rate", ServerFigure(**figures["spec_acceptance_rate"]), slo.spec_acceptance_min
        ),
    ]
    return [c for c in checks if c is not None]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def detail_of(errors: Mapping[str, int] | None) -> str:
    return "; ".join(f"{n}× {text}" for text, n in (errors or {}).items())


def build_report(
    *,
    name: str,
    target_url: str,
    bench: BenchResult,
    workload: Workload,
    metrics_before: Mapping[str, str],
    metrics_after: Mapping[str, str],
    slo: Slo,
    started: str = "",
) -> dict[str, Any]:
    """The run's report (docs/interfaces.md, "Load-test report"): figures, per-mode figures, per-instance
    /metrics windows, the SLO checks and the verdict."""
    missing = sorted(set(metrics_before) ^ set(metrics_after))
    if missing:
        raise FleetInputError(
            f"/metrics of {missing} was read only before or only after the run; "
            "read every instance both times"
        )
    summaries = {k: summarize_metrics(metrics_after[k], metrics_before[k]) for k in sorted(metrics_after)}
    sent = workload_requests(workload)
    truncated = (
        len(bench.truncated_requests([r.output_tokens for r in sent]))
        if len(bench.requests) == len(sent)
        else None
    )
    figures: dict[str, Any] = {
        **{f"{m}_ms": v for m, v in latency_figures(bench).items()},
        "failed": bench.failed,
        "completed": bench.completed,
        "errors": bench.error_counts(),
        "truncated": truncated,
        "truncated_reason": "" if truncated is not None else "the run saved no per-request records",
        "prefix_cache_hit_rate": asdict(prefix_hit_rate(summaries)),
        "spec_acceptance_rate": asdict(spec_acceptance(summaries)),
        "request_throughput": bench.request_throughput,
        "output_throughput": bench.output_throughput,
        "total_token_throughput": bench.total_token_throughput,
        "duration_s": bench.duration_s,
    }
    checks = judge(figures, slo)
    report = {
        "kind": REPORT_KIND,
        "version": REPORT_VERSION,
        "name": name,
        "started": started,
        "target": target_url,
        "model": bench.model_id,
        "workload": {**workload.to_dict(), "digest": workload.digest},
        "figures": figures,
        "modes": mode_figures(bench.requests, sent),
        "instances": {k: s.to_dict() for k, s in summaries.items()},
        "slo": asdict(slo),
        "checks": [asdict(c) for c in checks],
        "ok": all(c.ok for c in checks),
    }
    report["verdict"] = failure_message(report) if not report["ok"] else f"load test {name}: every SLO met"
    return report


def failure_message(report: Mapping[str, Any]) -> str:
    """One line per missed SLO: the figure and the mark (what a failed run prints)."""
    lines = [f"load test {report['name']} against {report['target']}: SLO missed"]
    for check in report["checks"]:
        if not check["ok"]:
            detail = f" ({check['detail']})" if check.get("detail") else ""
            lines.append(f"  - {check['name']}: {check['seen']}, the SLO is {check['mark']}{detail}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ saving, table, comparison


def report_path(report_dir: str | os.PathLike[str], name: str) -> Path:
    return Path(report_dir) / f"{re.sub(r'[^A-Za-z0-9._-]', '_', name) or '_'}.json"


def save_report(report_dir: str | os.PathLike[str], report: Mapping[str, Any]) -> Path:
    """Write `<dir>/<name>.json` whole (a temporary file, then a rename)."""
    return write_json(report_path(report_dir, str(report["name"])), report)


def read_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """One saved load-test report; FleetInputError when the file is not one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise FleetInputError(f"load-test report {str(path)!r} cannot be read ({exc.strerror})") from exc
    except ValueError as exc:
        raise FleetInputError(f"load-test report {str(path)!r} is not JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("kind") != REPORT_KIND:
        raise FleetInputError(
            f'{str(path)!r} is not a load-test report (no "kind": "{REPORT_KIND}"); pass a file that '
            "playbooks/loadtest.yml saved in <vllm_fleet_report_dir>/loadtest"
        )
    return data


def load_reports(report_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every load-test report of a folder, oldest first (by start time, then name)."""
    folder = Path(report_dir)
    if not folder.is_dir():
        raise FleetInputError(
            f"load-test folder {str(folder)!r} does not exist; run playbooks/loadtest.yml first or name the "
            "folder fleet_loadtest_report_dir points to"
        )
    reports = [read_report(p) for p in sorted(folder.glob("*.json"))]
    return sorted(reports, key=lambda r: (str(r.get("started", "")), str(r["name"])))


TABLE_COLUMNS = (
    "load test",
    "result",
    "target",
    "requests",
    "failed",
    "truncated",
    "ttft p50/p99 ms",
    "itl p50/p99 ms",
    "prefix hit",
    "spec acc.",
    "req/s",
    "missed SLOs",
)


def table_rows(reports: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    rows = []
    for data in reports:
        figures = data.get("figures") or {}
        ttft, itl = figures.get("ttft_ms") or {}, figures.get("itl_ms") or {}
        missed = [c["name"] for c in data.get("checks", []) if not c.get("ok")]
        rows.append(
            [
                str(data.get("name")),
                "OK" if data.get("ok") else "FAIL",
                str(data.get("target")),
                fmt((figures.get("completed") or 0) + (figures.get("failed") or 0)),
                fmt(figures.get("failed")),
                fmt(figures.get("truncated")),
                f"{fmt(ttft.get('p50'), digits=1)}/{fmt(ttft.get('p99'), digits=1)}",
                f"{fmt(itl.get('p50'), digits=1)}/{fmt(itl.get('p99'), digits=1)}",
                fmt((figures.get("prefix_cache_hit_rate") or {}).get("value"), 100, 1, "%"),
                fmt((figures.get("spec_acceptance_rate") or {}).get("value"), 100, 1, "%"),
                fmt(figures.get("request_throughput"), digits=2),
                ", ".join(missed) or "-",
            ]
        )
    return rows


def loadtest_table(reports: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text table, one row per run, with a summary line (the fleet table's load-test part)."""
    lines = text_table(TABLE_COLUMNS, table_rows(reports))
    lines.append(f"{sum(1 for r in reports if r.get('ok'))}/{len(reports)} load tests met their SLOs")
    return "\n".join(lines)


def compare_reports(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """B against A under the same load: the P99 TTFT difference (the seed: keep a KV tier only if P99
    improves under the same load). Refuses runs of different workloads: their P99s do not compare."""
    wa, wb = a.get("workload") or {}, b.get("workload") or {}
    if wa.get("digest") != wb.get("digest"):
        differs = sorted(k for k in set(wa) | set(wb) if k != "digest" and wa.get(k) != wb.get(k))
        raise FleetInputError(
            f"load tests {a.get('name')!r} and {b.get('name')!r} ran different workloads (workload "
            f"{wa.get('digest')} vs {wb.get('digest')}: {', '.join(differs) or 'digest'} differ); compare "
            "runs of the same fleet_loadtest_* workload"
        )
    p99_a, p99_b = a["figures"]["ttft_ms"]["p99"], b["figures"]["ttft_ms"]["p99"]
    if p99_a is None or p99_b is None:
        raise FleetInputError(
            f"{a.get('name') if p99_a is None else b.get('name')!r} has no P99 TTFT (no request completed); "
            "nothing to compare"
        )
    diff = p99_b - p99_a
    return {
        "a": a["name"],
        "b": b["name"],
        "workload": wa.get("digest"),
        "ttft_p99_ms": {
            "a": p99_a,
            "b": p99_b,
            "diff": diff,
            "diff_pct": diff / p99_a * 100 if p99_a else None,
        },
        "failed": {"a": a["figures"]["failed"], "b": b["figures"]["failed"]},
        "prefix_cache_hit_rate": {
            "a": a["figures"]["prefix_cache_hit_rate"]["value"],
            "b": b["figures"]["prefix_cache_hit_rate"]["value"],
        },
        "b_improves_p99": diff < 0,
    }


def compare_text(result: Mapping[str, Any]) -> str:
    ttft = result["ttft_p99_ms"]
    pct = f" ({ttft['diff_pct']:+.1f} %)" if ttft["diff_pct"] is not None else ""
    verdict = (
        f"{result['b']} improves P99 TTFT under the same load: keep what it adds"
        if result["b_improves_p99"]
        else f"{result['b']} does not improve P99 TTFT under the same load: do not keep what it adds"
    )
    return "\n".join(
        [
            f"workload {result['workload']}: {result['a']} (A) vs {result['b']} (B)",
            f"P99 TTFT: A {ttft['a']:.1f} ms, B {ttft['b']:.1f} ms, B - A {ttft['diff']:+.1f} ms{pct}",
            f"failed: A {result['failed']['a']}, B {result['failed']['b']}; prefix-cache hit rate: "
            f"A {fmt(result['prefix_cache_hit_rate']['a'], 100, 1, '%')}, "
            f"B {fmt(result['prefix_cache_hit_rate']['b'], 100, 1, '%')}",
            verdict,
        ]
    )
