#!/usr/bin/env python3
"""How long a command goes without printing a line (issue 20: a newcomer's first run should show progress at
least every 30 s). Not a timed test: a figure for benchmarks/README.md.

    python3 benchmarks/progress_gaps.py [--top 10] [--log FILE] -- COMMAND...

Runs COMMAND with its stdout and stderr on one pipe, as CI or `| tee` sees them, stamps each line as it
arrives, copies it through (and to --log with the time), then prints the longest silences: how long, and the
line printed before each. Exits with COMMAND's exit status.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time


def gaps(stamped: list[tuple[float, str]], started: float, ended: float) -> list[tuple[float, str]]:
    """(seconds without output, the line before) for every silence, the longest first; the first silence is
    from the start, the last one up to the end."""
    times = [started, *(t for t, _ in stamped), ended]
    before = ["(start)", *(line for _, line in stamped)]
    return sorted(
        ((b - a, line) for a, b, line in zip(times[:-1], times[1:], before, strict=True)), key=lambda g: -g[0]
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--log", help="also write each line with its time since the start here")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    log = open(args.log, "w") if args.log else None  # noqa: SIM115 - open for the whole run
    started = time.monotonic()
    stamped: list[tuple[float, str]] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            now = time.monotonic()
            line = raw.decode(errors="replace").rstrip("\n")
            stamped.append((now, line))
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            if log:
                log.write(f"{now - started:9.1f} {line}\n")
    ended = time.monotonic()
    if log:
        log.close()
    longest = gaps(stamped, started, ended)
    print(f"\nprogress_gaps: {len(stamped)} lines in {ended - started:.0f} s; exit {proc.returncode}")
    print(
        f"progress_gaps: the {min(args.top, len(longest))} longest silences (seconds, then the line before):"
    )
    for seconds, line in longest[: args.top]:
        print(f"  {seconds:7.1f}  {line[:150]}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
