"""The hardened unit, the one quoting function and the secrets' path, over real systemd tools and real
recordings.

- `systemd-analyze security --offline=yes` (systemd 252, the controller's) on units rendered from recorded
  layouts (2 x H200, 8 x RTX 4090 numactl-bound, a host without GPUs): exposure <= 2.5, and every item it
  still counts is justified in roles/vllm_service/README.md's table;
- the CUDA syscall probe recorded on an H200 (tests/fixtures/hardening/seccomp-cuda-h200.txt) ran under the
  allow list the unit's SystemCallFilter= lines give today, denied nothing, and its control was denied; the
  DeviceAllow= names are the ones that host's /proc/devices lists;
- `hostvalues.directive` refuses a control character in every file syntax; a unit with awkward but legal
  values (spaces, %, $, quotes) passes `systemd-analyze verify` with no output;
- the restart digest changes with a secret but its input never holds one in clear.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_render_support import h200_topology, rtx4090_topology, seed_vars

from vllm_fleet import hostvalues
from vllm_fleet.deploy import service
from vllm_fleet.deploy.service import ServiceOptions, instance_files
from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.build import build_host_plan
from vllm_fleet.plan.host import InstancePlan
from vllm_fleet.probe.topology import build_topology_from_texts

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "fixtures" / "hardening" / "seccomp-cuda-h200.txt"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is needed (apt-get install systemd)"
)
KEY = "sk-test-0123456789abcdef"


def cpu_topology():
    lscpu = (REPO / "tests/fixtures/topology/recorded/h200x2/lscpu.txt").read_text()
    return build_topology_from_texts({"lscpu": lscpu})


def plans(topology, tp: int | None, **variables: object) -> list[InstancePlan]:
    """The instances build_host_plan makes from a recorded topology: the seed's variables with a key (a host
    without GPUs: a plain model), capacity unchecked (no config.json: not this test's concern)."""
    base = (
        seed_vars(api_key=KEY)
        if topology.gpus
        else {"vllm_service_model": "/srv/m", "vllm_service_api_key": KEY}
    )
    given = {f"vllm_service_{k}": v for k, v in variables.items()}
    plan = build_host_plan(
        "h",
        {**base, "vllm_service_tensor_parallel_size": tp, "vllm_service_capacity_check": False, **given},
        topology,
        vllm_version="0.32.0",
    )
    assert plan.instances, plan.errors
    return plan.instances


def files_for(plan: InstancePlan, key: str = KEY, **options: object) -> service.InstanceFiles:
    return instance_files(plan, options=ServiceOptions(**options), secret_env={"VLLM_API_KEY": key})


TOPOLOGIES = {
    "h200-tp2": (h200_topology, 2),
    "8x4090-tp4-numactl": (rtx4090_topology, 4),
    "cpu-only": (cpu_topology, None),
}


def sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    name = ""
    for line in text.splitlines():
        if re.fullmatch(r"\[[a-z/][^'\]]*\]", line):  # a section, not a recorded Python list
            name = line[1:-1]
            out[name] = []
        elif name and not line.startswith("#"):
            out[name].append(line)
    return out


def security(tmp_path: Path, files: service.InstanceFiles) -> tuple[float, list[str]]:
    path = tmp_path / files.unit_name
    path.write_text(files.unit_text)
    proc = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=yes", "--no-pager", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", proc.stdout)
    assert match, proc.stdout + proc.stderr
    failing = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("✗")]
    return float(match.group(1)), failing


@needs_systemd
@pytest.mark.parametrize("name", ["h200-tp2", "8x4090-tp4-numactl", "cpu-only"])
def test_systemd_analyze_security_rates_the_unit_at_most_2_5(tmp_path: Path, name: str) -> None:
    topology, tp = TOPOLOGIES[name]
    files = files_for(plans(topology(), tp)[0])
    exposure, failing = security(tmp_path, files)
    print(f"{name}: exposure {exposure}")
    assert exposure <= 2.5
    readme = (REPO / "roles/vllm_service/README.md").read_text()
    table = readme.split("What `systemd-analyze security` still counts", 1)[1]
    for item in failing:
        # the README writes `|` inside table cells as `\|`
        assert f"| `{item.replace('|', chr(92) + '|')}`" in table or f"`{item}`" in table, item
    gpu_lines = [line for line in files.unit_text.splitlines() if line.startswith("DeviceAllow=")]
    assert gpu_lines == ([] if name == "cpu-only" else [f"DeviceAllow={d}" for d in service.GPU_DEVICE_ALLOW])
    assert "DevicePolicy=closed" in files.unit_text and "CapabilityBoundingSet=\n" in files.unit_text


def test_the_cuda_probe_ran_under_todays_filter_and_denied_nothing() -> None:
    recorded = sections(RECORDED.read_text())
    assert recorded["workload"][0].startswith("workload ok NVIDIA H200") and "rc=0" in recorded["workload"]
    assert recorded["denied"] == [], recorded["denied"]
    assert "161" in recorded["control: os.chroot under the same filter"]  # chroot: the probe can deny
    devices = {line.split()[1] for line in recorded["/proc/devices"]}
    for allow in service.GPU_DEVICE_ALLOW:
        assert allow.split()[0].removeprefix("char-") in devices, allow
    if SYSTEMD_ANALYZE is None or not Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h").exists():
        return  # the bitmap check needs systemd-analyze and the kernel headers; the rest was checked
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts/seccomp_probe/allowlist.py"), "--bitmap"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert proc.stdout.strip() == recorded["allow-bitmap"][0], "SYSCALL_FILTER changed: re-run the probe"


@pytest.mark.parametrize("syntax", ["unit", "unit-words", "exec", "env", "limits", "fstab", "sysctl"])
@pytest.mark.parametrize("bad", ["a\nExecStartPre=+/bin/sh", "a\x00b", "a\rb", "a\x1bb"])
def test_directive_refuses_a_control_character_in_every_syntax(syntax: str, bad: str) -> None:
    if syntax == "exec" and bad.startswith("a\n"):
        # a command word may hold a newline: it is written as \n inside quotes, never as a line break
        line = hostvalues.directive(syntax, "ExecStart", "/bin/echo", bad, variable="v")
        assert "\n" not in line and '"a\\nExecStartPre=+/bin/sh"' in line
        return
    with pytest.raises(FleetInputError, match=r"^v: .* holds a control character"):
        hostvalues.directive(syntax, "KEY", bad, variable="v")


def test_directive_quotes_for_each_file() -> None:
    assert hostvalues.directive("unit", "Description", "100% ready") == "Description=100%% ready"
    assert hostvalues.directive("unit-words", "ReadWritePaths", "/a b", "/c") == 'ReadWritePaths="/a b" /c'
    assert hostvalues.directive("exec", "ExecStart", "/x", "$HOME", "50%") == 'ExecStart=/x "$$HOME" "50%%"'
    assert hostvalues.directive("env", "A", 'x"y\\z') == 'A="x\\"y\\\\z"'
    assert hostvalues.directive("fstab", "tmpfs", "/mnt/a b", "tmpfs") == "tmpfs /mnt/a\\040b tmpfs"
    with pytest.raises(FleetInputError, match=r"limits\.d fields are single words"):
        hostvalues.directive(
            "limits", "a b", "soft", "memlock", "unlimited", variable="host_tuning_memlock_user"
        )


@needs_systemd
def test_a_unit_with_awkward_legal_values_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "lib" / "systemd").mkdir(parents=True)
    shutil.copytree("/lib/systemd/system", root / "lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    (plan, *_) = plans(
        h200_topology(), 2, model="/data/my models/Qwen 100%", extra_env={"Q": 'say "hi" $x 5%'}
    )
    files = files_for(plan, read_write_paths=("/data/my models", "/srv/kv 50%"))
    for word in (plan.argv[0], "/usr/bin/python3"):
        exe = root / word.lstrip("/")
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    path = root / "etc/systemd/system" / files.unit_name
    path.write_text(files.unit_text)
    proc = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", f"--root={root}", str(path)], capture_output=True, text=True, timeout=60
    )
    assert (proc.stdout + proc.stderr).strip() == "" and proc.returncode == 0, proc.stdout + proc.stderr
    assert 'ReadWritePaths=/var/cache/vllm-fleet "/data/my models" "/srv/kv 50%%"' in files.unit_text
    assert KEY not in files.unit_text and KEY not in files.plan_text


def test_the_restart_digest_follows_a_secret_without_holding_it() -> None:
    (plan, *_) = plans(h200_topology(), 2)
    first, second = files_for(plan), files_for(plan, key="sk-other-key")
    assert first.digest != second.digest  # a new key restarts the instance
    assert first.unit_text == second.unit_text and first.plan_text == second.plan_text
    assert f'VLLM_API_KEY="{KEY}"' in first.env_text  # only the 0600 file holds it
    derived = service.secret_digest({"VLLM_API_KEY": KEY}, salt=first.unit_name)
    assert KEY not in derived and hashlib.sha256(KEY.encode()).hexdigest() not in derived


def test_extra_env_may_not_move_the_units_caches() -> None:
    (plan, *_) = plans(h200_topology(), 2, extra_env={"HF_HOME": "/tmp/hf"})
    with pytest.raises(FleetInputError, match="vllm_service_extra_env: HF_HOME is set by the unit"):
        files_for(plan)
