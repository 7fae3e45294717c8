"""`vllm-fleet report [DIR]`: the fleet table from the JSON reports that playbooks/verify.yml saved."""

from __future__ import annotations

import argparse

from vllm_fleet.cli import emit


def _handle(args: argparse.Namespace) -> int:
    # Imported here so that `vllm-fleet --help` and the other commands never pay for (or break on) it.
    from vllm_fleet.verify.report import fleet_summary, fleet_table, load_reports

    reports = load_reports(args.dir)
    if args.hosts:
        wanted = {h.strip() for h in args.hosts.split(",") if h.strip()}
        reports = [r for r in reports if str(r.get("host")) in wanted]
    emit(fleet_summary(reports), args.json, fleet_table(reports))
    return 1 if args.strict and any(not r.get("ok") for r in reports) else 0


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
    parser.add_argument("--strict", action="store_true", help="exit 1 when an instance failed")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_handle)
