"""playbooks/preflight.yml's CUDA gate (roles/nvidia_driver/tasks/cuda_gate.yml) on recorded real hosts.

The seed inventory (4 x RTX 4090, vllm_install_version 0.33.0, whose default wheels are CUDA 13) is planned on
the recorded 8 x 4090 topology, as tests/integration/test_render_real_parser.py does, and its driver is read
from a recorded plain `nvidia-smi` (nvidia_driver_recorded_smi): a real 535 host (Quadro RTX 4000,
akash-network/provider-configs#12) is refused with the variables to change, the real 2 x H200 host on 580 is
accepted, a real GeForce RTX 4090 D on 550 is refused and told forward compatibility does not cover it. The
same preflight under Ansible's fact cache reuses the probe and plans anew. Controller only (connection local);
no GPU anywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "driver"


def preflight(*extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """preflight.yml on the seed inventory and the recorded 8 x 4090 host; `env` adds to the environment."""
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
    environment = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        **(env or {}),
    }
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=300, cwd=REPO, env=environment, check=False
    )


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


def task_result(stdout: str, task: str) -> str:
    """The first result line (ok, changed, skipping) after the task's header."""
    after = stdout.split(f"TASK [{task}]", 1)[1]
    return next(line for line in after.splitlines() if line.startswith(("ok:", "changed:", "skipping:")))


def test_under_the_fact_cache_a_rerun_reuses_the_probe_and_plans_the_changed_variable(tmp_path: Path) -> None:
    """Issue 21: with `fact_caching = jsonfile` a re-run reuses the probe's facts (the gpu_topology fact)
    while they are fresh, but builds the plan anew, so a changed variable reaches it: a cached plan would
    deploy what the inventory no longer says."""
    host = "seed-4090"
    cache = {
        "ANSIBLE_CACHE_PLUGIN": "ansible.builtin.jsonfile",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts"),
        "ANSIBLE_CACHE_PLUGIN_TIMEOUT": "3600",
    }

    def planned(max_num_seqs: int) -> tuple[subprocess.CompletedProcess, str]:
        proc = preflight(
            "-e",
            f"nvidia_driver_recorded_smi={FIX / 'h200x2-nvsmi-plain.txt'}",
            "-e",
            f"vllm_fleet_report_dir={tmp_path / 'reports'}",
            "-e",
            f"vllm_service_max_num_seqs={max_num_seqs}",
            env=cache,
        )
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        plan = json.loads((tmp_path / "reports" / "plan" / f"{host}.json").read_text())
        argv = plan["instances"][0]["argv"]
        return proc, argv[argv.index("--max-num-seqs") + 1]

    first, seqs = planned(96)
    assert seqs == "96"
    probed = task_result(first.stdout, "vllm_fleet.serving.gpu_topology : Probe topology and plan the layout")
    assert probed.startswith("ok:")
    (cache_file,) = (tmp_path / "facts").glob(f"*{host}")  # jsonfile's name: a prefix, then the host
    cached = json.loads(cache_file.read_text())
    cached = json.loads(cached["__payload__"]) if "__payload__" in cached else cached  # ansible-core 2.19+
    assert "gpu_topology" in cached
    assert "vllm_fleet_plan" not in cached  # a plan is never a fact of the cache

    second, seqs = planned(64)
    assert seqs == "64"
    # the probe's facts came from the cache; the plan was built again, with the new value
    probe = task_result(second.stdout, "Probe the host where this run has no facts yet (reads only)")
    assert probe.startswith("skipping:")
    built = task_result(second.stdout, "Build this host's plan and check every role's variables")
    assert built.startswith("ok:")
