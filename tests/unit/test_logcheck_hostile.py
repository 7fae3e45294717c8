"""logcheck over hostile logs (issue 31): lines built to make a regex backtrack, a 100 MB line, garbled
numbers.

The rewritten readers are compared with the regexes they replace (kept here as the reference, verbatim from
verify/logcheck.py at 437d893) over every string of a small alphabet that reaches them, so the rewrite changes
the cost, not the answer.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_fleet.verify.logcheck import MAX_LINE_CHARS, LogParser, parse_file, parse_lines, parse_log
from vllm_fleet.verify.logcheck.lines import (
    _number,
    _transfer_fields,
    backend_name,
    car_disabled_reason,
    without_pydantic_input,
)
from vllm_fleet.verify.logcheck.patterns import _BACKEND_NAME, _VERSION_PATTERNS

OLD_BANNER = re.compile(r"[\u2580-\u259f].*\bversion\s+v?(?P<v>\d+\.\d+\.\d+[\w.+-]*)")
OLD_CAR = re.compile(
    r"Custom allreduce is disabled (?:because |due to )(?P<why>.*?)(?:\. To silence.*|\.?\s*$)"
)
OLD_TRANSFER = re.compile(r"(?P<k>[^=]+?)=(?P<v>-?[\d.]+(?:e[-+]?\d+)?)(?:, |$)")
OLD_PYDANTIC = re.compile(r"\s*\[type=\w+, input_value=.*$")
OLD_BACKEND_NAME = re.compile(
    r"Using (?P<n>[A-Z][A-Z0-9_]*(?:ATTN|FLASHINFER|SDPA|MLA|ATTENTION|XFORMERS)[A-Z0-9_]*) backend\."
)


def strings(alphabet: list[str], longest: int) -> list[str]:
    return ["".join(p) for n in range(longest + 1) for p in itertools.product(alphabet, repeat=n)]


def test_banner_version_as_the_regex_it_replaces() -> None:
    banner = _VERSION_PATTERNS[-1]
    for text in strings(["\u2584", "x", " ", "version ", "1.2.3", "_", "-v"], 5):
        old = OLD_BANNER.search(text)
        new = banner.search(text)
        assert (old and old.group("v")) == (new and new.group("v")), text


def test_custom_allreduce_reason_as_the_regex_it_replaces() -> None:
    for tail in strings(["a", " ", ".", ". To silence", "\t", "x."], 5):
        line = "WARNING Custom allreduce is disabled because " + tail
        old = OLD_CAR.search(line)
        assert (old and old.group("why")) == car_disabled_reason(line), line


def test_transfer_fields_and_pydantic_input_as_the_regexes_they_replace() -> None:
    for body in strings(["a", "=", "1", ", ", ".", "e", "-", " "], 5):
        old = {m.group("k"): _number(m.group("v")) for m in OLD_TRANSFER.finditer(body)}
        assert _transfer_fields(body) == old, body
    for text in strings(["a", " ", "\t", "[type=x, input_value=", "[type=", "]"], 4):
        assert without_pydantic_input(text) == OLD_PYDANTIC.sub("", text), text


def test_backend_name_as_the_regex_it_replaces() -> None:
    for name in strings(["A", "ATTN", "SDPA", "_", "1", " backend.", "x"], 4):
        line = "Using " + name
        old = OLD_BACKEND_NAME.search(line)
        new = _BACKEND_NAME.search(line)
        assert (old and old.group("n")) == (new.group("n") if new and backend_name(new) else None), line


# A line of 100,000 copies of one unit between what makes a handler read it and an end that fails its pattern,
# for each pattern that backtracked (as benchmarks/logcheck_hostile.py measures them). The version banner took
# 4.9 s at 20,000 and over two minutes at 100,000 (issue 31).
HOSTILE = [
    ("", "\u2580", " version x"),
    ("", "\u2580", "Initializing a V1 LLM engine (vx"),
    ("WARNING Custom allreduce is disabled because x", " ", "y"),
    ("INFO KV Transfer metrics: ", "a", "x"),
    (
        "Traceback (most recent call last)\npydantic_core.ValidationError: 1 validation error for X:\n  x",
        " ",
        "x",
    ),
    ("", "Free memory on device ", "less than desired GPU memory"),
    ("INFO Using X", "ATTN", " backend"),
    ("Per-position acceptance rate: ", "1, ", "x"),
    ("", "(x pid=1) ", "INFO Avg prompt throughput: 1 tokens/s"),
    ("max_seq_len=", "9", "x"),
]


@pytest.mark.parametrize(("start", "unit", "end"), HOSTILE, ids=[f"{s[:12]}{u[:6]!r}" for s, u, _ in HOSTILE])
def test_backtracking_lines_read_in_linear_time(start: str, unit: str, end: str) -> None:
    for line in (start + unit * 100_000 + end, unit * 100_000 + start + end, start + end + unit * 100_000):
        started = time.monotonic()
        report = parse_log(line)
        assert time.monotonic() - started < 3, (start, unit, end)
        assert report.lines_read == line.count("\n") + 1


def test_a_number_no_vllm_prints_makes_the_line_say_nothing() -> None:
    """`1.2.3 GiB` and 5,000-digit counts raised ValueError out of the parser (a traceback in logcheck)."""
    lines = [
        "Available KV cache memory: 1.2.3 GiB",
        "Maximum concurrency for 2,048 tokens per request: 1.2.3x",
        "SpecDecoding metrics: Mean acceptance length: 1.2.3, Avg Draft acceptance rate: 1..%",
        "Speculative metrics: Draft acceptance rate: ..., System efficiency: 1.1.1",
        "Prefix cache hit rate: GPU: 1.1.1%, CPU: 2%",
        "max_seq_len=" + "9" * 5000,
        "Engine \u00b2: Avg prompt throughput: \u00b2 tokens/s, Running: 1 reqs",
        "# GPU blocks: " + "7" * 5000,
        "Binding worker subprocess (local_rank=" + "1" * 5000 + ", gpu_index=0) to NUMA node 0",
    ]
    report = parse_log("\n".join(lines) + "\nmax_seq_len=4096\n")
    assert report.available_kv_cache_gib is None and report.max_concurrency is None
    assert report.gpu_blocks is None and report.numa_bindings == []
    assert report.max_model_len == 4096  # the readable line after them is read
    assert (
        report.stats is not None
        and report.stats["engine"] is None
        and "prompt_throughput" not in report.stats
    )


def test_a_long_line_is_cut_and_counted_and_the_next_line_read(tmp_path: Path) -> None:
    long = "INFO vLLM API server version 0.9.0 " + "x" * (3 * MAX_LINE_CHARS) + " max_seq_len=1234"
    text = "start\n" + long + "\nINFO Application startup complete.\n"
    for report in (parse_log(text), parse_lines(text.splitlines(keepends=True))):
        assert report.lines_cut == 1 and report.lines_read == 3
        assert report.version == "0.9.0"  # in the first MiB
        assert report.max_model_len is None  # past the cut
        assert report.ready is True
        assert len(report.evidence["version"]) == MAX_LINE_CHARS
    parser = LogParser()
    parser.feed(long)
    assert parser.finish().lines_cut == 1
    exact = "y" * MAX_LINE_CHARS
    assert parse_log(exact + "\n" + exact).lines_cut == 0


# VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork and exec, so a child of a 200 MiB pytest
# reported 209 MiB in CI whatever it read. VmHWM belongs to the new process's own memory.
PEAK = """
import json, re, sys, time
from vllm_fleet.verify.logcheck import parse_file
started = time.monotonic()
report = parse_file(sys.argv[1])
with open("/proc/self/status", encoding="ascii") as status:
    peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1))
print(json.dumps({"s": time.monotonic() - started, "rss_kib": peak, "cut": report.lines_cut,
                  "version": report.version}))
"""


def test_a_100_mb_line_reads_in_bounded_time_and_memory(tmp_path: Path) -> None:
    """935 MiB peak before (issue 31); now the line streams by in 1 MiB reads after its first MiB."""
    path = tmp_path / "one-line.log"
    with path.open("w", encoding="utf-8") as handle:
        handle.write("INFO vLLM API server version 0.9.0 ")
        for _ in range(100):
            handle.write("z" * (1 << 20))
    done = subprocess.run(
        [sys.executable, "-c", PEAK, str(path)], capture_output=True, text=True, timeout=120, check=True
    )
    figures = json.loads(done.stdout)
    assert figures["cut"] == 1 and figures["version"] == "0.9.0"
    assert figures["rss_kib"] < 200 * 1024, figures  # the interpreter and the parser: about 35 MiB
    assert figures["s"] < 30, figures
    assert parse_file(path).lines_read == 1
