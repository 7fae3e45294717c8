"""scripts/build_gpu_bundle.py: the committed lock and the packing (the download and install are pip's; the
bundle made from this lock served vLLM on an H200: tests/fixtures/gpu-h200-vllm-0.26.0/README.md)."""

from __future__ import annotations

import hashlib
import importlib.util
import lzma
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("build_gpu_bundle", ROOT / "scripts" / "build_gpu_bundle.py")
bundle = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bundle)


def test_lock_pins_every_wheel_by_hash() -> None:
    entries = bundle.read_lock(bundle.DEFAULT_LOCK)
    names = {req.split("==")[0].lower() for req, _ in entries}
    assert len(entries) == len(names) == 86
    versions = dict(req.split("==") for req, _ in entries)
    assert versions["vllm"] == "0.26.0"
    assert versions["flashinfer-python"] == "0.6.14" and versions["apache-tvm-ffi"] == "0.1.10"
    assert all(len(h) == 64 for _, hashes in entries for h in hashes)
    # the host's own packages stay out: torch 2.11.0+cu130 is what vLLM 0.26.0 pins
    assert not names & {"torch", "torchvision", "transformers", "numpy", "triton", "typing-extensions"}


def test_lock_names_are_the_shared_list_plus_the_two_unlisted_imports() -> None:
    shared = ROOT / "tests" / "fixtures" / "gpu-h200-vllm-0.26.0" / "deps-vllm-0.26.0.txt"
    listed = {bundle._canonical(line.split("==")[0]) for line in shared.read_text().split()}
    locked = {bundle._canonical(req.split("==")[0]) for req, _ in bundle.read_lock(bundle.DEFAULT_LOCK)}
    assert locked - listed == {"vllm", "flashinfer-python", "apache-tvm-ffi"}
    assert listed <= locked


def test_a_bad_lock_line_names_the_fix(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    lock.write_text("vllm==0.26.0\n")
    with pytest.raises(SystemExit, match="regenerate the lock"):
        bundle.read_lock(lock)


def test_target_is_the_hosts_python_and_glibc() -> None:
    args = bundle.target_args()
    assert args[:5] == ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
    platforms = set(args[6::2])
    assert {"manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_31_x86_64"} <= platforms


def test_strip_removes_what_hopper_never_loads_and_refuses_a_changed_layout(tmp_path: Path) -> None:
    for rel in bundle.STRIP:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith((".so", "vllm-rs")):
            path.write_bytes(b"x" * 10)
        else:
            path.mkdir(parents=True, exist_ok=True)
            (path / "a.hpp").write_bytes(b"y" * 5)
    keep = tmp_path / "vllm" / "vllm_flash_attn" / "_vllm_fa3_C.abi3.so"
    keep.write_bytes(b"fa3")
    assert bundle.strip(tmp_path) == 6 * 10 + 2 * 5
    assert keep.exists() and not (tmp_path / "vllm" / "vllm-rs").exists()
    with pytest.raises(SystemExit, match="update STRIP"):
        bundle.strip(tmp_path)


def test_pack_is_reproducible_and_splits_into_parts(tmp_path: Path) -> None:
    tree = tmp_path / "site"
    (tree / "pkg").mkdir(parents=True)
    # incompressible data, so the archive really spans several parts
    (tree / "pkg" / "data.bin").write_bytes(hashlib.shake_256(b"seed").digest(300_000))
    (tree / "pkg" / "__init__.py").write_text("x = 1\n")
    first = bundle.pack(tree, tmp_path / "a", 100_000)
    second = bundle.pack(tree, tmp_path / "b", 100_000)
    assert len(first) == 4 and all(p.stat().st_size <= 100_000 for p in first)
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]
    assert (tmp_path / "a" / "SHA256SUMS").read_text() == (tmp_path / "b" / "SHA256SUMS").read_text()
    joined = tmp_path / "joined.tar.xz"
    joined.write_bytes(b"".join(p.read_bytes() for p in first))
    with tarfile.open(fileobj=lzma.open(joined)) as tar:
        assert sorted(tar.getnames()) == ["site/pkg/__init__.py", "site/pkg/data.bin"]
        assert {m.mtime for m in tar.getmembers()} == {0}
    # the host's tools read it: sha256sum -c, then cat | xz -dc | tar -x
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path / "a", capture_output=True)
    assert check.returncode == 0, check.stdout
    out = tmp_path / "unpacked"
    out.mkdir()
    subprocess.run(f"cat {tmp_path}/a/bundle.tar.xz.part* | xz -dc | tar -x -C {out}", shell=True, check=True)
    assert (out / "site" / "pkg" / "__init__.py").read_text() == "x = 1\n"


def test_help_runs() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_gpu_bundle.py"), "--help"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and "build" in result.stdout and "lock" in result.stdout
