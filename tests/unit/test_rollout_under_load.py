"""benchmarks/rollout_under_load.py's keep_loading, with real processes standing in for the rollout and the
load (`sleep`, `sh`): a load that ends before its host's turn has been over for `after_s` is continued (and
then ends without waiting for the rest of the rollout, where the next host's load follows), one that
outlasts it is not, a rollout that ends without that turn being over starts no more load, and a
continuation still running when the wait gives up is killed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import rollout_under_load as bench  # noqa: E402  benchmarks/rollout_under_load.py


def process(seconds: float, said: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["sh", "-c", f"sleep {seconds}; echo {said}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def sleeper(seconds: float) -> subprocess.Popen[str]:
    """A process that only waits: killing it leaves nothing behind (an `sh -c` would leave its sleep)."""
    return subprocess.Popen(["sleep", str(seconds)], stdout=subprocess.PIPE, text=True)


def back_after(folder: Path, seconds: float) -> None:
    """The rollout's post-verification hook, `seconds` from now: the loaded host's turn is over."""
    threading.Timer(seconds, lambda: (folder / "back").write_text("back\n")).start()


def test_a_load_that_ends_before_the_loaded_host_is_back_is_continued_past_it(tmp_path: Path) -> None:
    started = time.monotonic()
    back_after(tmp_path, 1.0)
    more = []

    def again(chunk: int) -> subprocess.Popen[str]:
        more.append(chunk)
        return process(0.4, f"run{chunk}")

    rollout = sleeper(30)
    try:
        loading = bench.keep_loading(tmp_path / "back", rollout, process(0.3, "run0"), again, after_s=0.5)
        returned = time.monotonic()
        # the load is over once it covered the return: the rollout goes on, to the next host's turn
        assert rollout.poll() is None
    finally:
        rollout.kill()
    assert loading.outputs[0] == "run0\n" and len(loading.outputs) >= 3, loading.outputs
    assert loading.last_rc == 0
    assert more == list(range(1, len(loading.outputs)))
    assert loading.back_at is not None and loading.back_at - started >= 1.0
    # the last run ended at least after_s past the return
    assert returned - loading.back_at >= 0.5


def test_a_load_that_outlasts_the_return_is_not_continued(tmp_path: Path) -> None:
    back_after(tmp_path, 0.3)

    def again(chunk: int) -> subprocess.Popen[str]:
        raise AssertionError(f"run {chunk} started, the first outlasted the return")

    loading = bench.keep_loading(tmp_path / "back", process(0.5, "rollout"), process(1.5, "run0"), again, 0.5)
    assert loading.outputs == ["run0\n"] and loading.back_at is not None


def test_a_rollout_that_ends_without_the_loaded_hosts_return_starts_no_more_load(tmp_path: Path) -> None:
    def again(chunk: int) -> subprocess.Popen[str]:
        raise AssertionError(f"run {chunk} started after a failed turn")

    loading = bench.keep_loading(tmp_path / "back", process(0.2, "rollout"), process(0.8, "run0"), again, 0.5)
    assert loading.outputs == ["run0\n"] and loading.back_at is None


def test_a_continuation_still_running_when_the_wait_gives_up_is_killed(tmp_path: Path) -> None:
    started: list[subprocess.Popen[str]] = []

    def again(chunk: int) -> subprocess.Popen[str]:
        started.append(sleeper(30))
        return started[-1]

    rollout = sleeper(30)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            bench.keep_loading(tmp_path / "back", rollout, process(0.2, "run0"), again, 0.5, timeout=1.5)
    finally:
        rollout.kill()  # the benchmark's own caller kills the rollout it started
    (continuation,) = started
    assert continuation.wait(timeout=5) == -9  # SIGKILL
