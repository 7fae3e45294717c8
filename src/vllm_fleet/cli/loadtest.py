"""`vllm-fleet loadtest`: run the seed's load test, show the saved runs, compare two of them.

    vllm-fleet loadtest -i INVENTORY [-e KEY=VALUE | -e @vars.yml] [-- ANSIBLE-PLAYBOOK ARGS]
    vllm-fleet loadtest --show [DIR] [--strict] [--json]
    vllm-fleet loadtest --compare A.json B.json [--json]

With `-i` it runs playbooks/loadtest.yml with ansible-playbook (the user's Ansible configuration kept, as
`vllm-fleet rollout` keeps it) and then prints the table of the report folder; its exit status is the
playbook's (2 on a missed SLO or a failure there). `--show` prints the table of the saved reports
(`<vllm_fleet_report_dir>/loadtest`, by default reports/loadtest). `--compare` prints B's P99 TTFT against A's
for two runs of the same workload (the seed: keep a KV tier only if P99 improves under the same load) and
refuses runs of different workloads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from vllm_fleet.cli import emit
from vllm_fleet.errors import FleetInputError

PLAYBOOK = Path("playbooks") / "loadtest.yml"
DEFAULT_DIR = "reports/loadtest"


def _show(report_dir: str, as_json: bool, strict: bool) -> int:
    from vllm_fleet.loadtest.report import TABLE_COLUMNS, load_reports, loadtest_table, table_rows

    reports = load_reports(report_dir)
    summary = {
        "runs": len(reports),
        "met": sum(1 for r in reports if r.get("ok")),
        "rows": [dict(zip(TABLE_COLUMNS, row, strict=True)) for row in table_rows(reports)],
    }
    emit(summary, as_json, loadtest_table(reports))
    return 1 if strict and any(not r.get("ok") for r in reports) else 0


def _compare(paths: list[str], as_json: bool) -> int:
    from vllm_fleet.loadtest.report import compare_reports, compare_text, read_report

    result = compare_reports(read_report(paths[0]), read_report(paths[1]))
    emit(result, as_json, compare_text(result))
    return 0


def _run(args: argparse.Namespace) -> int:
    from vllm_fleet.cli.rollout import ansible_env, default_fleet_report_dir, default_project_dir

    project = default_project_dir()
    for inv in args.inventory:
        if not os.path.exists(inv):
            raise FleetInputError(f"-i {inv!r} does not exist; give an inventory file or folder")
    report_base = default_fleet_report_dir(project, Path.cwd())
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), str(project / PLAYBOOK)]
    for inv in args.inventory:
        argv += ["-i", str(Path(inv).resolve())]
    # the report lands where `--show` looks (a user's -e vllm_fleet_report_dir=... after it wins)
    argv += ["-e", json.dumps({"vllm_fleet_report_dir": str(report_base)})]
    for item in args.extra_vars:
        argv += ["-e", item]
    argv += args.passthrough[1:] if args.passthrough[:1] == ["--"] else args.passthrough
    env = {**os.environ, **ansible_env(project, os.environ, Path.cwd(), str(Path(sys.executable).parent))}
    done = subprocess.run(argv, cwd=project, env=env, check=False)
    report_dir = report_base / "loadtest"
    if report_dir.is_dir() and not args.json:
        _show(str(report_dir), False, False)
    return done.returncode


def _handle(args: argparse.Namespace) -> int:
    if args.compare:
        return _compare(args.compare, args.json)
    if args.inventory:
        return _run(args)
    return _show(args.show or DEFAULT_DIR, args.json, args.strict)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "loadtest",
        help="run the load test (playbooks/loadtest.yml), show saved runs, compare two runs' P99 TTFT",
        description=__doc__.split("\n\n", 2)[2] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-i", "--inventory", action="append", default=[], help="run the load test on it")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], help="as ansible-playbook's -e")
    parser.add_argument(
        "--show",
        metavar="DIR",
        nargs="?",
        const=DEFAULT_DIR,
        default="",
        help=f"table of DIR ({DEFAULT_DIR})",
    )
    parser.add_argument(
        "--compare", nargs=2, metavar=("A", "B"), help="B's P99 TTFT against A's (two reports)"
    )
    parser.add_argument("--strict", action="store_true", help="with --show: exit 1 when a run missed an SLO")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("passthrough", nargs=argparse.REMAINDER, help="after --: ansible-playbook arguments")
    parser.set_defaults(handler=_handle)
