"""A real apt repository of Debian's NVIDIA driver packages for the nvidia_driver lab test.

On the controller: `apt-get install --download-only` with its own apt configuration and state directory (the
`non-free`, `non-free-firmware` and `contrib` components of Debian bookworm and bookworm-security, which the
controller's own apt does not list), resolved against the lab root filesystem's dpkg status, so exactly the
packages a lab host lacks are fetched. Two driver versions, because a pin change must upgrade in place:
535.261.03-1 (bookworm) and 535.309.01-0+deb12u1 (bookworm-security). The .debs are cached under the lab
cache (`nvidia-debs-bookworm-535/`) so later runs and CI do not download again.

Then `reprepro` builds a signed repository from them, laid out like Debian's archive (the older version in
`bookworm`, the newer in `bookworm-security`), signed by a throw-away ed25519 key made in a temporary
GNUPGHOME; the test serves it over HTTP inside the lab's network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from vllm_fleet.lab import build as lab_build

DEBIAN_MIRROR = os.environ.get("VLLM_FLEET_LAB_MIRROR", "http://deb.debian.org/debian")
SECURITY_MIRROR = os.environ.get("VLLM_FLEET_LAB_SECURITY_MIRROR", "http://deb.debian.org/debian-security")
SUITE = "bookworm"
SECURITY_SUITE = "bookworm-security"
# Debian's headless compute driver: the proprietary kernel module through DKMS, nvidia-smi, the CUDA driver
# library and the persistence daemon (what the role's `distribution` source installs on Debian).
PACKAGES = ("nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "nvidia-persistenced")
# the two real versions in Debian's archive on 2026-12-01
VERSIONS = ("535.261.03-1", "535.309.01-0+deb12u1")
CACHE_NAME = "nvidia-debs-bookworm-535-v1"
# packages whose version is the driver's: the download pins them like the role's preferences file does
PIN_GLOBS = "nvidia-* libnvidia-* libcuda1 firmware-nvidia-*"


def _run(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 900) -> str:
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=env, check=False, stdin=subprocess.DEVNULL
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} -> {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.stdout


def _apt_config(work: Path, status_file: Path, archives: Path) -> Path:
    """An apt configuration of its own: Debian bookworm with the components the driver lives in."""
    etc = work / "etc"
    for sub in ("sources.list.d", "preferences.d", "apt.conf.d", "trusted.gpg.d"):
        (etc / sub).mkdir(parents=True, exist_ok=True)
    (work / "state" / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (work / "cache").mkdir(parents=True, exist_ok=True)
    (archives / "partial").mkdir(parents=True, exist_ok=True)
    (etc / "sources.list").write_text("")
    components = "main contrib non-free non-free-firmware"
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    (etc / "sources.list.d" / "debian.sources").write_text(
        f"Types: deb\nURIs: {DEBIAN_MIRROR}\nSuites: {SUITE} {SUITE}-updates\nComponents: {components}\n"
        f"Signed-By: {keyring}\n\n"
        f"Types: deb\nURIs: {SECURITY_MIRROR}\nSuites: {SUITE}-security\nComponents: {components}\n"
        f"Signed-By: {keyring}\n"
    )
    conf = work / "apt.conf"
    conf.write_text(
        f'Dir::Etc "{etc}";\nDir::State "{work / "state"}";\nDir::State::status "{status_file}";\n'
        f'Dir::Cache "{work / "cache"}";\nDir::Cache::archives "{archives}";\nAPT::Architecture "amd64";\n'
        'APT::Install-Recommends "false";\nAcquire::Retries "3";\n'
    )
    return conf


def _download(dest: Path, status_file: Path) -> None:
    work = dest / ".apt"
    # a copy: apt takes dpkg's lock beside the status file, and the cached root filesystem stays untouched
    (work / "dpkg").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(status_file, work / "dpkg" / "status")
    conf = _apt_config(work, work / "dpkg" / "status", dest)
    env = {**os.environ, "APT_CONFIG": str(conf), "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-q"], env=env)
    pref = work / "etc" / "preferences.d" / "driver.pref"
    for version in VERSIONS:
        upstream = version.split("-")[0]
        pref.write_text(f"Package: {PIN_GLOBS}\nPin: version {upstream}-*\nPin-Priority: 1001\n")
        _run(["apt-get", "install", "-y", "-q", "--download-only", *PACKAGES], env=env)
    shutil.rmtree(work)
    (dest / "partial").rmdir()
    (dest / "lock").unlink(missing_ok=True)


def ensure_debs(cache: Path) -> Path:
    """The cached .debs (both versions and what they depend on that the lab root filesystem lacks)."""
    rootfs = lab_build.ensure_rootfs(cache).path
    final = cache / CACHE_NAME
    if (final / ".complete").is_file():
        return final
    with lab_build.file_lock(cache / ".lock"):
        if (final / ".complete").is_file():
            return final
        partial = cache / f"{CACHE_NAME}.partial"
        partial.mkdir(parents=True, exist_ok=True)  # an interrupted download resumes: apt skips what it has
        _download(partial, rootfs / "var" / "lib" / "dpkg" / "status")
        (partial / ".complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
    return final


@dataclass(frozen=True)
class SignedRepo:
    path: Path  # the repository root (dists/, pool/), served as is
    key_file: Path  # the throw-away public key, ASCII-armored
    fingerprint: str
    components: tuple[str, ...]
    suites: tuple[str, ...]


def make_key(gnupghome: Path) -> tuple[str, str]:
    """A throw-away ed25519 signing key: (fingerprint, armored public key)."""
    gnupghome.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = {**os.environ, "GNUPGHOME": str(gnupghome)}
    _run(
        [
            "gpg",
            "--batch",
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
            "--quick-gen-key",
            "vllm-fleet lab driver repository (throw-away)",
            "ed25519",
            "sign",
            "1d",
        ],
        env=env,
    )
    listing = _run(["gpg", "--batch", "--with-colons", "--list-keys"], env=env)
    fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    armored = _run(["gpg", "--batch", "--armor", "--export", fingerprint], env=env)
    return fingerprint, armored


def stop_agent(gnupghome: Path) -> None:
    """Stop the gpg-agent that gpg started for `gnupghome` (making a key, signing): it outlives the test
    otherwise, a daemon on a deleted GNUPGHOME (issue 32: one was still running after the suite)."""
    env = {**os.environ, "GNUPGHOME": str(gnupghome)}
    subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, capture_output=True, check=False, timeout=60)


def _control(deb: Path, field: str) -> str:
    return _run(["dpkg-deb", "-f", str(deb), field]).strip()


def _component(section: str) -> str:
    return section.split("/")[0] if "/" in section else "main"


def build_repo(debs: Path, dest: Path, gnupghome: Path) -> SignedRepo:
    """A reprepro repository laid out as Debian's archive is: suite `bookworm` with 535.261.03 and everything
    else, suite `bookworm-security` with 535.309.01 (reprepro keeps one version per package and suite), each
    package in its own component (main, non-free, non-free-firmware), signed (InRelease, Release.gpg)."""
    env = {**os.environ, "GNUPGHOME": str(gnupghome)}
    try:
        fingerprint, armored = make_key(gnupghome)
        groups: dict[tuple[str, str], list[Path]] = {}
        for deb in sorted(debs.glob("*.deb")):
            suite = (
                SECURITY_SUITE
                if _control(deb, "Version").startswith(VERSIONS[1].split("-")[0] + "-")
                else SUITE
            )
            groups.setdefault((suite, _component(_control(deb, "Section"))), []).append(deb)
        components = tuple(sorted({component for _, component in groups}))
        (dest / "conf").mkdir(parents=True)
        (dest / "conf" / "distributions").write_text(
            "\n".join(
                f"Codename: {suite}\nArchitectures: amd64\nComponents: {' '.join(components)}\n"
                f"SignWith: {fingerprint}\nDescription: vllm-fleet lab mirror of Debian's NVIDIA driver\n"
                for suite in (SUITE, SECURITY_SUITE)
            )
        )
        for (suite, component), group in sorted(groups.items()):
            argv = ["reprepro", "-b", str(dest), "-C", component, "includedeb", suite, *map(str, group)]
            _run(argv, env=env)
    finally:
        stop_agent(gnupghome)
    key_file = dest.parent / "repo-key.asc"
    key_file.write_text(armored)
    return SignedRepo(dest, key_file, fingerprint, components, (SUITE, SECURITY_SUITE))
