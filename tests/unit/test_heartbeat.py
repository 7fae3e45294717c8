"""The suite's heartbeat (tests/unit/heartbeat.py), run by a real pytest in a subprocess, in one process and
on two pytest-xdist workers as the suite runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def run_pytest(tmp_path: Path, workers: list[str]) -> subprocess.CompletedProcess:
    """A real pytest over tmp_path with the heartbeat plugin beating after 1 s without a line."""
    env = {**os.environ, "PYTHONPATH": str(HERE), "VLLM_FLEET_TEST_HEARTBEAT_S": "1"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "heartbeat",
            "-p",
            "no:cacheprovider",
            *workers,
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "two-workers"])
def test_a_long_test_is_named_while_it_runs_and_a_quick_run_prints_nothing_more(tmp_path, workers):
    (tmp_path / "test_timed.py").write_text(
        "import time\n\ndef test_quick():\n    pass\n\ndef test_slow():\n    time.sleep(3.6)\n"
    )
    run = run_pytest(tmp_path, workers)
    # (in one process the line can follow a "." that pytest had not flushed yet)
    beats = [ln.lstrip(".") for ln in run.stdout.splitlines() if "... still running: " in ln]
    # about one a second while test_slow sleeps, each naming it and how long it has run
    assert 2 <= len(beats) <= 4, run.stdout
    assert all(ln.startswith(" still running: test_timed.py::test_slow (") for ln in beats), beats
    assert beats[-1].endswith(" s)") and int(beats[-1].rsplit("(", 1)[1].split()[0]) >= 2, beats


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "two-workers"])
def test_a_row_of_dots_without_an_end_of_line_still_gets_a_line(tmp_path, workers):
    # eight tests of 0.6 s: each ends well within the 1 s beat, but their dots stay on one unfinished row
    (tmp_path / "test_row.py").write_text(
        "import time\nimport pytest\n\n@pytest.mark.parametrize('i', range(8))\n"
        "def test_short(i):\n    time.sleep(0.6)\n"
    )
    run = run_pytest(tmp_path, workers)
    assert any("... still running: test_row.py::test_short[" in line for line in run.stdout.splitlines()), (
        run.stdout
    )
