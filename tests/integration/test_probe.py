"""playbooks/probe.yml run for real with ansible-playbook: on this machine (-c local, no GPU: the CPU-only
report) and on the inventory examples that plan recorded hardware (real captures, see their READMEs).
Nothing on a host changes; the JSON report lands in the folder given by gpu_topology_report_dir.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def probe(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    reports = tmp_path / "reports"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "playbooks/probe.yml",
            "-e",
            f"gpu_topology_report_dir={reports}",
            *args,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return proc, reports


def report(reports: Path, host: str) -> dict[str, Any]:
    return json.loads((reports / f"{host}.json").read_text())


def test_probe_this_machine_without_gpus(tmp_path: Path) -> None:
    proc, reports = probe(tmp_path, "-i", "localhost,", "-c", "local", "--check")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fact = report(reports, "localhost")
    assert fact["cpu_only"] is True
    [inst] = fact["layout"]["instances"]
    assert inst["device"] == "cpu" and inst["gpus"] == []
    assert "CPU-only host" in proc.stdout
    assert "nvidia-smi is not installed" in proc.stdout


def test_probe_8x4090_dual_socket_example(tmp_path: Path) -> None:
    proc, reports = probe(tmp_path, "-i", "inventory/examples/8x4090-dual-socket/")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fact = report(reports, "rtx4090-8x")
    assert fact["source"].endswith("inventory/examples/8x4090-dual-socket/recorded")
    plan = [(i["gpus"], i["numa_binding"], i["port"]) for i in fact["layout"]["instances"]]
    assert plan == [
        ([0, 1, 2, 3], {"mode": "numactl", "nodes": [0]}, 8000),
        ([4, 5, 6, 7], {"mode": "numactl", "nodes": [1]}, 8001),
    ]
    assert all(i["disable_custom_all_reduce"] for i in fact["layout"]["instances"])
    assert "SYS = PCIe plus the SMP interconnect" in proc.stdout


def test_probe_4x4090_single_socket_example(tmp_path: Path) -> None:
    proc, reports = probe(tmp_path, "-i", "inventory/examples/4x4090-single-socket/")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [inst] = report(reports, "rtx4090-4x")["layout"]["instances"]
    assert inst["numa_binding"] == {"mode": "numactl", "nodes": [0]}
    assert inst["env"]["NCCL_P2P_DISABLE"] == "1"  # GNS: consumer GPUs without peer-to-peer
    assert inst["disable_custom_all_reduce"] is True
    # the recording is of another box: the report's first line says so (recorded/stand-in.txt, issue 32)
    assert "(STAND-IN, not this host's hardware: a real 2 x RTX 5090" in proc.stdout


def test_probe_fails_early_on_a_missing_recorded_folder(tmp_path: Path) -> None:
    proc, _ = probe(
        tmp_path, "-i", "localhost,", "-c", "local", "-e", "gpu_topology_recorded_dir=/nonexistent/rec"
    )
    assert proc.returncode != 0
    assert "recorded-hardware folder '/nonexistent/rec' does not exist" in proc.stdout + proc.stderr
