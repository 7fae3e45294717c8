"""`vllm-fleet topology`, run through the installed console script over real captures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H200 = FIXTURES / "gpu-host-h200x2"
TOPO = FIXTURES / "topology"
SCRIPT = Path(sys.executable).with_name("vllm-fleet")


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert SCRIPT.exists(), f"console script missing: {SCRIPT} (pip install -e .)"
    return subprocess.run(
        [str(SCRIPT), "topology", *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def test_h200x2_capture_json() -> None:
    result = run(
        "--topo-m", H200 / "nvsmi-topo-m.txt",
        "--p2p", H200 / "nvsmi-topo-p2p-r.txt",
        "--p2p-write", H200 / "nvsmi-topo-p2p-w.txt",
        "--query-gpu", H200 / "nvsmi-query.txt",
        "--numactl", H200 / "numactl-H.txt",
        "--lscpu", H200 / "lscpu.txt",
        "--sysfs-numa", H200 / "sys-pci-gpus.txt",
        "--tensor-parallel-size", "2",
        "--vllm-version", "0.32.0",
        "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [g["index"] for g in data["gpus"]] == [0, 1]
    assert [g["numa_node"] for g in data["gpus"]] == [None, None]
    assert all("-1" in g["numa_source"] for g in data["gpus"])
    assert data["links"] == [["X", "NV18"], ["NV18", "X"]]
    assert data["p2p"] == [["X", "OK"], ["OK", "X"]]
    assert data["nics"] == [] and data["numa_known"] is False
    assert data["numa_nodes"] == [{"id": 0, "cpus": list(range(32)), "memory_mb": 4699, "free_mb": 3392}]
    (instance,) = data["layout"]
    assert instance["gpus"] == [0, 1] and instance["numa_node"] is None
    assert instance["tensor_parallel_size"] == 2
    assert instance["numa_binding"] == {"mode": "none", "nodes": []}
    assert instance["disable_custom_all_reduce"] is False


def test_topo_m_and_p2p_only_as_in_design() -> None:
    result = run("--topo-m", H200 / "nvsmi-topo-m.txt", "--p2p", H200 / "nvsmi-topo-p2p-r.txt", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["links"][0][1] == "NV18" and data["p2p"][1][0] == "OK"
    assert data["layout"][0]["gpus"] == [0, 1]


def test_human_report_for_a_pasted_dual_socket_matrix() -> None:
    result = run("--topo-m", TOPO / "topo-4gpu-pxb-pix-sys-no-gpunumaid-tabs-nccl-667.txt", "-tp", "2")
    assert result.returncode == 0, result.stderr
    assert "Links (nvidia-smi topo -m):" in result.stdout
    assert "i0: GPUs 0,1  TP2  port 8000  NUMA binding numactl [0]" in result.stdout
    assert "i1: GPUs 2,3  TP2  port 8001  NUMA binding numactl [1]" in result.stdout


def test_recorded_folder() -> None:
    result = run("--recorded", TOPO / "recorded" / "h200x2", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["gpus"][0]["pcie"] == {
        "gen_current": 5, "gen_max": 5, "width_current": 16, "width_max": 16, "below_max": []
    }  # fmt: skip
    assert data["tensor_parallel_size"] == 2


def test_model_config_heads_are_checked() -> None:
    result = run(
        "--topo-m", TOPO / "topo-4xL40S-dualsocket-384cpu-2nic-nic-legend-miss-alignment-106.txt",
        "--model-config", FIXTURES / "models" / "llama-3.1-8b.config.json",
        "-tp", "3",
    )  # fmt: skip
    assert result.returncode == 2
    assert "num_attention_heads (32)" in result.stderr and result.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topo-m", H200 / "nvsmi-topo-p2p-r.txt"], "not `nvidia-smi topo -m`"),
        (["--topo-m", H200 / "lscpu.txt"], "no `nvidia-smi topo -m` matrix"),
        (["--topo-m", "/nonexistent/topo.txt"], "--topo-m: cannot read"),
        ([], "give --topo-m FILE"),
        (["--recorded", H200 / "README.md"], "recorded-hardware folder"),
        (["--topo-m", H200 / "nvsmi-topo-m.txt", "--numactl", H200 / "lscpu.txt"], "numactl"),
    ],
)
def test_bad_input_exits_2_naming_it(args: list[str | Path], message: str) -> None:
    result = run(*args)
    assert result.returncode == 2, result.stdout
    assert result.stderr.startswith("vllm-fleet topology: error:") and message in result.stderr


def test_truncated_paste_is_reported_not_planned() -> None:
    v100 = TOPO / "topo-16xV100-dgx2-nv6-mlx5-columns-cpu-affinity-only-nccl-tests-78-TRUNCATED.txt"
    result = run("--topo-m", v100, "--json")
    assert result.returncode == 0, result.stderr
    assert "warning: not planned: topo -m rows GPU5" in result.stderr
    data = json.loads(result.stdout)
    assert data["complete"] is False and len(data["gpus"]) == 16 and len(data["nics"]) == 10
    assert data["links"][0][1:5] == ["NV6"] * 4 and data["links"][6][7] is None
    assert data["gpus"][0]["cpus"] == list(range(24)) + list(range(48, 72))
    assert data["layout"] == [] and data["layout_warnings"][0].startswith("not planned")


def test_pasted_report_with_topo_and_p2p_blocks() -> None:
    result = run("--topo-m", TOPO / "topo-2gpu-node-indented-wrapped-club3090-1125.txt", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["links"] == [["X", "NODE"], ["NODE", "X"]] and data["p2p"] == [["X", "NS"], ["NS", "X"]]
    (instance,) = data["layout"]
    assert instance["disable_custom_all_reduce"] is True and instance["env"]["NCCL_P2P_DISABLE"] == "1"
    assert instance["numa_binding"] == {"mode": "numactl", "nodes": [0]}
