"""`vllm-fleet flags`: the `vllm serve` flag catalog of one vLLM release, and checks of pasted commands.

    vllm-fleet flags --vllm-version 0.33.0 [--json]                 # every flag, choices, JSON keys
    vllm-fleet flags --vllm-version 0.33.0 --flag rope-scaling      # does it exist here, since when
    vllm-fleet flags --vllm-version 0.33.0 --check-command cmd.sh   # each wrong flag/key of a pasted command

Exit status: 0; 1 when --flag is absent or --check-command found errors; 2 for unusable input.
"""

from __future__ import annotations

import argparse
from typing import Any

from vllm_fleet import flags
from vllm_fleet.cli import emit, read_input_file
from vllm_fleet.render.validate import check_command, unknown_flag_reason


def _catalog(release: flags.Release) -> dict[str, Any]:
    return {
        "vllm_version": release.version,
        "catalogued_versions": flags.catalogued_versions(),
        "flags": release.flags,
        "values": release.values,
        "json_keys": release.json_keys,
        "offloading": release.offloading,
    }


def _handle(args: argparse.Namespace) -> int:
    release = flags.release(args.vllm_version)
    if args.check_command:
        text = read_input_file(args.check_command, "--check-command")
        if "# ---- verbatim below ----\n" in text:
            text = text.split("# ---- verbatim below ----\n", 1)[1]
        errors, warnings = check_command(text, args.vllm_version)
        result = {"vllm_version": release.version, "errors": errors, "warnings": warnings}
        human = "\n".join([f"error: {e}" for e in errors] + [f"warning: {w}" for w in warnings]) or "ok"
        emit(result, args.json, human)
        return 1 if errors else 0
    if args.flag:
        args.flag = args.flag if args.flag.startswith("-") else "--" + args.flag
        info = release.lookup(args.flag)
        result = {
            "vllm_version": release.version,
            "flag": args.flag,
            "exists": info is not None,
            "releases": flags.history(args.flag),
            "availability": flags.describe_availability(args.flag),
            "detail": release.flags.get(info.option) if info else None,
            "reason": None if info else unknown_flag_reason(flags.normalise_option(args.flag), release),
        }
        human = (
            f"{args.flag}: {'exists' if info else 'absent'} in {release.version}; {result['availability']}"
        )
        if result["reason"]:
            human += f"\n{args.flag} {result['reason']}"
        emit(result, args.json, human)
        return 0 if info else 1
    catalog = _catalog(release)
    lines = [f"vLLM {release.version}: {len(release.flags)} flags"]
    for option, data in release.flags.items():
        extra = f" {{{','.join(data['choices'])}}}" if data.get("choices") else ""
        negations = f"  (also {', '.join(data['negations'])})" if data["negations"] else ""
        lines.append(f"  {option}{extra}{negations}")
    for kind, values in release.values.items():
        lines.append(f"{kind}: {', '.join(values) if values else '-'}")
    emit(catalog, args.json, "\n".join(lines))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "flags",
        help="the vllm serve flag catalog of a vLLM release; check a pasted command",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--vllm-version", required=True, help="vLLM release, e.g. 0.33.0")
    parser.add_argument(
        "--flag", help="one flag to look up, without its dashes (rope-scaling) or as --flag=--x"
    )
    parser.add_argument("--check-command", metavar="FILE", help="a file holding a `vllm serve ...` command")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_handle)
