"""playbooks/preflight.yml's CUDA gate (roles/nvidia_driver/tasks/cuda_gate.yml) on recorded real hosts.

The seed inventory (4 x RTX 4090, vllm_install_version 0.33.0, whose default wheels are CUDA 13) is planned on
the recorded 8 x 4090 topology, as tests/integration/test_render_real_parser.py does, and its driver is read
from a recorded plain `nvidia-smi` (nvidia_driver_recorded_smi): a real 535 host (Quadro RTX 4000,
akash-network/provider-configs#12) is refused with the variables to change, the real 2 x H200 host on 580 is
accepted, a real GeForce RTX 4090 D on 550 is refused and told forward compatibility does not cover it.
Controller only (connection local); no GPU anywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "driver"


def preflight(*extra: str) -> subprocess.CompletedProcess:
    argv = [
        str(Path(sys.executable).with_name("ansible-playbook")),
        "-i",
        str(REPO / "inventory/examples/seed-4x4090"),
        str(REPO / "playbooks/preflight.yml"),
        "-e",
        "ansible_connection=local",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        "-e",
        f"gpu_topology_recorded_dir={REPO / 'tests/fixtures/topology/recorded/8x4090-dual-socket'}",
        *extra,
    ]
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO, env=env, check=False)


def test_preflight_refuses_vllm_0_33_on_a_recorded_535_host() -> None:
    smi = FIX / "nvsmi-535-quadro-rtx4000-akash-provider-configs-12.txt"
    proc = preflight("-e", f"nvidia_driver_recorded_smi={smi}")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "vllm_install_version: vLLM 0.33.0 runs on CUDA 13.0" in out
    assert f"this host's driver is 535.129.03 (recorded: {smi}) on Quadro RTX 4000" in out
    assert "set nvidia_driver_branch to '580' or newer" in out


def test_preflight_accepts_vllm_0_33_on_the_recorded_580_host() -> None:
    proc = preflight("-e", f"nvidia_driver_recorded_smi={FIX / 'h200x2-nvsmi-plain.txt'}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "needs driver >= 580.65.06; the driver is 580.159.04 (recorded:" in out


def test_preflight_tells_a_geforce_host_that_forward_compatibility_does_not_help() -> None:
    smi = FIX / "nvsmi-550-rtx4090d-spatiallm-28.txt"
    proc = preflight(
        "-e", f"nvidia_driver_recorded_smi={smi}", "-e", "nvidia_driver_cuda_forward_compat=true"
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "covers data-center GPUs only, not NVIDIA GeForce RTX 4090 D" in out
