"""`vllm-fleet rollout`: run playbooks/rollout.yml through ansible-runner, with progress and a summary.

    vllm-fleet rollout -i inventory/ [--hosts PATTERN] [--canary HOST|GROUP] [--serial 1,25%,100%]
                       [--max-fail-percentage N] [-e KEY=VALUE | -e @file.yml] [--json]
                       [-- ANSIBLE-PLAYBOOK ARGS: --limit, --tags, --check, --diff, --vault-id, -u, ...]

Everything after `--` goes to ansible-playbook as written (ansible-runner's `cmdline`). The user's Ansible
configuration is kept: $ANSIBLE_CONFIG or ./ansible.cfg when there is one (the checkout's own ansible.cfg
otherwise); only the path to this project's collection is added, through ANSIBLE_COLLECTIONS_PATH.
ansible-runner's private data and artifacts stay in the run folder (<run folder>/ansible-runner).

It prints a line per rollout step and failure while the playbook runs, then the per-host summary (old → new
version/argv hash, result, time to ready) and fleet totals. The summary is also written, completed with what
only the event stream knows (which hosts went unreachable mid-turn), to <report dir>/<run id>/summary.json.
Exit status: 0 when every host is ok or unchanged, 1 when the rollout failed or was refused, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_fleet.cli import emit
from vllm_fleet.errors import FleetInputError
from vllm_fleet.project import fleet_report_dir, project_dir
from vllm_fleet.rollout import decisions as rollout
from vllm_fleet.terminal import terminal_safe

PLAYBOOK = Path("playbooks") / "rollout.yml"
# ansible-core's own default for collections_path, kept behind the project's when we set the variable
DEFAULT_COLLECTIONS_PATH = "~/.ansible/collections:/usr/share/ansible/collections"


def default_report_dir(project: Path, cwd: Path) -> Path:
    """The run folders: `rollouts/` of the reports folder, as the role's own default
    (`vllm_rollout_report_dir`), so a rollout run by the CLI and one run by ansible-playbook land together.
    ansible-runner runs the playbook with the project as its working directory, where the playbook's own
    default (`./reports`) would land in site-packages for the installed collection."""
    return fleet_report_dir(project, cwd) / "rollouts"


def parse_extra_vars(items: list[str]) -> dict[str, Any]:
    """`-e` as ansible-playbook reads it: `@file.yml|json`, a YAML/JSON mapping (`{...}`), else `k=v k2=v2`
    (ansible's own key=value splitter: quoting as in ansible-playbook, every value a string)."""
    import yaml  # only this command needs it
    from ansible.parsing.splitter import parse_kv

    result: dict[str, Any] = {}
    for item in items:
        if item.startswith("@"):
            path = item[1:]
            try:
                with open(path, encoding="utf-8") as handle:
                    data = yaml.safe_load(handle)
            except (OSError, yaml.YAMLError) as exc:
                raise FleetInputError(f"-e {item}: cannot read {path!r} as YAML/JSON: {exc}") from exc
            if not isinstance(data, dict):
                raise FleetInputError(f"-e {item}: {path!r} must hold a mapping of variables")
            result.update(data)
            continue
        if item.lstrip().startswith(("{", "[")):
            try:
                data = yaml.safe_load(item)
            except yaml.YAMLError as exc:
                raise FleetInputError(f"-e {item!r}: cannot read it as a YAML/JSON mapping: {exc}") from exc
            if not isinstance(data, dict):
                raise FleetInputError(f"-e {item!r}: give a mapping such as '{{\"key\": 1}}'")
            result.update(data)
            continue
        pairs = parse_kv(item)
        pairs.pop("_raw_params", None)
        if not pairs or any(not key.strip() for key in pairs):
            raise FleetInputError(f"-e {item!r}: expected KEY=VALUE [KEY=VALUE ...], a mapping or @FILE")
        result.update(pairs)
    return result


def ansible_env(project: Path, environ: Mapping[str, str], cwd: Path, bin_dir: str) -> dict[str, str]:
    """The environment of the playbook: the user's Ansible configuration kept ($ANSIBLE_CONFIG, else
    ./ansible.cfg), the checkout's ansible.cfg only when the user has none; the project's collection is found
    through ANSIBLE_COLLECTIONS_PATH either way (it overrides only that setting)."""
    env = {"PATH": f"{bin_dir}{os.pathsep}{environ.get('PATH', '')}", "ANSIBLE_NOCOLOR": "1"}
    if environ.get("ANSIBLE_CONFIG"):
        env["ANSIBLE_CONFIG"] = environ["ANSIBLE_CONFIG"]
    elif (cwd / "ansible.cfg").is_file():
        env["ANSIBLE_CONFIG"] = str(cwd / "ansible.cfg")
    else:
        env["ANSIBLE_CONFIG"] = str(project / "ansible.cfg")
        return env
    # the user's ansible.cfg does not know where this project's collection (vllm_fleet.serving) is: the clone
    # holds it as ansible_collections/vllm_fleet/serving; the usual default paths stay behind it
    own = environ.get("ANSIBLE_COLLECTIONS_PATH", "") or DEFAULT_COLLECTIONS_PATH
    env["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join(p for p in (str(project), own) if p)
    return env


def playbook_cmdline(passthrough: list[str]) -> str | None:
    """ansible-runner's `cmdline`: the arguments after `--`, quoted for its shlex split (None: none)."""
    args = passthrough[1:] if passthrough[:1] == ["--"] else passthrough
    return shlex.join(args) if args else None


def build_extravars(args: argparse.Namespace, run_id: str, report_dir: Path) -> dict[str, Any]:
    """The playbook's variables from the command line; the rules are checked here before anything runs."""
    extra = parse_extra_vars(args.extra_vars or [])
    if args.hosts:
        # preflight and every other playbook select hosts with vllm_fleet_hosts
        extra["vllm_fleet_hosts"] = args.hosts
    if args.canary:
        extra["vllm_rollout_canary"] = [c.strip() for c in args.canary.split(",") if c.strip()]
    if args.serial:
        extra["vllm_rollout_serial"] = args.serial
    if args.max_fail_percentage is not None:
        extra["vllm_rollout_max_fail_percentage"] = args.max_fail_percentage
    if "vllm_rollout_serial" in extra:
        extra["vllm_rollout_serial"] = rollout.parse_serial(extra["vllm_rollout_serial"])
    if "vllm_rollout_max_fail_percentage" in extra:
        extra["vllm_rollout_max_fail_percentage"] = rollout.check_max_fail_percentage(
            extra["vllm_rollout_max_fail_percentage"]
        )
    extra["vllm_rollout_run_id"] = run_id
    extra["vllm_rollout_report_dir"] = str(report_dir)
    return extra


def finish_summary(run_dir: Path, digest: Any, started_at: float, finished_at: float) -> dict[str, Any]:
    """The playbook's summary, completed from the event stream (or rebuilt from the host records when the
    playbook stopped before writing it, e.g. when every host of a batch went unreachable)."""
    written: dict[str, Any] = {}
    summary_file = run_dir / "summary.json"
    if summary_file.is_file():
        written = json.loads(summary_file.read_text(encoding="utf-8"))
    records = [json.loads(p.read_text(encoding="utf-8")) for p in sorted((run_dir / "hosts").glob("*.json"))]
    targets = [h["host"] for h in written.get("hosts", [])]
    if not targets:
        # the plan play never ran: every host the run touched was refused (preflight failed or unreachable)
        seen = sorted(set(digest.failed) | set(digest.unreachable) | set(digest.stats) - {"localhost"})
        reasons = {h: "; ".join(digest.failed.get(h, [])) or digest.unreachable.get(h, "") for h in seen}
        refused = {h: r or "preflight did not pass" for h, r in reasons.items() if r} or None
        return rollout.summarize(
            seen,
            [],
            refused=refused or {h: "rollout did not start" for h in seen},
            started_at=started_at,
            finished_at=finished_at,
        )
    refused = None
    if written.get("result") == "refused":
        refused = {
            h["host"]: "; ".join(digest.failed.get(h["host"], []))
            or digest.unreachable.get(h["host"], "")
            or h.get("failure")
            or ""
            for h in written["hosts"]
            if h["status"] == "refused" and (h["host"] in digest.failed or h["host"] in digest.unreachable)
        }
    return rollout.summarize(
        targets,
        records,
        unreachable=digest.unreachable,
        refused=refused,
        stop_reason=written.get("stop_reason") if written.get("result") not in ("ok", "unchanged") else None,
        started_at=started_at,
        finished_at=finished_at,
    )


def _progress(event: Mapping[str, Any]) -> bool:
    line = rollout.progress_line(event)
    if line:
        stamp = time.strftime("%H:%M:%S")
        print(terminal_safe(f"{stamp} {line}"), file=sys.stderr, flush=True)
    return True


def _handle(args: argparse.Namespace) -> int:
    # heavy, and only this command needs it: `vllm-fleet --help` must not pay for it
    import ansible_runner

    project = Path(args.project_dir).resolve() if args.project_dir else project_dir()
    if not (project / PLAYBOOK).is_file():
        raise FleetInputError(
            f"--project-dir {str(project)!r} holds no {PLAYBOOK}; point it at the vllm-fleet checkout"
        )
    inventories = [str(Path(i).resolve()) for i in args.inventory]
    for inv in inventories:
        if not os.path.exists(inv):
            raise FleetInputError(f"-i {inv!r} does not exist; give an inventory file or folder")
    run_id = args.run_id or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    report_dir = (
        Path(args.report_dir).resolve() if args.report_dir else default_report_dir(project, Path.cwd())
    )
    extravars = build_extravars(args, run_id, report_dir)
    # -e vllm_fleet_report_dir=... wins; a relative one is the user's working directory's, not the runner's
    extravars.setdefault("vllm_fleet_report_dir", str(fleet_report_dir(project, Path.cwd())))
    given = extravars["vllm_fleet_report_dir"]
    if isinstance(given, str) and given and not os.path.isabs(given):  # anything else: the filter's message
        extravars["vllm_fleet_report_dir"] = str(Path.cwd() / given)
    run_dir = report_dir / run_id

    events: list[dict[str, Any]] = []

    def on_event(event: dict[str, Any]) -> bool:
        events.append(
            {
                "event": event.get("event"),
                "created": event.get("created"),
                "event_data": event.get("event_data") or {},
            }
        )
        if not args.json and not args.quiet:
            _progress(event)
        return True

    env = ansible_env(project, os.environ, Path.cwd(), str(Path(sys.executable).parent))
    started = time.time()
    # private data (inventory, extravars, env) and artifacts (stdout, job events) kept with the run's summary
    private = run_dir / "ansible-runner"
    private.mkdir(parents=True, exist_ok=True)
    runner = ansible_runner.run(
        private_data_dir=str(private),
        project_dir=str(project),
        playbook=str(project / PLAYBOOK),
        inventory=inventories,
        extravars=extravars,
        envvars=env,
        cmdline=playbook_cmdline(args.ansible_args),
        event_handler=on_event,
        quiet=True,
        timeout=args.timeout or None,
        verbosity=args.verbose or None,
    )
    status, rc = runner.status, runner.rc
    # env/ holds the extra vars and environment as files (an API key given with -e among them): not kept
    shutil.rmtree(private / "env", ignore_errors=True)
    # the playbook's own output, for the failures the summary only names
    stdout = Path(runner.stdout.name) if hasattr(runner.stdout, "name") else None
    if stdout is not None and stdout.is_file():
        shutil.copyfile(stdout, run_dir / "ansible.log")
    finished = time.time()
    if args.events:
        with open(args.events, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(e, default=str) + "\n" for e in events)
    digest = rollout.digest_events(events)
    summary = finish_summary(run_dir, digest, started, finished)
    summary["run_id"] = run_id
    summary["summary_file"] = str(run_dir / "summary.json")
    summary["ansible"] = {"status": status, "rc": rc, "changed": digest.stats}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    human = rollout.format_summary(summary) + f"\nsummary: {run_dir / 'summary.json'}"
    if status == "timeout":
        human += f"\nansible-runner stopped the playbook after --timeout {args.timeout}s"
    emit(summary, args.json, human)
    return 0 if summary["result"] in ("ok", "unchanged") else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rollout",
        help="roll a new configuration out to the fleet: canary, batches, verify, roll back",
        description=(
            "Run playbooks/rollout.yml: preflight every host, then the canary, then batches; verify each "
            "host after its restart, roll a failing host back to its last-known-good configuration and stop."
        ),
    )
    parser.add_argument("-i", "--inventory", action="append", required=True, help="inventory file or folder")
    parser.add_argument("--hosts", default="", help="host pattern to roll out (default: all)")
    parser.add_argument(
        "--canary", default="", help="canary hosts or group, comma-separated (default: first)"
    )
    parser.add_argument("--serial", default="", help="batch sizes after the canary, e.g. 1,25%%,100%%")
    parser.add_argument(
        "--max-fail-percentage", type=int, default=None, help="failed hosts tolerated per batch (default 0)"
    )
    parser.add_argument(
        "-e", "--extra-vars", action="append", default=[], help="KEY=VALUE (JSON values) or @FILE"
    )
    parser.add_argument("--report-dir", default="", help="where run folders go (default: reports/rollouts)")
    parser.add_argument("--run-id", default="", help="name of this run's folder (default: UTC start time)")
    parser.add_argument("--project-dir", default="", help="the vllm-fleet checkout (default: this one)")
    parser.add_argument("--timeout", type=int, default=0, help="stop the playbook after this many seconds")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="ansible verbosity")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--events", default="", help="also save ansible-runner's events here (JSON lines)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "ansible_args",
        nargs=argparse.REMAINDER,
        help="after --: arguments for ansible-playbook as written (--limit, --tags, --check, --diff, ...)",
    )
    parser.set_defaults(handler=_handle)
