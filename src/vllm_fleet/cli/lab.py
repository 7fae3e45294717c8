"""`vllm-fleet lab up|down|list|status|clean`: real test hosts (systemd-nspawn containers) on this machine.

Progress goes to stderr: a bar redrawn in place on a terminal, plain lines (at most one per 10 s a step,
plus each change of phase) otherwise; stdout keeps the result (`--json`: one JSON object)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from vllm_fleet.cli import emit
from vllm_fleet.errors import FleetInputError
from vllm_fleet.lab import run as lab_run
from vllm_fleet.lab import spec as lab
from vllm_fleet.lab.build import LabBuildError
from vllm_fleet.lab.leftovers import leftovers, remove_leftovers
from vllm_fleet.lab.progress import Reporter

_reporter = Reporter(sys.stderr)


def _log(message: str) -> None:
    _reporter.message(message)


def _need_root() -> None:
    if os.geteuid() != 0:
        raise FleetInputError(
            "vllm-fleet lab needs root (network namespaces, mounts, systemd-nspawn): run it as root"
        )


def _exit_on_term(signum: int, _frame: object) -> None:
    # SystemExit unwinds through `up`, whose handler tears down what it created (a plain SIGTERM would not).
    raise SystemExit(128 + signum)


def _handle(args: argparse.Namespace) -> int:
    _need_root()
    signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        return _dispatch(args)
    except (lab_run.LabError, LabBuildError) as exc:
        _reporter.close()
        print(f"vllm-fleet lab {args.lab_command}: failed: {exc}", file=sys.stderr)
        return 1
    finally:
        _reporter.close()


def _dispatch(args: argparse.Namespace) -> int:
    root = lab.lab_root()
    if args.lab_command == "up":
        result = lab_run.up(
            args.name,
            hosts=args.hosts,
            names=args.host or None,
            inventory_path=Path(args.inventory) if args.inventory else None,
            with_vllm=not args.without_vllm,
            preinstalled_vllm=args.preinstalled_vllm,
            root=root,
            log=_log,
            progress=_reporter.progress,
        )
        timings = ", ".join(f"{k} {v:.1f} s" for k, v in result["timings_s"].items())
        hosts = "\n".join(f"  {h['name']}  {h['address']}" for h in result["hosts"])
        human = (
            f"lab {result['name']}: {'up' if result['changed'] else 'already up'}\n{hosts}\n"
            f"inventory: {result['inventory_copy'] or result['inventory']}\ntimings: {timings}"
        )
        emit(result, args.json, human)
        return 0
    if args.lab_command == "save-vllm":
        result = lab_run.save_vllm(args.name, args.host, args.venv, root=root, log=_log)
        emit(
            result,
            args.json,
            f"{args.host}:{args.venv} {'saved in' if result['changed'] else 'kept:'} {result['path']}",
        )
        return 0
    if args.lab_command == "down":
        names = lab_run.known_labs(root) if args.all else [lab.check_lab_name(args.name)]
        results = [lab_run.down(n, root=root, log=_log) for n in names]
        result: dict[str, Any] = {"labs": results}
        emit(result, args.json, "\n".join(f"lab {r['name']}: down" for r in results) or "no labs")
        return 0
    if args.lab_command == "clean":
        result = lab_run.clean(root=root, log=_log)
        human = (
            f"{len(result['labs'])} labs down; removed {len(result['removed'])} caches and locks, "
            f"{result['bytes_freed'] / 1e6:.0f} MB freed; "
            + (f"{root} removed" if result["root_removed"] else f"{root} kept (it holds other files)")
        )
        if args.all:
            rest = remove_leftovers(leftovers(), log=_log)
            result["leftovers"] = rest
            human += (
                f"\nand everything else the project and its tests made: removed {len(rest['removed'])} "
                f"folders, {rest['bytes_freed'] / 1e6:.0f} MB freed"
            )
        emit(result, args.json, human)
        return 0
    if args.lab_command == "list":
        labs = [lab_run.status(n, root=root) for n in lab_run.known_labs(root)]
        human = "\n".join(f"{s['name']}\t{s['status']}\t{len(s['hosts'])} hosts" for s in labs) or "no labs"
        emit({"labs": labs}, args.json, human)
        return 0
    names = [args.name] if args.name else lab_run.known_labs(root)
    labs = [lab_run.status(lab.check_lab_name(n), root=root) for n in names]
    lines = []
    for s in labs:
        lines.append(f"lab {s['name']}: {s['status']}")
        lines += [
            f"  {h['name']}  {h['address']}  running={h['running']}  system={h['system_state']}"
            for h in s["hosts"]
        ]
    emit({"labs": labs}, args.json, "\n".join(lines) or "no labs")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("lab", help="real test hosts: systemd-nspawn containers on this machine")
    sub = parser.add_subparsers(dest="lab_command", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="create and boot the hosts of a lab (reuses a lab that is up)")
    up.add_argument("--name", required=True, help="lab name (namespaces, bridge and subnet derive from it)")
    up.add_argument("--hosts", type=int, help="number of hosts, named NAME-1 .. NAME-N")
    up.add_argument("--host", action="append", metavar="HOST", help="a host name (repeat for each host)")
    up.add_argument("--inventory", metavar="FILE", help="also write the lab's Ansible inventory to FILE")
    up.add_argument(
        "--without-vllm",
        action="store_true",
        help="skip the vLLM wheelhouse and tiny model (hosts only, faster on a fresh machine)",
    )
    up.add_argument(
        "--preinstalled-vllm",
        action="store_true",
        help="start the hosts with the vLLM venv `lab save-vllm` saved for this wheelhouse, when there is one"
        " (the install role then finds vLLM installed: for tests of what comes after the install)",
    )
    save = sub.add_parser(
        "save-vllm",
        help="save a host's installed vLLM venv in the lab cache, for `lab up --preinstalled-vllm`",
    )
    save.add_argument("--name", required=True, help="lab name")
    save.add_argument("--host", required=True, help="the lab host whose venv vllm_install installed")
    save.add_argument(
        "--venv", default="/opt/vllm-fleet/venv", help="the venv on the host (vllm_install_venv)"
    )
    down = sub.add_parser("down", help="stop and remove a lab, including leftovers of a failed up")
    target = down.add_mutually_exclusive_group(required=True)
    target.add_argument("--name", help="lab name")
    target.add_argument("--all", action="store_true", help="every lab on this machine")
    clean = sub.add_parser(
        "clean",
        help="remove every lab, the cached root filesystem, wheelhouse, model (~950 MB) and saved vLLM venv"
        " (~2.5 GB), all locks",
    )
    clean.add_argument(
        "--all",
        action="store_true",
        help="also what the tests and scripts leave outside the lab root: the vLLM venvs and wheels under "
        "/var/cache/vllm-fleet-*, the suite's uv and pip caches (~/.cache/vllm-fleet), pytest's "
        "/tmp/pytest-of-USER",
    )
    sub.add_parser("list", help="the labs on this machine")
    status = sub.add_parser("status", help="hosts, processes and systemd state of a lab")
    status.add_argument("--name", help="lab name (default: every lab)")
    for p in (up, save, down, sub.choices["list"], sub.choices["clean"], status):
        p.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_handle)
