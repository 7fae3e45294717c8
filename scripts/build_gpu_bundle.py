#!/usr/bin/env python3
"""Build an air-gapped CUDA vLLM bundle for a GPU host that already has torch, from a committed lock file.

    scripts/build_gpu_bundle.py build [--lock scripts/gpu-bundle/vllm-0.26.0-cu130-cp312.lock] \
        [--cache DIR] [--out DIR] [--part-mib 55]
    scripts/build_gpu_bundle.py lock --names NAMES.txt --lock LOCK [--cache DIR]

`build` downloads every wheel the lock names with pip (`--require-hashes`, so a different file is an error;
skipped when the cache already holds every locked hash), unpacks them into one tree as `pip install --no-deps
--target` lays them out, strips what a Hopper host never loads, and packs the tree as tar.xz split into parts
below --part-mib MiB (`bundle.tar.xz.partNN`, plus `SHA256SUMS`). On the host: `cat bundle.tar.xz.part* | xz
-dc | tar -x -C DIR`, then `PYTHONPATH=DIR/site python3 -m vllm.entrypoints.cli.main serve ...`.

Two builds of one lock give byte-identical parts on any machine: the tree holds the wheels' own files only
(pip's install adds `direct_url.json` with the cache's absolute path and `bin/` scripts whose shebang is
this machine's interpreter, so it is not used), and the archive takes its order, modes, owners and mtimes
from fixed rules, never from this machine (umask, clock, user). The xz stream is liblzma's preset 6, one
thread (`--xz-preset`, part of what must match between the two builds).

`lock` turns a list of `name==version` lines into the lock: each line with the sha256 of the wheel pip picks
for the target (cp312, manylinux x86_64). It is how the committed lock was made; run it again only to move
to another vLLM release.

Why a lock of exact versions and no resolver on the host: the host has no network and its torch is fixed
(2.11.0+cu130), so the bundle must hold exactly what vLLM imports at start minus what the host already has
(torch, transformers, numpy, ...). The names come from what pip resolved for vllm==0.26.0 with the host's
packages counted as installed (see the lock's header).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_LOCK = HERE / "gpu-bundle" / "vllm-0.26.0-cu130-cp312.lock"

# The host's interpreter: CPython 3.12 on x86-64 with glibc >= 2.35 (Ubuntu 24.04 has 2.39). pip matches a
# manylinux tag only when it is named exactly, so every tag the locked wheels carry is listed.
PYTHON_VERSION = "3.12"
PLATFORMS = tuple(
    ["manylinux1_x86_64", "manylinux2014_x86_64"] + [f"manylinux_2_{n}_x86_64" for n in range(17, 36)]
)

# Paths inside the installed tree that a Hopper host with CPython 3.12 never loads (about 450 MB of 730), by
# the locked project that installs them: FA2's kernels (Hopper runs FA3), the optional Rust front end, the
# Blackwell FMHA and deep_gemm headers (JIT-compiled only on SM100), deep_gemm's extension for other Pythons.
STRIP: Mapping[str, tuple[str, ...]] = {
    "vllm": (
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
        "vllm/vllm-rs",
        "vllm/third_party/fmha_sm100/cutlass",
        "vllm/third_party/deep_gemm/include",
        "vllm/third_party/deep_gemm/_C.cpython-310-x86_64-linux-gnu.so",
        "vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so",
        "vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so",
        "vllm/third_party/deep_gemm/_C.cpython-314-x86_64-linux-gnu.so",
    ),
}


def target_args() -> list[str]:
    """pip's options that pick wheels for the GPU host rather than for this machine."""
    args = ["--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp"]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    return args


def read_lock(path: Path) -> list[tuple[str, list[str]]]:
    """`(name==version, [sha256, ...])` of each requirement line of a lock (comments and blanks skipped)."""
    entries = []
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split()
        hashes = [o.removeprefix("--hash=sha256:") for o in options if o.startswith("--hash=sha256:")]
        if "==" not in requirement or not hashes:
            sys.exit(
                f"build_gpu_bundle: {path}:{lineno}: {line!r} is not 'name==version --hash=sha256:...'; "
                "regenerate the lock with `build_gpu_bundle.py lock`"
            )
        entries.append((requirement, hashes))
    if not entries:
        sys.exit(f"build_gpu_bundle: {path} names no requirement")
    return entries


def pip(args: Sequence[str]) -> None:
    command = [sys.executable, "-m", "pip", *args]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def _canonical(name: str) -> str:
    """A project name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download(lock: Path, cache: Path) -> list[Path]:
    """The lock's wheels in `cache`, checked against the lock's hashes (by pip when it downloads; a cache that
    already holds every locked hash is used as it is, so a rebuild needs no network)."""
    cache.mkdir(parents=True, exist_ok=True)
    # The cache may hold other files (an earlier lock's, another platform's): take the locked ones by hash.
    by_hash = {sha256(wheel): wheel for wheel in sorted(cache.glob("*.whl"))}
    if not all(any(h in by_hash for h in hashes) for _, hashes in read_lock(lock)):
        pip(["download", "--no-deps", "--require-hashes", *target_args(), "-d", str(cache), "-r", str(lock)])
        by_hash = {sha256(wheel): wheel for wheel in sorted(cache.glob("*.whl"))}
    wheels = []
    for requirement, hashes in read_lock(lock):
        found = [by_hash[h] for h in hashes if h in by_hash]
        if not found:
            sys.exit(f"build_gpu_bundle: no wheel in {cache} has the locked hash of {requirement}")
        wheels.append(found[0])
    return wheels


def installed_path(member: str) -> str | None:
    """Where `pip install --target` puts a wheel's member, relative to the target; None for what the host
    never imports: `<dist>.data/scripts` (pip rewrites their shebang to this machine's interpreter),
    `headers`, `data`. A member that would land outside the tree is an error."""
    parts = member.split("/")
    if parts[0].endswith(".data") and len(parts) > 2:
        if parts[1] not in ("purelib", "platlib"):
            return None
        parts = parts[2:]
    if not parts[-1] or member.startswith("/") or ".." in parts:
        sys.exit(f"build_gpu_bundle: wheel member {member!r} is not a relative file path")
    return "/".join(parts)


def install(wheels: Sequence[Path], site: Path) -> None:
    """Unpack the wheels into `site` (in the lock's order, a later file replacing an earlier one, as pip
    does), each file 0o755 if the wheel marks it executable, else 0o644, whatever this machine's umask."""
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                rel = None if info.is_dir() else installed_path(info.filename)
                if rel is None:
                    continue
                target = site / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
                target.chmod(0o755 if (info.external_attr >> 16) & 0o111 else 0o644)


def strip_paths(lock: Path) -> tuple[str, ...]:
    """The STRIP paths of the projects the lock names."""
    projects = {_canonical(requirement.split("==")[0]) for requirement, _ in read_lock(lock)}
    return tuple(rel for project, paths in STRIP.items() if project in projects for rel in paths)


def strip(site: Path, paths: Sequence[str]) -> int:
    """Delete `paths` from an installed tree; returns the bytes removed. A path missing is an error: it means
    the lock moved to a release laid out differently and STRIP must be looked at again."""
    removed = 0
    for rel in paths:
        path = site / rel
        if not path.exists():
            sys.exit(f"build_gpu_bundle: {rel} is not in the installed vllm; update STRIP for this release")
        if path.is_dir():
            removed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
        else:
            removed += path.stat().st_size
            path.unlink()
    return removed


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # Reproducible archive: no owner, mtime or umask-made mode from this machine.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    if info.isfile():
        info.mode = 0o755 if info.mode & 0o100 else 0o644
    return info


def pack(tree: Path, out: Path, part_bytes: int, preset: int = 6) -> list[Path]:
    """tar.xz of `tree` (as `site/...`) at xz `preset`, split into parts of at most `part_bytes`."""
    out.mkdir(parents=True, exist_ok=True)
    # an earlier build's parts would join this one's on the host
    for stale in out.glob("bundle.tar.xz.part*"):
        stale.unlink()
    archive = out / "bundle.tar.xz"
    files = sorted(
        (p for p in tree.rglob("*") if p.is_file() or p.is_symlink()),
        key=lambda p: p.relative_to(tree).as_posix(),
    )
    with tarfile.open(archive, "w:xz", preset=preset, format=tarfile.PAX_FORMAT) as tar:
        for path in files:
            tar.add(path, arcname=str(Path("site") / path.relative_to(tree)), filter=_reset, recursive=False)
    parts = []
    with archive.open("rb") as handle:
        index = 0
        while chunk := handle.read(part_bytes):
            part = out / f"bundle.tar.xz.part{index:02d}"
            part.write_bytes(chunk)
            parts.append(part)
            index += 1
    archive.unlink()
    sums = "".join(f"{sha256(p)}  {p.name}\n" for p in parts)
    (out / "SHA256SUMS").write_text(sums, encoding="utf-8")
    return parts


def build(args: argparse.Namespace) -> int:
    lock, cache, out = Path(args.lock), Path(args.cache), Path(args.out)
    wheels = download(lock, cache)
    site = out / "site"
    if site.exists():
        shutil.rmtree(site)
    install(wheels, site)
    removed = strip(site, strip_paths(lock))
    size = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
    print(f"installed {len(wheels)} wheels, stripped {removed / 1e6:.0f} MB, tree {size / 1e6:.0f} MB")
    parts = pack(site, out, args.part_mib << 20, args.xz_preset)
    total = sum(p.stat().st_size for p in parts)
    print(f"packed {len(parts)} parts, {total / 1e6:.1f} MB: " + " ".join(p.name for p in parts))
    if not args.keep_tree:
        shutil.rmtree(site)
    return 0


def lock(args: argparse.Namespace) -> int:
    names = [
        line.split("#", 1)[0].strip()
        for line in Path(args.names).read_text(encoding="utf-8").splitlines()
        if line.split("#", 1)[0].strip()
    ]
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    pip(["download", "--no-deps", *target_args(), "-d", str(cache), *names])
    by_name: dict[tuple[str, str], Path] = {}
    for wheel in cache.glob("*.whl"):
        parts = wheel.name.split("-")
        key = (_canonical(parts[0]), parts[1])
        if key in by_name:
            sys.exit(
                f"build_gpu_bundle: {cache} holds two wheels of {key[0]} {key[1]}; lock into an empty cache"
            )
        by_name[key] = wheel
    lines = [Path(args.header).read_text(encoding="utf-8").rstrip("\n")] if args.header else []
    for name in names:
        project, version = name.split("==")
        key = (_canonical(project), version)
        if key not in by_name:
            sys.exit(f"build_gpu_bundle: pip saved no wheel for {name} in {cache}")
        lines.append(f"{name} --hash=sha256:{sha256(by_name[key])}")
    Path(args.lock).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.lock}: {len(names)} requirements")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="download, install, strip and pack the bundle")
    b.add_argument("--lock", default=str(DEFAULT_LOCK))
    b.add_argument("--cache", default=os.environ.get("VLLM_FLEET_BUNDLE_CACHE", "build/gpu-bundle/wheels"))
    b.add_argument("--out", default="build/gpu-bundle")
    # 55: one call to the GPU host carries 64 MiB, the repository's tree included.
    b.add_argument("--part-mib", type=int, default=55, help="largest part in MiB (default 55)")
    b.add_argument("--keep-tree", action="store_true", help="keep the installed tree beside the parts")
    # 1 packs about 6 times faster than 6 on a busy machine, for about a quarter more bytes (one more part)
    b.add_argument("--xz-preset", type=int, default=6, choices=range(10), help="xz preset (default 6)")
    b.set_defaults(handler=build)
    lk = sub.add_parser("lock", help="write the lock (name==version --hash) from a list of name==version")
    lk.add_argument("--names", required=True)
    lk.add_argument("--lock", required=True)
    lk.add_argument("--header", help="a file of comment lines to put first")
    lk.add_argument("--cache", default="build/gpu-bundle/wheels")
    lk.set_defaults(handler=lock)
    args = parser.parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
