"""`vllm-fleet report [DIR]`: the fleet table from the JSON reports that playbooks/verify.yml saved, and the
load-test table of the runs playbooks/loadtest.yml saved beside them (`<reports>/loadtest`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_fleet.cli import emit


def _handle(args: argparse.Namespace) -> int:
    # Imported here so that `vllm-fleet --help` and the other commands never pay for (or break on) it.
    from vllm_fleet.verify.report import fleet_summary, fleet_table, load_reports

    reports = load_reports(args.dir)
    if args.hosts:
        wanted = {h.strip() for h in args.hosts.split(",") if h.strip()}
        reports = [r for r in reports if str(r.get("host")) in wanted]
    summary, table = fleet_summary(reports), fleet_table(reports)
    loadtests = _loadtests(
        args.loadtest or str(Path(args.dir).parent / "loadtest"), explicit=bool(args.loadtest)
    )
    if loadtests is not None:
        from vllm_fleet.loadtest.report import TABLE_COLUMNS, loadtest_table, table_rows

        summary["loadtests"] = [dict(zip(TABLE_COLUMNS, row, strict=True)) for row in table_rows(loadtests)]
        table = f"{table}\n\n{loadtest_table(loadtests)}"
    emit(summary, args.json, table)
    failed = any(not r.get("ok") for r in [*reports, *(loadtests or [])])
    return 1 if args.strict and failed else 0


def _loadtests(folder: str, explicit: bool) -> list[dict] | None:
    """The load-test reports beside the verify reports (`<reports>/loadtest`), None when there are none and
    the folder was not asked for by name."""
    from vllm_fleet.loadtest.report import load_reports

    if not explicit and not Path(folder).is_dir():
        return None
    return load_reports(folder)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="print the fleet table from saved verify reports",
        description="Read <host>--<instance>.json verify reports and print one row per host and instance.",
    )
    parser.add_argument(
        "dir", nargs="?", default="reports/verify", help="report folder (default: reports/verify)"
    )
    parser.add_argument("--hosts", default="", help="only these hosts (comma-separated)")
    parser.add_argument(
        "--loadtest",
        default="",
        help="load-test report folder (default: loadtest/ beside DIR, when it exists)",
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when an instance failed")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_handle)
