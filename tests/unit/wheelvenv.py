"""A fresh venv holding only the wheel `pip wheel` builds from this clone (uv installs it and its
dependencies from uv's cache in seconds): what a user who runs `pip install vllm_fleet-*.whl` has. Shared by
tests/unit/test_collection.py and tests/integration/test_collection_lab.py; `uv_build` also by
tests/unit/test_execution_environment.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vllm_fleet.lab.build import file_lock

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


@contextmanager
def in_tree_build() -> Iterator[None]:
    """Held while a build writes into the clone (setuptools' build/ and src/*.egg-info): the suite's two
    workers may build the wheel or the sdist at the same time, and two such builds break each other."""
    with file_lock(REPO / "build" / ".in-tree-build.lock"):
        yield


def uv_build(kind: str, out: Path, timeout: int) -> subprocess.CompletedProcess[str]:
    """`uv build --<kind>` (sdist or wheel) of this clone into `out`. uv's temporary folder is `out`'s parent:
    uv leaves a 0-byte `uv-setuptools-*.lock` in it after each setuptools build (astral-sh/uv#14385), and
    /tmp kept one per build after the suite (issue 32)."""
    with in_tree_build():
        return subprocess.run(
            [str(BIN / "uv"), "build", f"--{kind}", "-q", "--out-dir", str(out), str(REPO)],
            cwd=out.parent, env={**os.environ, "TMPDIR": str(out.parent)},
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip


def build_wheel_venv(work: Path, timeout: int = 600) -> tuple[Path, Path]:
    """`(wheel, venv)` under `work`."""
    with in_tree_build():
        build = subprocess.run(
            [str(BIN / "pip"), "wheel", "--no-deps", "-q", "-w", str(work / "dist"), str(REPO)],
            cwd=work, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = (work / "dist").glob("vllm_fleet-*.whl")
    venv = work / "venv"
    for cmd in (
        [str(BIN / "uv"), "venv", "-q", "-p", sys.executable, str(venv)],
        [str(BIN / "uv"), "pip", "install", "-q", "-p", str(venv / "bin" / "python"), str(wheel)],
    ):
        done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=timeout, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    return wheel, venv
