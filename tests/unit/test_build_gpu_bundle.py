"""scripts/build_gpu_bundle.py: the committed lock, the install and the packing (the download is pip's; the
bundle made from this lock served vLLM on an H200: tests/fixtures/gpu-h200-vllm-0.26.0/README.md and
tests/fixtures/gpu-h200-vllm-0.26.0-sliding/README.md)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import io
import json
import lzma
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("build_gpu_bundle", ROOT / "scripts" / "build_gpu_bundle.py")
bundle = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bundle)


def test_lock_pins_every_wheel_by_hash() -> None:
    entries = bundle.read_lock(bundle.DEFAULT_LOCK)
    names = {req.split("==")[0].lower() for req, _ in entries}
    assert len(entries) == len(names) == 87
    versions = dict(req.split("==") for req, _ in entries)
    assert versions["vllm"] == "0.26.0"
    assert versions["flashinfer-python"] == "0.6.14" and versions["apache-tvm-ffi"] == "0.1.10"
    assert all(len(h) == 64 for _, hashes in entries for h in hashes)
    # the host's own packages stay out: torch 2.11.0+cu130 is what vLLM 0.26.0 pins
    assert not names & {"torch", "torchvision", "transformers", "numpy", "triton", "typing-extensions"}


def test_lock_names_are_the_shared_list_plus_the_unlisted_imports() -> None:
    shared = ROOT / "tests" / "fixtures" / "gpu-h200-vllm-0.26.0" / "deps-vllm-0.26.0.txt"
    listed = {bundle._canonical(line.split("==")[0]) for line in shared.read_text().split()}
    locked = {bundle._canonical(req.split("==")[0]) for req, _ in bundle.read_lock(bundle.DEFAULT_LOCK)}
    # vLLM's two undeclared imports, and vllm-fleet's own logcheck dependency (the host lacks it)
    assert locked - listed == {"vllm", "flashinfer-python", "apache-tvm-ffi", "ahocorasick-rs"}
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
    assert bundle.strip_paths(bundle.DEFAULT_LOCK) == bundle.STRIP["vllm"]
    for rel in bundle.STRIP["vllm"]:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith((".so", "vllm-rs")):
            path.write_bytes(b"x" * 10)
        else:
            path.mkdir(parents=True, exist_ok=True)
            (path / "a.hpp").write_bytes(b"y" * 5)
    keep = tmp_path / "vllm" / "vllm_flash_attn" / "_vllm_fa3_C.abi3.so"
    keep.write_bytes(b"fa3")
    assert bundle.strip(tmp_path, bundle.STRIP["vllm"]) == 6 * 10 + 2 * 5
    assert keep.exists() and not (tmp_path / "vllm" / "vllm-rs").exists()
    with pytest.raises(SystemExit, match="update STRIP"):
        bundle.strip(tmp_path, bundle.STRIP["vllm"])


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


def make_wheel(folder: Path, name: str) -> Path:
    """A small wheel laid out as real ones are: a package with a native-looking executable member, a
    dist-info with a console script, a .data folder with purelib and scripts (as dill's and jmespath's)."""
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    members = {
        f"{name}/__init__.py": (b"VALUE = 1\n", 0o644),
        f"{name}/_native.so": (hashlib.shake_256(name.encode()).digest(20_000), 0o755),
        f"{name}-1.0.data/purelib/{name}_extra.py": (b"EXTRA = 2\n", 0o644),
        f"{name}-1.0.data/scripts/{name}-tool": (b"#!python\nprint('tool')\n", 0o755),
        f"{name}-1.0.dist-info/METADATA": (f"Name: {name}\nVersion: 1.0\n".encode(), 0o644),
        f"{name}-1.0.dist-info/WHEEL": (b"Wheel-Version: 1.0\nTag: py3-none-any\n", 0o644),
        f"{name}-1.0.dist-info/entry_points.txt": (
            f"[console_scripts]\n{name} = {name}:main\n".encode(),
            0o644,
        ),
        f"{name}-1.0.dist-info/RECORD": (b"", 0o644),
    }
    with zipfile.ZipFile(wheel, "w") as archive:
        for member, (data, mode) in members.items():
            info = zipfile.ZipInfo(member, date_time=(2024, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            archive.writestr(info, data)
    return wheel


def build_in(workdir: Path, wheels: list[Path], lock_text: str, umask: int, mtime: int) -> Path:
    """One build of `lock_text` in its own folders, from copies of the wheels with `mtime`, under `umask`."""
    cache = workdir / "wheel cache"
    cache.mkdir(parents=True)
    for wheel in wheels:
        copy = cache / wheel.name
        copy.write_bytes(wheel.read_bytes())
        os.utime(copy, (mtime, mtime))
    lock = workdir / "small.lock"
    lock.write_text(lock_text)
    old = os.umask(umask)
    try:
        argv = ["build", "--lock", str(lock), "--cache", str(cache), "--out", str(workdir / "out")]
        rc = bundle.main([*argv, "--part-mib", "1"])
    finally:
        os.umask(old)
    assert rc == 0
    return workdir / "out"


def test_two_builds_of_one_lock_are_byte_identical(tmp_path: Path) -> None:
    """Another machine is another cache path, umask, clock and interpreter: the parts must not change."""
    source = tmp_path / "source"
    source.mkdir()
    wheels = [make_wheel(source, "alpha"), make_wheel(source, "beta")]
    lock_text = "".join(f"{w.name.split('-')[0]}==1.0 --hash=sha256:{bundle.sha256(w)}\n" for w in wheels)
    first = build_in(tmp_path / "one", wheels, lock_text, 0o022, 1_600_000_000)
    second = build_in(tmp_path / "two" / "elsewhere", wheels, lock_text, 0o077, 1_700_000_000)
    assert (first / "SHA256SUMS").read_text() == (second / "SHA256SUMS").read_text()
    assert sorted(p.name for p in first.iterdir()) == sorted(p.name for p in second.iterdir())
    joined = b"".join(p.read_bytes() for p in sorted(first.glob("bundle.tar.xz.part*")))
    raw = lzma.decompress(joined)
    assert str(tmp_path).encode() not in raw  # no path of the building machine inside
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert "site/alpha/__init__.py" in members and "site/beta_extra.py" in members
    assert not [n for n in members if "/bin/" in n or n.endswith(("-tool", "direct_url.json"))]
    assert members["site/alpha/_native.so"].mode == 0o755 and members["site/alpha/__init__.py"].mode == 0o644
    assert {(m.uid, m.gid, m.uname, m.mtime) for m in members.values()} == {(0, 0, "", 0)}


def test_a_wheel_member_outside_the_tree_is_refused() -> None:
    assert bundle.installed_path("pkg-1.0.data/platlib/pkg/x.so") == "pkg/x.so"
    assert bundle.installed_path("pkg-1.0.data/scripts/tool") is None
    with pytest.raises(SystemExit, match="not a relative file path"):
        bundle.installed_path("pkg/../../etc/passwd")


def test_help_runs() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_gpu_bundle.py"), "--help"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and "build" in result.stdout and "lock" in result.stdout


GPU_RUN = ROOT / "tests" / "fixtures" / "gpu-h200-vllm-0.26.0"
# what the H200 host's python3 has (`python3 -m pip list --format=freeze` there, recorded by run-on-gpu.sh)
HOST_PACKAGES = ROOT / "tests" / "fixtures" / "gpu-h200-vllm-0.26.0-sliding" / "run1" / "host-pip-list.txt"
# Runs each command of the GPU procedure in one interpreter and writes the top-level modules it imported.
IMPORTS_OF = """
import json, sys
from vllm_fleet.cli import main
out, commands = sys.argv[1], json.loads(sys.argv[2])
codes = []
for argv in commands:
    try:
        codes.append(main(argv))
    except SystemExit as stop:
        codes.append(stop.code)
# modules loaded from files only: Cython registers file-less ones (cython_runtime, _cython_3_3_1)
files = {n.split(".")[0] for n, m in sys.modules.items() if getattr(m, "__file__", None)}
json.dump({"codes": codes, "modules": sorted(files)}, open(out, "w"))
"""


def test_the_gpu_procedure_imports_only_what_the_host_or_the_lock_holds(tmp_path: Path) -> None:
    """`python3 -m vllm_fleet` render, plan, verify and logcheck as run-on-gpu.sh runs them: every third-party
    module they import belongs to a distribution the host has or the lock installs (ahocorasick_rs did not:
    `ModuleNotFoundError` on the host before it was locked)."""
    seed = GPU_RUN / "seed-dense"
    commands = [
        ["--version"],
        [
            "render",
            "--vars",
            str(GPU_RUN / "vars-seed-dense.yml"),
            "--vllm-version",
            "0.26.0",
            "--model-config",
            str(GPU_RUN / "models" / "seed-dense-config.json"),
            "--json",
        ],
        [
            "plan",
            "--model-config",
            str(GPU_RUN / "models" / "seed-dense-config.json"),
            "--vllm-version",
            "0.26.0",
            "--kv-cache-memory-bytes",
            "10G",
            "--max-model-len",
            "65536",
            "--json",
        ],
        [
            "verify",
            "--plan",
            str(seed / "plan.json"),
            "--log",
            str(seed / "vllm.until-stop.log"),
            "--replay",
            str(seed / "answers.json"),
            "--host",
            "h200",
            "--json",
        ],
        ["logcheck", str(seed / "vllm.log"), "--json"],
    ]
    python = [sys.executable, "-c"]
    baseline, seen = tmp_path / "baseline.json", tmp_path / "seen.json"
    subprocess.run([*python, IMPORTS_OF, str(baseline), "[]"], check=True, capture_output=True)
    subprocess.run([*python, IMPORTS_OF, str(seen), json.dumps(commands)], check=True, capture_output=True)
    result = json.loads(seen.read_text())
    assert result["codes"] == [0, 0, 0, 0, 0]
    imported = set(result["modules"]) - set(json.loads(baseline.read_text())["modules"])
    third_party = sorted(m for m in imported if m not in sys.stdlib_module_names and m != "vllm_fleet")
    owners = importlib.metadata.packages_distributions()
    dists = {bundle._canonical(d) for m in third_party for d in owners.get(m, [f"unknown module {m}"])}
    host = {bundle._canonical(line.split("==")[0]) for line in HOST_PACKAGES.read_text().split()}
    locked = {bundle._canonical(req.split("==")[0]) for req, _ in bundle.read_lock(bundle.DEFAULT_LOCK)}
    assert dists <= host | locked, dists - host - locked
    assert {"ahocorasick-rs", "pyyaml", "packaging", "prometheus-client"} <= dists
    assert "ahocorasick-rs" in locked - host
