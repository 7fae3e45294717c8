"""The `vllm-fleet` command. Each subcommand lives in its own module of this package and exposes

    register(subparsers) -> None   # adds its parser, with set_defaults(handler=<callable(args) -> int>)

Modules are discovered, so adding a subcommand touches no other file. The contract (DESIGN §4): with
`--json` a command prints exactly one JSON object on stdout; errors go to stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from collections.abc import Sequence
from typing import Any

from vllm_fleet import __version__
from vllm_fleet.errors import FleetInputError
from vllm_fleet.jsonfile import read_json, read_text
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


def read_input_file(path: str, what: str) -> str:
    """Read a text file named on the command line (`jsonfile.read_text`: at most MAX_INPUT_BYTES)."""
    return read_text(path, what)


def read_json_input(path: str, what: str, fix: str) -> Any:
    """The JSON value of a file named on the command line (`jsonfile.read_json`)."""
    return read_json(path, what, fix)


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
