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
    assert driver.check_key_fingerprint(key.read_text(), expected[0][-16:], str(key)) == expected[0]
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
    assert (again["container"], again["dkms"], again["mok_enrolled"], again["refusal"]) == (None, [], None, None)
    assert again["status"] == "ok" and again["loaded_module"] == {"version": "580.159.04", "open": True}
    assert [g["bus_id"] for g in again["gpus"]] == ["00000000:00:06.0", "00000000:00:07.0"]
