"""NVIDIA driver and CUDA toolkit: parse what a host says, decide what to change, and when to reboot.

The `nvidia_driver` role runs one read-only probe script on the host (`roles/nvidia_driver/files/probe.sh`),
which prints sections `=== <name> rc=<N>` followed by the raw output of one command each. Everything here is
pure: it reads that text (and the role's variables) and returns dataclasses. Rules worth knowing:

- Detect first, change second: a host whose working driver satisfies the pin is `ok` and nothing changes.
- `Failed to initialize NVML: Driver/library version mismatch` means the loaded kernel module and the
  user-space libraries differ (typically an unattended upgrade of `libnvidia-*` under a running driver): only
  a reboot (or a module reload) cures it, so it sets `reboot_required`.
- A freshly installed module that is not the loaded one also sets `reboot_required` (the role probes again
  after an install; `install` itself does not claim a reboot before anything changed).
- A host without an NVIDIA PCI device (vendor 0x10de, class 0x03xx) is `no_gpu`: nothing else is done there.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

from vllm_fleet.errors import FleetInputError
from vllm_fleet.probe.topology import csv_cells
from vllm_fleet.validate import kinds

NVIDIA_PCI_VENDOR = "0x10de"
# Display controllers: 0x0300 VGA, 0x0302 3D controller (data-centre GPUs such as the H200 report 0x0302).
_GPU_PCI_CLASSES = ("0x0300", "0x0302")

SMI_QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "driver_version",
    "persistence_mode",
    "compute_cap",
)

REBOOT_POLICIES = ("auto", "never", "always")
_BOOL_WORDS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
DRIVER_MODES = ("detect", "install")

# NVIDIA's CUDA repository directory names per distribution, and per machine architecture.
_CUDA_REPO_DISTROS = {
    ("ubuntu", "22.04"): "ubuntu2204",
    ("ubuntu", "24.04"): "ubuntu2404",
    ("debian", "12"): "debian12",
}
_CUDA_REPO_ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "sbsa", "arm64": "sbsa"}

# Minimum Linux driver per CUDA toolkit release (CUDA release notes, "CUDA Toolkit and Corresponding Driver
# Versions", toolkit driver column). A toolkit newer than the driver builds code the driver cannot run.
CUDA_MIN_DRIVER = {
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}

# Packages of the driver stack that a hold must cover so that no upgrade swaps the user-space libraries under
# a loaded kernel module (the cause of most "Driver/library version mismatch" reports).
# Debian names the user-space libraries without the branch (libcuda1, libnvidia-ml1, firmware-nvidia-gsp).
_DRIVER_PACKAGE_RE = re.compile(
    r"^(nvidia-|libnvidia-|cuda-drivers|xserver-xorg-video-nvidia|libcuda1$|libnvcuvid|libnvoptix"
    r"|firmware-nvidia-)"
)


# --------------------------------------------------------------------------------------------- probe text


@dataclass(frozen=True)
class Section:
    """One command's output from the probe script."""

    rc: int
    text: str


def split_probe(text: str) -> dict[str, Section]:
    """Split the probe script's output into sections: `=== name rc=N` lines start each one."""
    sections: dict[str, Section] = {}
    name: str | None = None
    rc = 0
    lines: list[str] = []
    header = re.compile(r"^=== (\S+) rc=(-?\d+)\s*$")
    for line in text.splitlines():
        match = header.match(line)
        if match:
            if name is not None:
                sections[name] = Section(rc, "\n".join(lines))
            name, rc, lines = match.group(1), int(match.group(2)), []
        elif name is not None:
            lines.append(line)
    if name is not None:
        sections[name] = Section(rc, "\n".join(lines))
    return sections


# --------------------------------------------------------------------------------------------- parsers


def parse_pci_sysfs(text: str) -> list[str]:
    """PCI addresses of NVIDIA GPUs from lines `<address> <vendor> <class>` read from /sys/bus/pci/devices."""
    gpus = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3 or not re.fullmatch(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d", parts[0]):
            continue
        address, vendor, pci_class = parts
        if vendor.lower() == NVIDIA_PCI_VENDOR and pci_class.lower()[:6] in _GPU_PCI_CLASSES:
            gpus.append(address.lower())
    return gpus


@dataclass(frozen=True)
class SmiGpu:
    index: int
    name: str
    uuid: str
    bus_id: str
    driver_version: str
    persistence_mode: str
    compute_cap: str | None


def parse_smi_query(text: str) -> list[SmiGpu]:
    """Rows of `nvidia-smi --query-gpu=<SMI_QUERY_FIELDS> --format=csv,noheader`."""
    gpus = []
    for line in text.splitlines():
        cells = csv_cells(line)
        if len(cells) != len(SMI_QUERY_FIELDS) or not cells[0].isdigit():
            continue
        compute_cap = cells[6] if re.fullmatch(r"\d+\.\d+", cells[6]) else None
        gpus.append(SmiGpu(int(cells[0]), cells[1], cells[2], cells[3], cells[4], cells[5], compute_cap))
    return gpus


@dataclass(frozen=True)
class SmiStatus:
    """What nvidia-smi's answer says about the driver: `ok`, `mismatch`, `no_driver`, `no_devices`, `absent`,
    `error`; `nvml_library_version` is printed with a mismatch (the user-space side)."""

    state: str
    message: str = ""
    nvml_library_version: str | None = None


def classify_smi(rc: int, text: str) -> SmiStatus:
    """Classify nvidia-smi's exit status and output (stdout and stderr together)."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if "Driver/library version mismatch" in text:
        match = re.search(r"NVML library version:\s*([\d.]+)", text)
        return SmiStatus("mismatch", first, match.group(1) if match else None)
    if "couldn't communicate with the NVIDIA driver" in text or "couldn‘t communicate" in text:
        return SmiStatus("no_driver", first)
    if "No devices were found" in text:
        return SmiStatus("no_devices", first)
    if rc == 127 or ("not found" in first and "nvidia-smi" in first):
        return SmiStatus("absent", first)
    if rc == 0:
        return SmiStatus("ok")
    return SmiStatus("error", first)


def parse_smi_version(text: str) -> dict[str, str]:
    """`nvidia-smi --version` → {"driver_version", "cuda_version", "nvml_version"} (those it prints)."""
    keys = {
        "DRIVER version": "driver_version",
        "CUDA Version": "cuda_version",
        "NVML version": "nvml_version",
    }
    found = {}
    for line in text.splitlines():
        label, sep, value = line.partition(":")
        if sep and label.strip() in keys:
            found[keys[label.strip()]] = value.strip()
    return found


@dataclass(frozen=True)
class LoadedModule:
    """The NVIDIA kernel module in memory (`/proc/driver/nvidia/version`)."""

    version: str | None
    open: bool | None


def parse_proc_driver_version(text: str) -> LoadedModule:
    """`NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...` (open) or
    `NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  ...` (proprietary)."""
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            match = re.search(r"\s(\d+\.\d+(?:\.\d+)?)\s", line + " ")
            return LoadedModule(match.group(1) if match else None, "Open Kernel Module" in line)
    return LoadedModule(None, None)


def parse_proc_modules(text: str) -> list[str]:
    """Names of loaded modules from /proc/modules lines."""
    names = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1].isdigit():
            names.append(parts[0])
    return names


@dataclass(frozen=True)
class DpkgPackage:
    name: str
    version: str
    installed: bool
    held: bool


def parse_dpkg_query(text: str) -> dict[str, DpkgPackage]:
    """`dpkg-query -W -f='${binary:Package}\\t${Version}\\t${db:Status-Abbrev}\\n'`: the first letter of the
    status is the selection (`h` = hold), the second the state (`i` = installed)."""
    packages = {}
    for line in text.splitlines():
        cells = line.split("\t")
        if len(cells) != 3 or not cells[2]:
            continue
        name = cells[0].split(":")[0]
        status = cells[2]
        packages[name] = DpkgPackage(name, cells[1], status[1:2] == "i", status[:1] == "h")
    return packages


def parse_os_release(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"')
    return values


@dataclass(frozen=True)
class DkmsModule:
    """One line of `dkms status`: `nvidia-current/535.261.03: added` (source registered, built for no kernel)
    or `nvidia/535.113.01, 5.15.0-86-generic, x86_64: installed` (built and installed for that kernel)."""

    module: str
    version: str
    kernel: str | None
    state: str


def parse_dkms_status(text: str) -> list[DkmsModule]:
    modules = []
    for line in text.splitlines():
        head, sep, state = line.rpartition(": ")
        if not sep or "/" not in head:
            continue
        parts = [p.strip() for p in head.split(",")]
        module, _, version = parts[0].partition("/")
        kernel = parts[1] if len(parts) > 1 else None
        # dkms appends notes such as "installed (WARNING! Diff between built and installed module!)"
        modules.append(DkmsModule(module, version, kernel, state.strip().split()[0] if state.strip() else ""))
    return modules


def secure_boot_state(
    mokutil_rc: int, mokutil_text: str, efivar_rc: int = 127, efivar_text: str = ""
) -> str | None:
    """`enabled`, `disabled`, `unsupported` (legacy BIOS boot, no EFI variables) or None (cannot tell).

    `mokutil --sb-state` prints `SecureBoot enabled` / `SecureBoot disabled`, or `EFI variables are not
    supported on this system` / `This system doesn't support Secure Boot`. Without mokutil the EFI variable
    itself
    answers: `od -An -t u1 /sys/firmware/efi/efivars/SecureBoot-8be4df61-...` prints 4 attribute bytes and the
    value (`6 0 0 0 1` = enabled)."""
    text = mokutil_text.lower()
    if "secureboot enabled" in text:
        return "enabled"
    if "secureboot disabled" in text:
        return "disabled"
    if "not supported on this system" in text or "doesn't support secure boot" in text:
        return "unsupported"
    numbers = efivar_text.split()
    if efivar_rc == 0 and len(numbers) == 5 and all(n.isdigit() for n in numbers):
        return "enabled" if numbers[4] == "1" else "disabled"
    return None


def mok_key_enrolled(rc: int, text: str) -> bool | None:
    """`mokutil --test-key /var/lib/dkms/mok.pub`: `... is already enrolled` / `... is not enrolled`."""
    if "is already enrolled" in text:
        return True
    if "is not enrolled" in text:
        return False
    return None


def secure_boot_refusal(
    state: str | None, mok_enrolled: bool | None, *, will_build_module: bool, signed_modules: bool
) -> str | None:
    """Why an install must not go ahead: Secure Boot on and a DKMS-built module nobody will sign with an
    enrolled key, which the kernel refuses to load (`modprobe: ERROR: could not insert 'nvidia': Key was
    rejected by service`). None when the install may proceed."""
    if state != "enabled" or not will_build_module or signed_modules or mok_enrolled:
        return None
    why = (
        "DKMS's signing key /var/lib/dkms/mok.pub is not enrolled"
        if mok_enrolled is False
        else "no enrolled DKMS signing key was found (/var/lib/dkms/mok.pub)"
    )
    return (
        f"Secure Boot is enabled and the driver's kernel module would be built by DKMS unsigned ({why}): the "
        "kernel would refuse to load it (Key was rejected by service). Fix: enrol DKMS's key (`mokutil "
        "--import "
        "/var/lib/dkms/mok.pub`, then confirm it in the MOK manager at the next boot) and run again, or "
        "install "
        "signed modules (Ubuntu: linux-modules-nvidia-<branch>-<flavour>) and set "
        "nvidia_driver_secure_boot_signed: "
        "true, or disable Secure Boot in the firmware"
    )


def module_build_note(
    dkms: list[DkmsModule], kernel: str | None, headers_present: bool, container: str | None
) -> str | None:
    """What stands between installed packages and a loaded module, said plainly (None when nothing does)."""
    nvidia = [m for m in dkms if m.module.startswith("nvidia")]
    built = [m for m in nvidia if m.kernel == kernel and m.state == "installed"]
    if built and not container:
        return None
    what = ", ".join(
        f"{m.module} {m.version} {m.state}" + (f" for {m.kernel}" if m.kernel else "") for m in nvidia
    )
    no_headers = "" if headers_present else f"; no headers at /lib/modules/{kernel}/build"
    if container:
        return (
            f"this host is a container ({container}) running the kernel of the machine under it "
            f"({kernel or '?'}): "
            f"a container can neither build the driver's kernel module for that kernel nor load it (DKMS: "
            f"{what or 'no nvidia module'}{no_headers}); "
            "the module must be installed and loaded on the machine under it"
        )
    if nvidia and not built:
        return f"DKMS has not built the driver's module for the running kernel {kernel or '?'} ({what})" + (
            ""
            if headers_present
            else f": its headers are missing (install linux-headers-{kernel}, "
            "nvidia_driver_kernel_headers: true)"
        )
    return None


# --------------------------------------------------------------------------------------------- versions


def version_tuple(version: str) -> tuple[int, ...]:
    """`580.159.04` → (580, 159, 4), `0.11.0rc2` → (0, 11, 0): the release part, read by `packaging`; a Debian
    version such as `1:580.95.05-0ubuntu1` keeps its upstream part; () for text that is no version."""
    upstream = upstream_version(str(version)).split("+")[0].split("~")[0]
    try:
        return Version(upstream).release
    except InvalidVersion:
        return ()


def upstream_version(deb_version: str) -> str:
    """`1:580.95.05-0ubuntu1` → `580.95.05`."""
    return deb_version.split(":")[-1].split("-")[0]


@dataclass(frozen=True)
class DriverPin:
    """The driver the fleet wants: a branch (`580`) and optionally an exact version (`580.159.04`)."""

    branch: str
    version: str | None = None
    open_kernel_modules: bool = True

    @classmethod
    def from_vars(cls, branch: Any, version: Any = "", open_kernel_modules: Any = True) -> DriverPin:
        branch_s = str(branch).strip()
        kinds.driver_branch(branch_s, "nvidia_driver_branch", kinds.Context())
        version_s = str(version or "").strip() or None
        if version_s is not None:
            kinds.driver_version(version_s, "nvidia_driver_version", kinds.Context())
            if version_s.split(".")[0] != branch_s:
                raise FleetInputError(
                    f"nvidia_driver_version: {version_s!r} is not in branch "
                    f"nvidia_driver_branch={branch_s!r}; set nvidia_driver_branch to "
                    f"{version_s.split('.')[0]!r} or pick a {branch_s}.x version"
                )
        if isinstance(open_kernel_modules, str) and open_kernel_modules.lower() in _BOOL_WORDS:
            # `-e var=false` arrives as a string
            open_kernel_modules = _BOOL_WORDS[open_kernel_modules.lower()]
        if not isinstance(open_kernel_modules, bool):
            raise FleetInputError(
                f"nvidia_driver_open_kernel_modules: {open_kernel_modules!r} is not a boolean; "
                "set true or false"
            )
        if open_kernel_modules and int(branch_s) < 515:
            raise FleetInputError(
                f"nvidia_driver_open_kernel_modules: true needs branch 515 or newer, not {branch_s}; "
                "raise nvidia_driver_branch or set nvidia_driver_open_kernel_modules: false"
            )
        return cls(branch_s, version_s, open_kernel_modules)

    def satisfied_by(self, version: str | None) -> bool:
        if not version:
            return False
        if self.version is not None:
            return version_tuple(version) == version_tuple(self.version)
        return version.split(".")[0] == self.branch

    @property
    def apt_version(self) -> str:
        """The `Pin: version` glob of the apt preferences file."""
        return f"{self.version}-*" if self.version else f"{self.branch}.*"

    def describe(self) -> str:
        kind = "open" if self.open_kernel_modules else "proprietary"
        return f"{self.version or self.branch + '.x'} ({kind} kernel modules)"


DRIVER_SOURCES = ("nvidia", "distribution")

# What each distribution's own archive carries (`nvidia_driver_source: distribution`). Debian 12 ships one
# branch in non-free (535; security updates stay on it) and the open modules for it in contrib; Ubuntu's
# restricted
# component carries every branch its `ubuntu-drivers` offers, headless (no X) packages included.
DISTRIBUTION_BRANCHES = {("debian", "12"): ("535",)}
_DISTRIBUTION_ARCHIVES = {
    "debian": ("http://deb.debian.org/debian", "http://deb.debian.org/debian-security"),
    "ubuntu": ("http://archive.ubuntu.com/ubuntu", "http://security.ubuntu.com/ubuntu"),
}
_DISTRIBUTION_COMPONENTS = {
    "debian": ("contrib", "non-free", "non-free-firmware"),
    "ubuntu": ("restricted",),
}
DISTRIBUTION_KEYRINGS = {
    "debian": "/usr/share/keyrings/debian-archive-keyring.gpg",
    "ubuntu": "/usr/share/keyrings/ubuntu-archive-keyring.gpg",
}


def check_source(source: Any) -> str:
    value = str(source).strip()
    if value not in DRIVER_SOURCES:
        raise FleetInputError(
            f"nvidia_driver_source: {source!r} is not a driver source; set 'nvidia' (NVIDIA's CUDA "
            "repository) "
            "or 'distribution' (Debian non-free / Ubuntu restricted)"
        )
    return value


def driver_packages(pin: DriverPin, distro: str, source: str = "nvidia") -> list[str]:
    """Packages that install a headless compute driver of the pinned branch from `source`.

    `distro`: NVIDIA's repository directory (`ubuntu2404`, `debian12`) or the OS id (`ubuntu`, `debian`).
    NVIDIA's repository: 580 is the last branch with branch-named packages on Ubuntu; from 590 on the names
    carry no branch and the apt preferences file alone keeps the branch (NVIDIA driver installation guide,
    "Version locking"). Debian: the kernel module through DKMS, nvidia-smi, the CUDA library and the
    persistence daemon, not the `nvidia-driver` metapackage (which brings X). Ubuntu:
    `nvidia-headless-<branch>` (DKMS module and compute libraries, no X) and `nvidia-utils-<branch>`
    (nvidia-smi)."""
    source = check_source(source)
    distro = distro.lower()
    if source == "nvidia":
        branch_named = int(pin.branch) < 590 and distro.startswith("ubuntu")
        if pin.open_kernel_modules:
            return [f"nvidia-driver-{pin.branch}-open"] if branch_named else ["nvidia-open"]
        return [f"cuda-drivers-{pin.branch}"] if branch_named else ["cuda-drivers"]
    if distro.startswith("debian"):
        module = "nvidia-open-kernel-dkms" if pin.open_kernel_modules else "nvidia-kernel-dkms"
        return [module, "nvidia-smi", "libcuda1", "nvidia-persistenced"]
    if distro.startswith("ubuntu"):
        flavour = "-open" if pin.open_kernel_modules else ""
        return [f"nvidia-headless-{pin.branch}{flavour}", f"nvidia-utils-{pin.branch}"]
    raise FleetInputError(
        f"nvidia_driver_source: 'distribution' has no driver packages known for {distro!r}; "
        "use Debian or Ubuntu, or set nvidia_driver_packages"
    )


def distribution_sources(
    pin: DriverPin,
    os_id: str,
    os_version: str,
    codename: str,
    *,
    url: str = "",
    security_url: str = "",
    suites: list[str] | None = None,
    components: list[str] | None = None,
) -> list[dict[str, Any]]:
    """deb822 stanzas ({uris, suites, components}) for the distribution's driver packages.

    Defaults: the release, -updates and -security suites with the components the driver lives in. `url` (a
    mirror) replaces the archive; `suites` given: one stanza on `url` alone (a mirror that merges them)."""
    os_l = os_id.lower()
    if os_l not in _DISTRIBUTION_ARCHIVES:
        raise FleetInputError(
            f"nvidia_driver_source: 'distribution' is not supported on {os_id} {os_version}; use Debian or "
            "Ubuntu, or set nvidia_driver_source: nvidia"
        )
    allowed = DISTRIBUTION_BRANCHES.get((os_l, os_version))
    if allowed and pin.branch not in allowed:
        raise FleetInputError(
            f"nvidia_driver_branch: {pin.branch!r} is not in {os_id} {os_version}'s own archive, which ships "
            f"branch {', '.join(allowed)}; set nvidia_driver_branch: '{allowed[0]}' or "
            "nvidia_driver_source: nvidia"
        )
    archive, security = _DISTRIBUTION_ARCHIVES[os_l]
    comps = list(components or _DISTRIBUTION_COMPONENTS[os_l])
    base = url or archive
    if suites:
        return [{"uris": base, "suites": list(suites), "components": comps}]
    stanzas = [{"uris": base, "suites": [codename, f"{codename}-updates"], "components": comps}]
    stanzas.append(
        {
            "uris": security_url or (base if url else security),
            "suites": [f"{codename}-security"],
            "components": comps,
        }
    )
    return stanzas


def cuda_repo_url(base: str, os_id: str, os_version: str, arch: str) -> str:
    """`<base>/<distro>/<arch>/` for NVIDIA's repository layout; unsupported systems are refused by name."""
    distro = _CUDA_REPO_DISTROS.get((os_id.lower(), os_version))
    if distro is None:
        supported = ", ".join(f"{o} {v}" for o, v in _CUDA_REPO_DISTROS)
        raise FleetInputError(
            f"host operating system: {os_id} {os_version} is not supported by the nvidia_driver role "
            f"({supported}); use a supported release or set nvidia_driver_manage_repo: false and provide "
            "the packages yourself"
        )
    repo_arch = _CUDA_REPO_ARCHES.get(arch)
    if repo_arch is None:
        raise FleetInputError(f"host architecture: {arch!r} has no CUDA repository (x86_64 or aarch64)")
    return f"{base.rstrip('/')}/{distro}/{repo_arch}/"


def cuda_toolkit_package(version: Any) -> str:
    """`13.0` → `cuda-toolkit-13-0` (NVIDIA's per-release meta package)."""
    version_s = str(version).strip()
    kinds.cuda_release(version_s, "cuda_toolkit_version", kinds.Context())
    return "cuda-toolkit-" + version_s.replace(".", "-")


def cuda_toolkit_installed(packages: dict[str, DpkgPackage], version: str) -> bool:
    """The toolkit counts as present when its compiler package is installed (images often carry the pieces
    without the `cuda-toolkit-X-Y` meta package, as on the real H200 machine)."""
    suffix = version.replace(".", "-")
    return any(
        p.installed
        for name, p in packages.items()
        if name in (f"cuda-toolkit-{suffix}", f"cuda-nvcc-{suffix}")
    )


def cuda_driver_compatible(cuda_version: str, driver_version: str | None) -> tuple[bool, str]:
    """Whether a driver runs code built by that toolkit; unknown toolkits pass with a note."""
    minimum = CUDA_MIN_DRIVER.get(cuda_version)
    if minimum is None:
        return True, f"no minimum driver recorded for CUDA {cuda_version}"
    if driver_version is None:
        return True, f"CUDA {cuda_version} needs driver >= {minimum}; no driver seen yet"
    ok = version_tuple(driver_version) >= version_tuple(minimum)
    return ok, f"CUDA {cuda_version} needs driver >= {minimum}; driver is {driver_version}"


def packages_to_hold(packages: dict[str, DpkgPackage], extra: list[str] | None = None) -> list[str]:
    """Installed packages of the driver stack (and `extra` names), sorted: what the role holds."""
    names = {n for n, p in packages.items() if p.installed and _DRIVER_PACKAGE_RE.match(n)}
    names.update(n for n in extra or [] if n in packages and packages[n].installed)
    return sorted(names)


def installed_driver_version(packages: dict[str, DpkgPackage]) -> str | None:
    """The driver version that dpkg installed, read from the user-space compute library (whatever its name:
    `libnvidia-compute-580`, `libnvidia-compute`, `nvidia-driver-cuda`...)."""
    # Debian's nvidia-kernel-common is versioned by date (20220217+3), so only the branch-named one counts
    for name in sorted(packages):
        package = packages[name]
        if package.installed and re.match(
            r"^(libnvidia-compute|nvidia-driver-cuda|nvidia-kernel-common-\d|libcuda1$|nvidia-kernel-dkms$)",
            name,
        ):
            return upstream_version(package.version)
    return None


# --------------------------------------------------------------------------------------------- assessment


@dataclass
class DriverAssessment:
    """What the role saw and what it must do. `status`: `no_gpu`, `ok`, `install`, `reboot_pending`."""

    status: str
    gpu_pci_addresses: list[str]
    gpus: list[dict[str, Any]]
    smi: dict[str, Any]
    driver_version: str | None
    cuda_version: str | None
    loaded_module: dict[str, Any]
    installed_packages_version: str | None
    held_packages: list[str]
    kernel: str | None
    headers_present: bool
    nouveau_loaded: bool
    secure_boot: str | None
    pin: dict[str, Any]
    needs_install: bool
    reboot_required: bool
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # `systemd-nspawn`, `lxc`, `docker`...: the kernel (and its modules) belong to the machine under it
    container: str | None = None
    dkms: list[dict[str, Any]] = field(default_factory=list)
    module_note: str | None = None
    mok_enrolled: bool | None = None
    # set when the install must not go ahead (Secure Boot and an unsigned module); the role fails with it
    refusal: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def assess_driver(
    probe_text: str,
    pin: DriverPin,
    *,
    expected_gpu_count: int | None = None,
    force: bool = False,
    signed_modules: bool = False,
) -> DriverAssessment:
    """Read the probe output and decide: nothing (`ok`), `install`, a pending reboot, or `no_gpu`.

    `signed_modules`: the packages bring modules signed for Secure Boot (nvidia_driver_secure_boot_signed)."""
    sections = split_probe(probe_text)

    def text(name: str) -> str:
        return sections[name].text if name in sections else ""

    def rc(name: str) -> int:
        return sections[name].rc if name in sections else 127

    pci = parse_pci_sysfs(text("pci"))
    smi = classify_smi(rc("nvidia_smi_query"), text("nvidia_smi_query"))
    gpus = parse_smi_query(text("nvidia_smi_query")) if smi.state == "ok" else []
    version_info = parse_smi_version(text("nvidia_smi_version")) if rc("nvidia_smi_version") == 0 else {}
    loaded = (
        parse_proc_driver_version(text("proc_driver_version"))
        if rc("proc_driver_version") == 0
        else LoadedModule(None, None)
    )
    if loaded.version is None and rc("module_version") == 0 and text("module_version").strip():
        loaded = LoadedModule(text("module_version").strip(), loaded.open)
    modules = parse_proc_modules(text("proc_modules"))
    packages = parse_dpkg_query(text("dpkg")) if rc("dpkg") == 0 else {}
    installed_version = installed_driver_version(packages)
    kernel = text("kernel").strip() or None
    headers_present = rc("headers") == 0 and "present" in text("headers")
    secure_boot = secure_boot_state(
        rc("secure_boot"), text("secure_boot"), rc("efi_secure_boot"), text("efi_secure_boot")
    )
    mok_enrolled = mok_key_enrolled(rc("mok_dkms_key"), text("mok_dkms_key"))
    virt = text("virt").strip()
    container = virt if rc("virt") == 0 and virt and virt != "none" else None
    dkms = parse_dkms_status(text("dkms_status")) if rc("dkms_status") == 0 else []
    module_note = module_build_note(dkms, kernel, headers_present, container)

    driver_version = gpus[0].driver_version if gpus else version_info.get("driver_version")
    reasons: list[str] = []
    warnings: list[str] = []
    needs_install = False
    reboot_required = False

    if not pci and smi.state != "ok" and not force:
        status = "no_gpu"
        reasons.append("no NVIDIA GPU on the PCI bus (vendor 0x10de, class 0x0300/0x0302): nothing to do")
    elif smi.state == "ok":
        if pin.satisfied_by(driver_version):
            status = "ok"
            reasons.append(f"driver {driver_version} answers and satisfies the pin {pin.describe()}")
        else:
            # the reboot this will need is decided after the install, by probing again
            status = "install"
            needs_install = True
            reasons.append(f"driver {driver_version} answers but the pin is {pin.describe()}")
        if loaded.open is not None and loaded.open != pin.open_kernel_modules and status == "ok":
            kind = "open" if loaded.open else "proprietary"
            warnings.append(
                f"the loaded module is the {kind} one while nvidia_driver_open_kernel_modules="
                f"{pin.open_kernel_modules}; left as is because the version satisfies the pin"
            )
    elif smi.state == "mismatch":
        reboot_required = True
        library = smi.nvml_library_version or installed_version
        if library and pin.satisfied_by(installed_version or library):
            status = "reboot_pending"
            reasons.append(
                f"kernel module {loaded.version or '?'} and user-space libraries {library} differ "
                "(Driver/library version mismatch): the installed driver satisfies the pin, a reboot loads it"
            )
        else:
            status = "install"
            needs_install = True
            reasons.append(
                f"Driver/library version mismatch (module {loaded.version or '?'}, "
                f"libraries {library or '?'}) "
                f"and the installed driver does not satisfy the pin {pin.describe()}"
            )
    else:
        if pin.satisfied_by(installed_version) and "nvidia" not in modules:
            status = "reboot_pending"
            reboot_required = True
            reasons.append(
                f"driver {installed_version} is installed but its module is not loaded "
                f"(nvidia-smi: {smi.state}): "
                + (module_note if container and module_note else "a reboot loads it")
            )
        else:
            status = "install"
            needs_install = True
            reasons.append(
                f"nvidia-smi: {smi.state}{' (' + smi.message + ')' if smi.message else ''}; "
                f"installed driver packages: {installed_version or 'none'}; pin {pin.describe()}"
            )

    if pci and gpus and len(gpus) != len(pci):
        warnings.append(f"{len(pci)} NVIDIA GPUs on the PCI bus but nvidia-smi lists {len(gpus)}")
    if expected_gpu_count is not None and status == "ok" and len(gpus) != expected_gpu_count:
        warnings.append(
            f"nvidia_driver_expected_gpu_count={expected_gpu_count} but nvidia-smi lists {len(gpus)}"
        )
    if "nouveau" in modules:
        warnings.append("nouveau is loaded: it holds the GPUs until it is blacklisted and the host reboots")
        reboot_required = reboot_required or status != "no_gpu"
    # a container builds no module, so Secure Boot (the machine's, under it) does not gate its packages
    refusal = secure_boot_refusal(
        secure_boot,
        mok_enrolled,
        will_build_module=needs_install and not container,
        signed_modules=signed_modules,
    )
    if module_note and not container and status != "no_gpu":
        warnings.append(module_note)

    return DriverAssessment(
        status=status,
        gpu_pci_addresses=pci,
        gpus=[asdict(g) for g in gpus],
        smi=asdict(smi),
        driver_version=driver_version,
        cuda_version=version_info.get("cuda_version"),
        loaded_module=asdict(loaded),
        installed_packages_version=installed_version,
        held_packages=sorted(n for n, p in packages.items() if p.held),
        kernel=kernel,
        headers_present=headers_present,
        nouveau_loaded="nouveau" in modules,
        secure_boot=secure_boot,
        pin=asdict(pin),
        needs_install=needs_install,
        reboot_required=reboot_required,
        reasons=reasons,
        warnings=warnings,
        container=container,
        dkms=[asdict(m) for m in dkms],
        module_note=module_note,
        mok_enrolled=mok_enrolled,
        refusal=refusal,
    )


def verify_driver(assessment: DriverAssessment, pin: DriverPin, expected_gpu_count: int | None) -> list[str]:
    """Problems left after an install (empty when the driver answers, matches the pin and sees every GPU)."""
    problems = []
    if assessment.smi["state"] != "ok":
        problems.append(
            f"nvidia-smi does not answer: {assessment.smi['state']} {assessment.smi['message']}".strip()
        )
        return problems
    if not pin.satisfied_by(assessment.driver_version):
        problems.append(f"driver {assessment.driver_version} does not satisfy the pin {pin.describe()}")
    expected = expected_gpu_count if expected_gpu_count is not None else len(assessment.gpu_pci_addresses)
    if len(assessment.gpus) != expected:
        problems.append(f"nvidia-smi lists {len(assessment.gpus)} GPUs, expected {expected}")
    return problems


# --------------------------------------------------------------------------------------------- reboot


@dataclass(frozen=True)
class RebootDecision:
    reboot: bool
    refused: bool
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


def is_local_connection(connection: str | None, inventory_hostname: str) -> bool:
    """True when the play runs on the controller itself: rebooting it would cut the play off."""
    return (connection or "") == "local" or inventory_hostname in _LOCAL_NAMES


def decide_reboot(
    policy: str,
    *,
    reboot_required: bool,
    changed: bool,
    connection: str | None,
    inventory_hostname: str,
    container: str | None = None,
) -> RebootDecision:
    """`auto`: reboot when required; `always`: also after any driver change; `never`: report only. Never the
    machine the play runs on (NVIDIA/ansible-role-nvidia-driver#20 rebooted the control node), and never a
    container for the module's sake: its kernel is the machine's under it, a reboot of the container loads
    nothing."""
    if policy not in REBOOT_POLICIES:
        raise FleetInputError(
            f"nvidia_driver_reboot: {policy!r} is not a policy; set one of {', '.join(REBOOT_POLICIES)}"
        )
    wanted = (policy == "auto" and reboot_required) or (policy == "always" and (reboot_required or changed))
    if not wanted:
        if reboot_required and container:
            return RebootDecision(
                False,
                False,
                f"a reboot is required and nvidia_driver_reboot={policy}; {inventory_hostname} is a "
                f"container ({container}), whose reboot would load no kernel module anyway: load the driver "
                "on the machine under it",
            )
        if reboot_required:
            return RebootDecision(
                False, False, f"a reboot is required and nvidia_driver_reboot={policy}: reboot by hand"
            )
        return RebootDecision(False, False, "no reboot needed")
    if container:
        return RebootDecision(
            False,
            True,
            f"nvidia_driver_reboot={policy} would reboot {inventory_hostname} now to load the driver's "
            "module, but "
            f"it is a container ({container}): a container's reboot loads no kernel module, so it is not "
            "rebooted; load the driver on the machine under it",
        )
    if is_local_connection(connection, inventory_hostname):
        return RebootDecision(
            False,
            True,
            f"a reboot is required but {inventory_hostname} is the machine running this play (connection "
            f"{connection or 'local'}): refusing to reboot it; reboot it by hand and run the play again",
        )
    return RebootDecision(True, False, "rebooting to load the pinned driver")


# --------------------------------------------------------------------------------------------- repository key


def _dearmor(armored: str) -> bytes:
    body = []
    inside = False
    for line in armored.splitlines():
        line = line.strip()
        if line.startswith("-----BEGIN PGP PUBLIC KEY BLOCK"):
            inside = True
            continue
        if line.startswith("-----END PGP PUBLIC KEY BLOCK"):
            break
        if not inside or (":" in line and not body):
            continue
        if line.startswith("="):  # CRC24 checksum line
            continue
        if line:
            body.append(line)
    if not body:
        raise FleetInputError("repository key: no ASCII-armored 'PGP PUBLIC KEY BLOCK' found")
    return base64.b64decode("".join(body))


def openpgp_fingerprints(key: str | bytes) -> list[str]:
    """Fingerprints (upper-case hex) of the v4 primary and sub keys in an armored or binary OpenPGP key file.

    RFC 4880 §12.2: SHA-1 over 0x99, the two-byte body length and the public-key packet body."""
    data = _dearmor(key) if isinstance(key, str) else key
    fingerprints = []
    pos = 0
    while pos < len(data):
        tag_byte = data[pos]
        if not tag_byte & 0x80:
            raise FleetInputError("repository key: not an OpenPGP packet stream")
        if tag_byte & 0x40:  # new packet format
            tag = tag_byte & 0x3F
            first = data[pos + 1]
            if first < 192:
                length, hdr = first, 2
            elif first < 224:
                length, hdr = ((first - 192) << 8) + data[pos + 2] + 192, 3
            else:
                length, hdr = int.from_bytes(data[pos + 2 : pos + 6], "big"), 6
        else:
            tag = (tag_byte >> 2) & 0x0F
            length_type = tag_byte & 0x03
            size = {0: 1, 1: 2, 2: 4}.get(length_type)
            if size is None:
                raise FleetInputError("repository key: indeterminate-length packets are not supported")
            length, hdr = int.from_bytes(data[pos + 1 : pos + 1 + size], "big"), 1 + size
        body = data[pos + hdr : pos + hdr + length]
        if tag in (6, 14) and body[:1] == b"\x04":
            digest = hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body, usedforsecurity=False)
            fingerprints.append(digest.hexdigest().upper())
        pos += hdr + length
    return fingerprints


def check_key_fingerprint(key: str | bytes, expected: str, source: str) -> str:
    """Return the matching fingerprint, or explain a rotated/wrong key (complaint: CUDA key rotation 2022)."""
    # a short id matches any key made to end in it, an empty one every key: all 40 digits or nothing
    kinds.fingerprint(expected, "nvidia_driver_repo_key_fingerprint", kinds.Context())
    wanted = re.sub(r"\s", "", expected).upper()
    found = openpgp_fingerprints(key)
    for fingerprint in found:
        if fingerprint == wanted:
            return fingerprint
    raise FleetInputError(
        f"nvidia_driver_repo_key_fingerprint: {expected!r} is not a fingerprint of the key from {source} "
        f"(it holds {', '.join(found) or 'no key'}); if NVIDIA rotated its key, check the new one "
        "out of band and set nvidia_driver_repo_key_fingerprint to it"
    )


# --------------------------------------------------------------------------------------------- CUDA gate

# The lowest driver that runs any code of a CUDA major release (NVIDIA CUDA Compatibility guide, "Minor
# Version Compatibility", table 1: 13.x >= 580, 12.x >= 525, 11.x >= 450; exact floors from the release
# notes' toolkit
# driver table: 13.0 GA 580.65.06, 12.0 GA 525.60.13, 11.x 450.80.02). A torch/vLLM wheel carries its CUDA
# runtime, so the driver is all the host has to match.
CUDA_MAJOR_MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
# vLLM's default (unsuffixed) PyPI wheels are built for CUDA 13.0 from 0.20.0 on, 12.x before
# (vllm-project/vllm#39878 "Switch default CUDA to 13.0"; vllm-project/router#154: "The vLLM 0.20.0 release
# has switched to CUDA 13 for the default wheels"); `+cu129` names the CUDA 12.9 variant.
VLLM_CUDA13_FROM = "0.20.0"

_LOCAL_CUDA_RE = re.compile(r"\+cu(\d{2,3})\b")
_LOCK_TORCH_RE = re.compile(r"^\s*torch\s*==\s*([\w.]+(?:\+[\w.]+)?)", re.MULTILINE)
_LOCK_VLLM_RE = re.compile(r"^\s*vllm(?:-cpu)?\s*==\s*([\w.]+(?:\+[\w.]+)?)", re.MULTILINE)
# the CUDA runtime wheel torch depends on: nvidia-cuda-runtime-cu12==12.8.90, nvidia-cuda-runtime==13.0.96
_LOCK_CUDART_RE = re.compile(r"^\s*nvidia-cuda-runtime(?:-cu(\d+))?\s*==\s*(\d+)\.(\d+)", re.MULTILINE)


@dataclass(frozen=True)
class CudaBuild:
    """The CUDA a vLLM build runs on: `major` None for a build without CUDA (`+cpu`, `+rocm...`)."""

    major: int | None
    minor: int | None
    source: str

    def describe(self) -> str:
        if self.major is None:
            return "no CUDA"
        return f"CUDA {self.major}" + (f".{self.minor}" if self.minor is not None else "")


def _cuda_of_local(local: str) -> tuple[int, int] | None:
    match = _LOCAL_CUDA_RE.search(local)
    if not match:
        return None
    digits = match.group(1)
    return int(digits[:-1]), int(digits[-1])


def vllm_build_cuda(vllm_version: str) -> CudaBuild:
    """The CUDA of vLLM's wheel for a release (`0.33.0` → 13, `0.19.1` → 12, `0.20.0+cu129` → 12.9,
    `0.32.0+cpu` → none)."""
    version = str(vllm_version).strip()
    _, _, local = version.partition("+")
    if local:
        cuda = _cuda_of_local("+" + local)
        if cuda:
            return CudaBuild(cuda[0], cuda[1], f"the wheel's local version +{local}")
        if local.startswith(("cpu", "rocm", "xpu", "tpu")):
            return CudaBuild(None, None, f"the wheel's local version +{local}")
    release = version_tuple(version)
    if not release:
        raise FleetInputError(
            f"vllm_install_version: {vllm_version!r} is not a vLLM version; set e.g. '0.33.0'"
        )
    if release >= version_tuple(VLLM_CUDA13_FROM):
        return CudaBuild(13, 0, f"vLLM >= {VLLM_CUDA13_FROM}'s default wheels (torch +cu130)")
    return CudaBuild(12, None, f"vLLM < {VLLM_CUDA13_FROM}'s default wheels (torch +cu12x)")


def lock_build_cuda(lock_text: str) -> CudaBuild | None:
    """The CUDA a wheelhouse lock installs: torch's local version (`torch==2.9.0+cu130`), vLLM's
    (`vllm==0.20.0+cu129`), or the CUDA runtime wheel torch pulls (`nvidia-cuda-runtime-cu12==12.8.90`).
    None when the lock says nothing about CUDA."""
    for pattern, what in ((_LOCK_TORCH_RE, "torch"), (_LOCK_VLLM_RE, "vllm")):
        match = pattern.search(lock_text)
        if match and "+" in match.group(1):
            local = match.group(1).split("+", 1)[1]
            cuda = _cuda_of_local("+" + local)
            if cuda:
                return CudaBuild(cuda[0], cuda[1], f"the lock's {what}=={match.group(1)}")
            if what == "torch" and local.startswith(("cpu", "rocm", "xpu")):
                return CudaBuild(None, None, f"the lock's torch=={match.group(1)}")
    match = _LOCK_CUDART_RE.search(lock_text)
    if match:
        return CudaBuild(int(match.group(2)), int(match.group(3)), f"the lock's {match.group(0).strip()}")
    return None


def gpu_compat_class(name: str) -> str:
    """`geforce`, `data_center` or `workstation`. CUDA forward compatibility (cuda-compat) covers data-center
    GPUs (and select NGC-ready RTX SKUs, which a name cannot tell), never GeForce (NVIDIA CUDA Compatibility
    guide, "Forward Compatibility")."""
    lowered = name.lower()
    if "geforce" in lowered or "titan" in lowered:
        return "geforce"
    if re.search(
        r"\b(tesla|[abhl]\d{1,3}[a-z]?|gh200|gb200|gb300|b200|b300|h800|a800|h20|l40s?|v100|t4|p100|p40"
        r"|a2|a16)\b",
        lowered,
    ):
        return "data_center"
    return "workstation"


def parse_smi_table(text: str) -> dict[str, Any]:
    """Plain `nvidia-smi`: {"driver_version", "cuda_version", "gpus": [names]} from its header and GPU "
    "rows."""
    header = re.search(r"Driver Version:\s*([\d.]+)\s+CUDA Version:\s*([\d.]+)", text)
    names = re.findall(r"^\|\s+\d+\s+(.+?)\s{2,}(?:On|Off)\s+\|", text, re.MULTILINE)
    return {
        "driver_version": header.group(1) if header else None,
        "cuda_version": header.group(2) if header else None,
        "gpus": [n.strip() for n in names],
    }


@dataclass(frozen=True)
class CudaGate:
    ok: bool
    cuda: str
    cuda_source: str
    min_driver: str | None
    driver: str | None
    driver_source: str
    gpu_classes: dict[str, str]
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _driver_reaches(driver: str, floor: str) -> bool:
    """A bare branch (`580`, the pin of a run that installs the newest of it) counts by its branch."""
    have = version_tuple(driver)
    need = version_tuple(floor)
    return have[0] >= need[0] if len(have) == 1 else have >= need


def cuda_gate(
    vllm_version: str,
    driver_version: str | None,
    gpu_names: list[str],
    *,
    lock_text: str = "",
    forward_compat: bool = False,
    driver_source: str = "detected",
) -> CudaGate:
    """Can the vLLM build about to be installed run on this host's driver?

    Args:
        vllm_version: the release to install (`vllm_install_version`), local part included if any.
        driver_version: the host's driver (`580.159.04`), or the pin this run installs (`580`, `580.95.05`);
            None when the host has none and none is planned.
        gpu_names: nvidia-smi's GPU names (forward compatibility depends on them).
        lock_text: the wheelhouse lock the host installs from; its torch/CUDA pins win over the release.
        forward_compat: cuda-compat is installed and used (nvidia_driver_cuda_forward_compat).
        driver_source: where driver_version came from, for the message.
    Returns:
        CudaGate: `ok` and one message that names the variables to change when it is not.
    """
    build = lock_build_cuda(lock_text) if lock_text else None
    build = build or vllm_build_cuda(vllm_version)
    classes = {name: gpu_compat_class(name) for name in gpu_names}

    def gate(ok: bool, floor: str | None, message: str) -> CudaGate:
        return CudaGate(
            ok, build.describe(), build.source, floor, driver_version, driver_source, classes, message
        )

    if build.major is None:
        return gate(True, None, f"vLLM {vllm_version} has no CUDA ({build.source}): no driver needed")
    floor = CUDA_MAJOR_MIN_DRIVER.get(build.major)
    if floor is None:
        return gate(True, None, f"no minimum driver recorded for {build.describe()}")
    what = f"vLLM {vllm_version} runs on {build.describe()} ({build.source}), which needs driver >= {floor}"
    if not driver_version:
        return gate(True, floor, f"{what}; no NVIDIA driver here and none to be installed: nothing to check")
    gpus = ", ".join(sorted(set(gpu_names))) or "no GPU listed"
    seen = f"the driver is {driver_version} ({driver_source})"
    if _driver_reaches(driver_version, floor):
        return gate(True, floor, f"{what}; {seen}: ok")
    compat_pkg = f"cuda-compat-{build.major}-{build.minor or 0}"
    data_center = bool(classes) and all(c == "data_center" for c in classes.values())
    if forward_compat and data_center:
        message = f"{what}; {seen}, which runs it by CUDA forward compatibility ({compat_pkg}) on {gpus}"
        return gate(True, floor, message)
    if data_center:
        compat = (
            f", or install {compat_pkg} and set nvidia_driver_cuda_forward_compat: true (these data-center "
            "GPUs support CUDA forward compatibility)"
        )
    else:
        compat = f"; CUDA forward compatibility does not help: it covers data-center GPUs only, not {gpus}"
    below = f"a release below {VLLM_CUDA13_FROM} or a +cu129 build" if build.major == 13 else "an older one"
    message = (
        f"vllm_install_version: {what}; this host's driver is {driver_version} ({driver_source}) on {gpus}, "
        "so vLLM would fail at start (The NVIDIA driver on your system is too old). "
        f"Fix: set nvidia_driver_branch to '{version_tuple(floor)[0]}' or newer (nvidia_driver_mode: "
        "install),"
        " "
        f"or set vllm_install_version to {below}{compat}"
    )
    return gate(False, floor, message)


# --------------------------------------------------------------------------------------------- apt sources

SOURCE_FILES = {
    "nvidia": "/etc/apt/sources.list.d/vllm-fleet-cuda.sources",
    "distribution": "/etc/apt/sources.list.d/vllm-fleet-nvidia-driver.sources",
}


def apt_sources(role_vars: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """What the role writes for its apt source, from its variables and the host's facts.

    Returns {"source", "file" (the deb822 file), "stale_files" (the other source's file), "stanzas" [{uris,
    suites, components, signed_by}], "key_needed" (fetch/check a key and place it at the keyring),
    "packages"}.
    One function, so the tasks only loop over what it returns."""
    source = check_source(role_vars.get("nvidia_driver_source", "nvidia"))
    pin = DriverPin.from_vars(
        role_vars.get("nvidia_driver_branch", ""),
        role_vars.get("nvidia_driver_version", ""),
        role_vars.get("nvidia_driver_open", True),
    )
    os_id = str(facts.get("distribution", ""))
    os_l = os_id.lower()
    version_fact = "distribution_version" if os_l == "ubuntu" else "distribution_major_version"
    os_version = str(facts.get(version_fact, ""))
    keyring = str(role_vars.get("nvidia_driver_repo_keyring", ""))
    key_configured = bool(
        role_vars.get("nvidia_driver_repo_key_file") or role_vars.get("nvidia_driver_repo_key_url")
    )
    if source == "nvidia":
        base = str(role_vars.get("nvidia_driver_repo_base_url", ""))
        url = cuda_repo_url(base, os_id, os_version, str(facts.get("architecture")))
        stanzas = [{"uris": url, "suites": ["/"], "components": [], "signed_by": keyring}]
        distro = url.rstrip("/").split("/")[-2]
        key_needed = True
        # cuda-keyring's own list names the same URL with another Signed-By: apt would refuse both
        stale = [f"/etc/apt/sources.list.d/cuda-{distro}-{url.rstrip('/').split('/')[-1]}.list"]
    else:
        raw = distribution_sources(
            pin,
            os_id,
            os_version,
            str(facts.get("distribution_release", "")),
            url=str(role_vars.get("nvidia_driver_distribution_url") or ""),
            security_url=str(role_vars.get("nvidia_driver_distribution_security_url") or ""),
            suites=list(role_vars.get("nvidia_driver_distribution_suites") or []),
            components=list(role_vars.get("nvidia_driver_distribution_components") or []),
        )
        signed_by = (
            keyring
            if key_configured
            else str(role_vars.get("nvidia_driver_distribution_keyring") or DISTRIBUTION_KEYRINGS[os_l])
        )
        stanzas = [{**stanza, "signed_by": signed_by} for stanza in raw]
        distro = os_l
        key_needed = key_configured
        stale = []
    packages = list(role_vars.get("nvidia_driver_packages") or []) or driver_packages(pin, distro, source)
    return {
        "source": source,
        "file": SOURCE_FILES[source],
        "stale_files": [f for s, f in SOURCE_FILES.items() if s != source] + stale,
        "stanzas": stanzas,
        "key_needed": key_needed,
        "packages": packages,
    }
