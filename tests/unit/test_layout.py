"""vllm_fleet.plan.layout over real recorded topologies (tests/unit/test_topology.py names their sources)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.layout import (
    Layout,
    check_heads,
    format_probe_report,
    model_heads,
    placement_groups,
    plan_layout,
)
from vllm_fleet.probe.topology import Topology, build_topology, build_topology_from_dir, strip_fixture_header

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TOPO = FIXTURES / "topology"
H200 = FIXTURES / "gpu-host-h200x2"


def fixture(name: str) -> str:
    return strip_fixture_header((TOPO / name).read_text(encoding="utf-8"))


def topo_of(name: str, **more: str) -> Topology:
    return build_topology(topo_m=fixture(name), **more)


FOUR_GPU = "topo-4gpu-pxb-pix-sys-no-gpunumaid-tabs-nccl-667.txt"
L40S = "topo-4xL40S-dualsocket-384cpu-2nic-nic-legend-miss-alignment-106.txt"
RTX4090_8 = "topo-8x4090-dualsocket-2nic-tabs-gpuallocator-17.txt"
H100_8 = "topo-8xH100-nv18-9nic-tabs-nccl-1453-TRUNCATED.txt"
TWO_5090 = "topo-2x5090-threadripper-phb-tabs-club3090-1229.txt"
P2P_5090 = "p2p-rw-2x5090-gns-tabs-club3090-1229.txt"
THREADRIPPER = "numactl-H-threadripper3960x-nps4-memoryless-nodes-numactl-165.txt"
EPYC_2S = "numactl-hardware-cpu-compress-2x-epyc9135-4090-ktransformers-797.txt"


@pytest.mark.parametrize("name", [FOUR_GPU, L40S])
def test_dual_socket_four_gpus_become_two_tp2_bound_to_their_nodes(name: str) -> None:
    layout = plan_layout(topo_of(name), 2, vllm_version="0.32.0")
    assert [i.gpus for i in layout.instances] == [[0, 1], [2, 3]]
    assert [i.numa_node for i in layout.instances] == [0, 1]
    assert [i.numa_binding for i in layout.instances] == [
        {"mode": "numactl", "nodes": [0]},
        {"mode": "numactl", "nodes": [1]},
    ]
    assert [i.port for i in layout.instances] == [8000, 8001]
    assert [i.cuda_visible_devices for i in layout.instances] == ["0,1", "2,3"]
    assert all(i.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for i in layout.instances)
    assert "numactl --cpunodebind=1 --membind=1" in " ".join(layout.instances[1].reasons)
    assert any("Placement group GPU2, GPU3: on NUMA node 1" in r for r in layout.reasons)
    assert not layout.idle_gpus and not layout.warnings


@pytest.mark.parametrize("name", [FOUR_GPU, L40S])
def test_dual_socket_four_gpus_auto_tp_is_two(name: str) -> None:
    layout = plan_layout(topo_of(name), num_attention_heads=32, num_key_value_heads=8)
    assert layout.tensor_parallel_size == 2 and len(layout.instances) == 2
    assert "tensor_parallel_size not given" in layout.reasons[0]


@pytest.mark.parametrize("version", ["0.20.0", None])
def test_tp4_across_sockets_uses_vllm_numa_bind_from_020(version: str | None) -> None:
    """None means the newest catalogued release, as everywhere else (capacity, render): one semantics."""
    layout = plan_layout(topo_of(FOUR_GPU), 4, vllm_version=version)
    (instance,) = layout.instances
    assert instance.numa_binding == {"mode": "vllm", "nodes": [0, 0, 1, 1]} and instance.numa_node is None
    assert "--numa-bind-nodes 0 0 1 1" in " ".join(instance.reasons)
    assert instance.disable_custom_all_reduce  # 4 PCIe-only GPUs: vLLM would refuse custom all-reduce
    assert any("span groups" in r for r in layout.reasons)


def test_tp4_across_sockets_on_older_vllm_is_unbound_with_advice() -> None:
    layout = plan_layout(topo_of(FOUR_GPU), 4, vllm_version="0.19.1")
    (instance,) = layout.instances
    assert instance.numa_binding == {"mode": "none", "nodes": []}
    assert any("2 x TP2 instead of one TP4" in w for w in layout.warnings)


def test_8x4090_dual_socket_all_sys() -> None:
    """Every pair is SYS, even inside a socket; NUMA affinity still splits 0-3 / 4-7. Auto TP: 2 x TP4, each
    bound to its node; custom all-reduce off (more than two PCIe-only GPUs)."""
    topo = topo_of(RTX4090_8)
    layout = plan_layout(topo, vllm_version="0.32.0")
    assert [i.gpus for i in layout.instances] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [i.numa_binding["nodes"] for i in layout.instances] == [[0], [1]]
    assert all(i.disable_custom_all_reduce for i in layout.instances)
    assert any("SYS between them even so" in r for r in layout.reasons)
    tp2 = plan_layout(topo, 2)
    assert [i.gpus for i in tp2.instances] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [i.port for i in tp2.instances] == [8000, 8001, 8002, 8003]
    assert [i.numa_node for i in tp2.instances] == [0, 0, 1, 1]
    tp8 = plan_layout(topo, 8, vllm_version="0.32.0")
    assert tp8.instances[0].numa_binding == {"mode": "vllm", "nodes": [0] * 4 + [1] * 4}


def test_rtx4090_without_p2p_probe_turns_p2p_off() -> None:
    """The topo -m capture is a real 8 x RTX 4090 server (go-gpuallocator#17); its post names the cards but
    carries no query-gpu output, so the name is set from the post's text."""
    topo = topo_of(RTX4090_8)
    for gpu in topo.gpus:
        gpu.name = "NVIDIA GeForce RTX 4090"
    layout = plan_layout(topo, 2)
    for instance in layout.instances:
        assert instance.disable_custom_all_reduce and instance.env["NCCL_P2P_DISABLE"] == "1"
        assert "RTX 4090 has no GPU peer-to-peer" in " ".join(instance.reasons)


def test_p2p_not_supported_disables_custom_all_reduce_and_nccl_p2p() -> None:
    topo = topo_of(TWO_5090, p2p=fixture(P2P_5090))
    (instance,) = plan_layout(topo, 2).instances
    assert instance.disable_custom_all_reduce and instance.env["NCCL_P2P_DISABLE"] == "1"
    assert "GPU0-GPU1 GNS (GPU not supported)" in " ".join(instance.reasons)
    assert instance.numa_binding == {"mode": "numactl", "nodes": [0]}


def test_8xh100_nvlink_one_tp8() -> None:
    topo = topo_of(H100_8)
    auto = plan_layout(topo, vllm_version="0.33.0", num_attention_heads=64, num_key_value_heads=8)
    (instance,) = auto.instances
    assert instance.gpus == list(range(8)) and instance.tensor_parallel_size == 8
    assert instance.numa_binding == {"mode": "vllm", "nodes": [0] * 4 + [1] * 4}
    assert not instance.disable_custom_all_reduce and "NCCL_P2P_DISABLE" not in instance.env
    assert "NVLink joins all its GPUs" in " ".join(instance.reasons)
    assert [g.gpus for g in placement_groups(topo)] == [list(range(8))]


def h200_topology() -> Topology:
    read = lambda name: (H200 / name).read_text(encoding="utf-8")  # noqa: E731
    return build_topology(
        topo_m=read("nvsmi-topo-m.txt"),
        p2p=read("nvsmi-topo-p2p-r.txt"),
        p2p_write=read("nvsmi-topo-p2p-w.txt"),
        numactl=read("numactl-H.txt"),
        lscpu=read("lscpu.txt"),
        query_gpu=read("nvsmi-query.txt"),
        sysfs_numa=read("sys-pci-gpus.txt"),
    )


@pytest.mark.parametrize("source", ["shared capture", "fresh capture"])
def test_h200x2_one_tp2_nvlink_p2p_ok_numa_unknown(source: str) -> None:
    if source == "shared capture":
        topo = h200_topology()
    else:
        topo = build_topology_from_dir(TOPO / "recorded" / "h200x2")
    layout = plan_layout(topo, 2, vllm_version="0.32.0")
    (instance,) = layout.instances
    assert instance.gpus == [0, 1] and instance.tensor_parallel_size == 2
    assert instance.numa_binding == {"mode": "none", "nodes": []} and instance.numa_node is None
    assert not instance.disable_custom_all_reduce
    assert instance.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1"}
    text = " ".join(instance.reasons)
    assert "sysfs numa_node is -1" in text and "custom all-reduce allowed (NVLink)" in text
    assert "single NUMA node (0), so binding would change nothing" in text and not layout.warnings
    assert "P2P reads/writes are OK" in text


def test_heads_rules() -> None:
    with pytest.raises(
        FleetInputError, match=r"tensor_parallel_size: 3 does not divide .*num_attention_heads \(32\)"
    ):
        plan_layout(topo_of(FOUR_GPU), 3, num_attention_heads=32)
    with pytest.raises(FleetInputError, match=r"num_key_value_heads \(6\)"):
        check_heads(4, 24, 6)
    with pytest.raises(FleetInputError, match="multiple of 3"):
        check_heads(4, 12, 3)
    replicated = plan_layout(topo_of(RTX4090_8), 8, num_attention_heads=24, num_key_value_heads=4)
    assert any("replicates each KV head on 2 GPUs" in r for r in replicated.reasons)
    assert check_heads(4, 32, 8) == [
        "TP4 divides the model's 32 attention heads: 8 per GPU.",
        "Each GPU holds 2 of the model's 8 KV heads.",
    ]


def test_bad_arguments_are_refused() -> None:
    topo = topo_of(FOUR_GPU)
    with pytest.raises(FleetInputError, match="tensor_parallel_size: 8 but the host has 4 GPUs"):
        plan_layout(topo, 8)
    with pytest.raises(FleetInputError, match="tensor_parallel_size: 0 is not a positive"):
        plan_layout(topo, 0)
    with pytest.raises(FleetInputError, match="base_port: 70000"):
        plan_layout(topo, 2, base_port=70000)
    with pytest.raises(FleetInputError, match="vLLM version: cannot read 'latest'"):
        plan_layout(topo, 2, vllm_version="latest")


def test_leftover_gpus_span_groups_or_stay_idle() -> None:
    layout = plan_layout(topo_of(FOUR_GPU), 3, vllm_version="0.32.0")
    assert [i.gpus for i in layout.instances] == [[0, 1, 2]] and layout.idle_gpus == [3]
    assert layout.instances[0].numa_binding == {"mode": "vllm", "nodes": [0, 0, 1]}
    assert any("GPU3 left idle" in w for w in layout.warnings)


def test_cpu_only_host_binds_to_node_0() -> None:
    numactl = fixture(EPYC_2S)
    topo = build_topology(topo_m="No devices were found\n", numactl=numactl)
    layout = plan_layout(topo, 2)
    (instance,) = layout.instances
    assert instance.device == "cpu" and instance.gpus == [] and layout.cpu_only
    assert instance.numa_binding == {"mode": "numactl", "nodes": [0]} and instance.port == 8000
    assert any("tensor_parallel_size 2 ignored" in w for w in layout.warnings)
    bare = plan_layout(build_topology(), None)
    assert bare.instances[0].numa_binding == {"mode": "none", "nodes": []}


def test_memoryless_node_binds_memory_to_the_nearest_node_with_memory() -> None:
    topo = build_topology(numactl=fixture(THREADRIPPER))
    (instance,) = plan_layout(topo).instances
    assert instance.numa_binding == {"mode": "numactl", "nodes": [0], "membind_nodes": [1]}
    assert any("has no memory of its own" in w for w in plan_layout(topo).warnings)


def test_layout_round_trips_through_json() -> None:
    layout = plan_layout(topo_of(L40S), 2, vllm_version="0.32.0")
    assert Layout.from_dict(layout.to_dict()).to_dict() == layout.to_dict()
    as_list = Layout.from_dict([i.to_dict() for i in layout.instances])
    assert [i.gpus for i in as_list.instances] == [[0, 1], [2, 3]]
    with pytest.raises(FleetInputError, match="layout instance"):
        Layout.from_dict([{"gpus": [0]}])


def test_probe_report_h200() -> None:
    topo = h200_topology()
    report = format_probe_report(topo, plan_layout(topo, 2, vllm_version="0.32.0"))
    assert "GPU0  NVIDIA H200  143771 MiB  bus 0000:00:06.0  NUMA unknown  CPUs 0-31" in report
    assert "NV18 = a bonded set of 18 NVLinks" in report
    assert "P2P (nvidia-smi topo -p2p, read + write" in report
    assert "node 0: CPUs 0-31  4699 MB" in report
    assert "KVM guest" in report
    assert "i0: GPUs 0,1  TP2  port 8000  NUMA binding none  custom all-reduce allowed" in report


def test_probe_report_lists_pcie_links_below_max() -> None:
    topo = build_topology_from_dir(TOPO / "recorded" / "h200x2")
    assert "every GPU at its maximum" in format_probe_report(topo, plan_layout(topo, 2))
    topo.gpus[1].pcie_gen_current = 1  # what an idle GPU reports after power-saving downshift
    report = format_probe_report(topo, plan_layout(topo, 2))
    assert "PCIe links below their maximum" in report and "GPU1: gen 1 of 5" in report


def test_probe_report_cpu_only_and_dual_socket() -> None:
    report = format_probe_report(build_topology(), plan_layout(build_topology()))
    assert "GPUs: none" in report and "i0: CPU" in report
    topo = topo_of(FOUR_GPU)
    report = format_probe_report(topo, plan_layout(topo, 2))
    assert "  GPU2  SYS   SYS   X     PIX" in report
    assert "i1: GPUs 2,3  TP2  port 8001  NUMA binding numactl [1]" in report


def test_heads_from_the_model_config() -> None:
    llama = json.loads((FIXTURES / "models" / "llama-3.1-8b.config.json").read_text(encoding="utf-8"))
    assert model_heads(llama) == (32, 8)
    # Multimodal configs nest the language model under text_config.
    assert model_heads({"architectures": ["X"], "text_config": llama}) == (32, 8)
    mha = {k: v for k, v in llama.items() if k != "num_key_value_heads"}
    assert model_heads(mha) == (32, 32)
    layout = plan_layout(topo_of(L40S), 4, model_config=llama, vllm_version="0.32.0")
    assert "TP4 divides the model's 32 attention heads: 8 per GPU." in layout.reasons
    with pytest.raises(FleetInputError, match="num_attention_heads"):
        plan_layout(topo_of(L40S), 3, model_config=llama)
    with pytest.raises(FleetInputError, match="num_key_value_heads is '8'"):
        model_heads({**llama, "num_key_value_heads": "8"})


def test_truncated_matrix_is_not_planned() -> None:
    v100 = fixture("topo-16xV100-dgx2-nv6-mlx5-columns-cpu-affinity-only-nccl-tests-78-TRUNCATED.txt")
    topo = build_topology(topo_m=v100, allow_incomplete=True)
    with pytest.raises(FleetInputError, match=r"rows GPU5, GPU6, .* are missing"):
        plan_layout(topo, 8)


def test_numa_unknown_on_a_multi_node_host_warns() -> None:
    """The 4-GPU capture with its affinity columns cut away (as vllm#19607 prints blank cells) and a numactl
    listing derived from the capture's own CPU affinity (0-27,56-83 / 28-55,84-111)."""
    rows = [line.split("\t") for line in fixture(FOUR_GPU).splitlines()]
    blank = "\n".join("\t".join(cells[:5]) for cells in rows)
    numactl = "available: 2 nodes (0-1)\nnode 0 cpus: 0-27,56-83\nnode 1 cpus: 28-55,84-111\n"
    layout = plan_layout(build_topology(topo_m=blank, numactl=numactl), 2)
    assert all(i.numa_binding["mode"] == "none" for i in layout.instances)
    assert any("NUMA node unknown on a host with 2 NUMA nodes" in w for w in layout.warnings)
