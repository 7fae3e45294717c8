#!/usr/bin/env python3
"""logcheck over hostile logs (issue 31): time and peak memory, before and after, in one run.

    .venv/bin/python benchmarks/logcheck_hostile.py [--before 437d893] [--timeout 60] [--mb 100]

Inputs, written to a temporary folder:

- `line-100mb`: one line of --mb MiB (`INFO vLLM API server version 0.9.0 ` then `z` to the size), read by
  `parse_file`, the streaming reader `vllm-fleet logcheck FILE` uses;
- `<pattern>: N x unit`: one line per pattern that backtracked, N copies of one character (or short unit)
  between what makes its handler read the line and an end that fails the pattern: the start banner's version
  (`▀` x N, then `version x`), the custom all-reduce reason (blanks), `KV Transfer metrics` fields (`a`, no
  `=`), pydantic's input echo (blanks), the insufficient-memory line (`Free memory on device ` repeated), the
  backend name (`ATTN` repeated), at N = 20,000 and 100,000; read by `parse_log`.

`before` is logcheck as it was at --before (verify/logcheck.py read with `git show` and imported from a
temporary file, so both revisions run in the same run on the same machine); `after` is this checkout. Each
measurement runs in its own interpreter: peak RSS is that child's VmHWM (ru_maxrss would carry
the parent's across fork and exec); a child still running after
--timeout seconds is killed and reported as `> T s`. Not a timed test: nothing fails on a number.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import importlib.util, json, re, sys, time
revision, mode, path = sys.argv[1], sys.argv[2], sys.argv[3]
if revision == "after":
    from vllm_fleet.verify import logcheck
else:
    spec = importlib.util.spec_from_file_location("logcheck_before", revision)
    # dataclasses look the module up in sys.modules
    logcheck = sys.modules["logcheck_before"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(logcheck)
text = None if mode == "file" else open(path, encoding="utf-8").read()
start = time.perf_counter()
report = logcheck.parse_file(path) if mode == "file" else logcheck.parse_log(text)
seconds = time.perf_counter() - start
peak = int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1))
print(json.dumps({"seconds": seconds, "maxrss_kib": peak,
                  "version": report.version, "cut": getattr(report, "lines_cut", None)}))
"""

# (name, the line's start, the unit repeated N times, the line's end): each line holds its handler's needle
# and fails the pattern at its end, which is where a backtracking regex pays (a match ends the search early).
BACKTRACKING = (
    ("banner version", "", "\u2580", " version x"),
    ("custom all-reduce reason", "WARNING Custom allreduce is disabled because x", " ", "y"),
    ("KV Transfer fields", "INFO KV Transfer metrics: ", "a", "x"),
    (
        "pydantic input echo",
        "Traceback (most recent call last)\npydantic_core.ValidationError: 1 validation error for X:\n  x",
        " ",
        "x",
    ),
    ("free memory", "", "Free memory on device ", "less than desired GPU memory"),
    ("backend name", "INFO Using X", "ATTN", " backend"),
)


def write_inputs(folder: Path, mib: int) -> list[tuple[str, str, Path]]:
    """(name, mode, path) of every input."""
    inputs = []
    line = folder / "line-100mb.log"
    with line.open("w", encoding="utf-8") as handle:
        handle.write("INFO vLLM API server version 0.9.0 ")
        for _ in range(mib):
            handle.write("z" * (1 << 20))
        handle.write("\n")
    inputs.append((f"one line of {mib} MiB", "file", line))
    for name, start, unit, end in BACKTRACKING:
        for count in (20_000, 100_000):
            path = folder / f"{name.replace(' ', '-')}-{count}.log"
            path.write_text(start + unit * count + end + "\n", encoding="utf-8")
            inputs.append((f"{name}: {count:,} x {unit.strip() or 'blank'!r}", "text", path))
    return inputs


def measure(revision: str, mode: str, path: Path, timeout: float) -> dict[str, object]:
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, revision, mode, str(path)],
            capture_output=True, text=True, timeout=timeout, check=True, cwd=ROOT,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"seconds": None, "wall": time.perf_counter() - started}
    except subprocess.CalledProcessError as exc:
        return {"seconds": None, "error": exc.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout)


def shown(result: dict[str, object], timeout: float) -> str:
    if result.get("error"):
        return f"failed: {result['error']}"
    if result["seconds"] is None:
        return f"> {timeout:.0f} s (killed)"
    return f"{result['seconds']:8.3f} s  {int(result['maxrss_kib']) / 1024:7.1f} MiB"  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="437d893", help="the revision to compare with (git)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per measurement")
    parser.add_argument("--mb", type=int, default=100, help="MiB of the one-line file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="logcheck-hostile-") as tmp:
        folder = Path(tmp)
        before = folder / "logcheck_before.py"
        before.write_text(
            subprocess.run(
                ["git", "show", f"{args.before}:src/vllm_fleet/verify/logcheck.py"],
                capture_output=True, text=True, check=True, cwd=ROOT,
            ).stdout,
            encoding="utf-8",
        )  # fmt: skip
        print(
            f"# before = {args.before} (verify/logcheck.py), after = this checkout; "
            f"timeout {args.timeout:.0f} s"
        )
        print(f"{'input':<52} {'before':>22}   {'after':>22}")
        for name, mode, path in write_inputs(folder, args.mb):
            old = measure(str(before), mode, path, args.timeout)
            new = measure("after", mode, path, args.timeout)
            print(f"{name:<52} {shown(old, args.timeout):>22}   {shown(new, args.timeout):>22}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
