#!/usr/bin/env python3
"""Parse a rendered `vllm serve` argv with the INSTALLED vLLM's own argument parser, before any restart.

Run it with the vLLM venv's python, on the host:

    /opt/vllm-fleet/venv/bin/python vllm_argv_check.py /etc/vllm-fleet/i0.json     # {"argv": [...]} or [...]
    echo '["vllm", "serve", "m", "--max-model-len", "8"]' | .../python vllm_argv_check.py -
    echo '{"argvs": {"i0": [...], "i1": [...]}}' | .../python vllm_argv_check.py -    # several, one import

It builds the parser exactly as the `vllm` command does (FlexibleArgumentParser + the serve subcommand's
`subparser_init`), parses the words after `serve`, then runs the serve subcommand's own `validate()` (for
instance `--enable-auto-tool-choice` without `--tool-call-parser`). An unknown flag, a bad choice or a value
of the wrong type therefore fails the play here instead of crash-looping the unit. Nothing is loaded or
started: no model, no GPU.

The last line on stdout is one JSON object: {"ok", "vllm_version", "error", "args"}; exit status 0 when the
argv parses, 2 when vLLM rejects it, 3 when vLLM cannot be imported or the input is unreadable. Given
{"argvs": {name: argv}} (the role's form: every instance of a host that restarts), it imports vLLM once for
all of them, the costly part (8-14 s of CPU on a lab host: torch, transformers), and prints
{"ok", "vllm_version", "error", "results": {name: {"ok", "error", "args"}}}; "ok" and the exit status are
those of the worst argv.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


def _read_argvs(source: str) -> tuple:
    """(batch, {name: argv}): the one argv of a list or {"argv"} under the name "argv", or {"argvs"}'s."""
    if source == "-":
        text = sys.stdin.read()
    else:
        with open(source, encoding="utf-8") as handle:
            text = handle.read()
    data = json.loads(text)
    batch = isinstance(data, dict) and "argvs" in data
    argvs = data["argvs"] if batch else {"argv": data.get("argv") if isinstance(data, dict) else data}
    if not isinstance(argvs, dict) or not argvs:
        raise ValueError("'argvs' must be an object of at least one name: argv")
    for name, argv in argvs.items():
        if not isinstance(argv, list) or not all(isinstance(w, str) for w in argv):
            raise ValueError(f"{name}: expected a JSON list of strings, or an object whose 'argv' is one")
    return batch, argvs


def serve_words(argv: list) -> list:
    """The words after `serve` (a numactl wrapper and the vllm path before it are not vLLM's business)."""
    if "serve" not in argv:
        raise ValueError("the argv has no 'serve' word: it is not a `vllm serve` command")
    return argv[argv.index("serve") + 1 :]


def check(words: list) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import vllm.entrypoints.cli.serve as serve_module

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser as Parser
    except ImportError:  # vLLM < 0.11 kept it in vllm.utils
        from vllm.utils import FlexibleArgumentParser as Parser

    # the imported package's own version: the one that matters when a source tree shadows the install
    vllm_version = getattr(sys.modules.get("vllm"), "__version__", None)
    if not vllm_version:
        try:
            vllm_version = version("vllm")
        except PackageNotFoundError:
            vllm_version = None

    parser = Parser(prog="vllm", description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    commands = {}
    for command in serve_module.cmd_init():
        command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
        commands[command.name] = command
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(["serve", *words])
    except SystemExit as exc:
        lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
        error = next((line for line in reversed(lines) if "error:" in line), lines[-1] if lines else str(exc))
        return {"ok": False, "vllm_version": vllm_version, "error": error, "args": None}
    try:
        commands["serve"].validate(args)
    except (TypeError, ValueError, KeyError) as exc:
        return {
            "ok": False,
            "vllm_version": vllm_version,
            "error": f"{type(exc).__name__}: {exc}",
            "args": None,
        }
    # argparse's allow_abbrev lets a prefix such as --kv-cache-memory stand for --kv-cache-memory-bytes; the
    # next release may add a second flag with that prefix and break the unit, so only full names pass here.
    known = set(subparsers.choices["serve"]._option_string_actions)
    abbreviated = []
    for word in words:
        name = _normalise(word)
        if name.startswith("--") and name.split(".", 1)[0] not in known:
            abbreviated.append(word.split("=", 1)[0])
    if abbreviated:
        return {
            "ok": False,
            "vllm_version": vllm_version,
            "error": "abbreviated option(s) "
            + ", ".join(abbreviated)
            + ": argparse accepts them only as prefixes of longer flags; spell the full flag names",
            "args": None,
        }
    with contextlib.redirect_stderr(stderr):
        defaults = vars(parser.parse_args(["serve"]))
    changed = {
        k: v for k, v in vars(args).items() if k != "dispatch_function" and defaults.get(k, object()) != v
    }
    return {
        "ok": True,
        "vllm_version": vllm_version,
        "error": None,
        "args": json.loads(json.dumps(changed, default=repr)),
    }


def _normalise(word: str) -> str:
    """FlexibleArgumentParser's spelling rule: `--a_b.c_d=1` is `--a-b.c_d`."""
    name = word.split("=", 1)[0]
    if not name.startswith("--"):
        return name
    head, dot, tail = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def main(argv: list) -> int:
    if len(argv) != 2:
        print(json.dumps({"ok": False, "error": "usage: vllm_argv_check.py FILE|-", "vllm_version": None}))
        return 3
    try:
        batch, argvs = _read_argvs(argv[1])
        words = {name: serve_words(one) for name, one in argvs.items()}
    except (OSError, ValueError) as exc:
        print(json.dumps({"ok": False, "error": f"input: {exc}", "vllm_version": None, "args": None}))
        return 3
    # vLLM logs to stdout while it imports; keep stdout for the one JSON line.
    noise = io.StringIO()
    try:
        with contextlib.redirect_stdout(noise):
            results = {name: check(one) for name, one in words.items()}
    except ImportError as exc:
        result = {
            "ok": False,
            "error": f"cannot import vLLM with {sys.executable}: {exc}",
            "vllm_version": None,
        }
        print(json.dumps(result))
        return 3
    sys.stderr.write(noise.getvalue())
    ok = all(result["ok"] for result in results.values())
    if batch:
        version = next(iter(results.values()))["vllm_version"]
        each = {name: {k: r[k] for k in ("ok", "error", "args")} for name, r in results.items()}
        print(json.dumps({"ok": ok, "vllm_version": version, "error": None, "results": each}))
    else:
        print(json.dumps(results["argv"]))
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
