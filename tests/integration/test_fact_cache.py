"""Preflight under Ansible's fact cache (issue 21): with `fact_caching = jsonfile` a re-run reuses the probe's
facts (the gpu_topology fact) while they are fresh, but the plan is built anew in every run, so a changed
variable reaches it: a cached plan would deploy what the inventory no longer says.

The seed inventory (4 x RTX 4090) on the recorded 8 x 4090 topology and the recorded real 2 x H200
`nvidia-smi`, as tests/integration/test_driver_preflight.py plans it; controller only (connection local), no
GPU anywhere.
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
HOST = "seed-4090"


def preflight(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
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
        "-e",
        f"nvidia_driver_recorded_smi={REPO / 'tests/fixtures/driver/h200x2-nvsmi-plain.txt'}",
        "-e",
        f"vllm_fleet_report_dir={tmp_path / 'reports'}",
        *extra,
    ]
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CACHE_PLUGIN": "ansible.builtin.jsonfile",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts"),
        "ANSIBLE_CACHE_PLUGIN_TIMEOUT": "3600",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO, env=env, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc


def task_result(stdout: str, task: str) -> str:
    """The first result line (ok, changed, skipping) after the task's header."""
    after = stdout.split(f"TASK [{task}]", 1)[1]
    return next(line for line in after.splitlines() if line.startswith(("ok:", "changed:", "skipping:")))


def test_a_rerun_reuses_the_cached_probe_and_plans_the_changed_variable(tmp_path: Path) -> None:
    first = preflight(tmp_path, "-e", "vllm_service_max_num_seqs=96")
    assert task_result(first.stdout, "vllm_fleet.serving.gpu_topology : Probe topology and plan the layout")
    (cache_file,) = (tmp_path / "facts").glob(f"*{HOST}")  # jsonfile's name: a prefix, then the host
    cached = json.loads(cache_file.read_text())
    cached = json.loads(cached["__payload__"]) if "__payload__" in cached else cached  # ansible-core 2.19+
    assert "gpu_topology" in cached
    assert "vllm_fleet_plan" not in cached  # a plan is never a fact of the cache
    plan = json.loads((tmp_path / "reports" / "plan" / f"{HOST}.json").read_text())
    assert (
        "--max-num-seqs" in (argv := plan["instances"][0]["argv"])
        and argv[argv.index("--max-num-seqs") + 1] == "96"
    )

    second = preflight(tmp_path, "-e", "vllm_service_max_num_seqs=64")
    # the probe's facts came from the cache; the plan was built again, with the new value
    assert task_result(
        second.stdout, "Probe the host where this run has no facts yet (reads only)"
    ).startswith("skipping:")
    assert task_result(second.stdout, "Build this host's plan and check every role's variables").startswith(
        "ok:"
    )
    plan = json.loads((tmp_path / "reports" / "plan" / f"{HOST}.json").read_text())
    argv = plan["instances"][0]["argv"]
    assert argv[argv.index("--max-num-seqs") + 1] == "64"
