"""The `vllm-fleet` command. Each subcommand lives in its own module of this package and exposes

    register(subparsers) -> None   # adds its parser, with set_defaults(handler=<callable(args) -> int>)

Modules are discovered, so adding a subcommand touches no other file. The contract (DESIGN §4): with
`--json` a command prints exactly one JSON object on stdout; errors go to stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import pkgutil
import sys
from collections.abc import Sequence
from typing import Any

from vllm_fleet import __version__
from vllm_fleet.errors import FleetInputError
from vllm_fleet.terminal import terminal_safe


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-fleet",
        description="Plan, render and check vLLM deployments on multi-GPU hosts.",
    )
    parser.add_argument("--version", action="version", version=f"vllm-fleet {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module_info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        module.register(subparsers)
    return parser


def emit(result: dict[str, Any], as_json: bool, human: str) -> None:
    """Print a command's result: one JSON object with --json (json escapes every control character), else the
    human-readable text without escape sequences or control characters (`terminal_safe`)."""
    if as_json:
        json.dump(result, sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(terminal_safe(human).rstrip("\n") + "\n")


# The files a command reads whole (plans, recorded answers, vars, topology outputs) are kilobytes to a few
# megabytes; a bigger one is a mistake (a weights file, /dev/zero), refused before it fills memory.
MAX_INPUT_BYTES = 16 << 20


def read_input_file(path: str, what: str) -> str:
    """Read a text file named on the command line, at most MAX_INPUT_BYTES; a missing, unreadable or larger
    file is a FleetInputError naming `what` and the path (undecodable bytes are replaced)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise FleetInputError(f"{what}: cannot read {path!r}: {exc.strerror}") from exc
    if len(data) > MAX_INPUT_BYTES:
        raise FleetInputError(
            f"{what}: {path!r} is larger than {MAX_INPUT_BYTES >> 20} MiB, more than any file this option "
            "takes; check the path"
        )
    return data.decode("utf-8", errors="replace")


def read_json_input(path: str, what: str, fix: str) -> Any:
    """The JSON value of a file named on the command line (`read_input_file`); a file that is not JSON, is
    nested deeper than the parser follows or holds a number that is not finite is a FleetInputError that
    names `what`, the path and `fix`."""
    text = read_input_file(path, what)
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise FleetInputError(
            f"{what}: {path!r} is not JSON ({exc.msg} at line {exc.lineno}); {fix}"
        ) from exc
    except RecursionError as exc:
        raise FleetInputError(f"{what}: {path!r} is nested deeper than a JSON parser follows; {fix}") from exc
    except ValueError as exc:  # NaN / Infinity, or an integer of over 4,300 digits
        raise FleetInputError(f"{what}: {path!r} is not JSON a plan can hold ({exc}); {fix}") from exc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is not a finite number")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except FleetInputError as exc:
        print(terminal_safe(f"vllm-fleet {args.command}: error: {exc}"), file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover - python -m vllm_fleet.cli
    sys.exit(main())
