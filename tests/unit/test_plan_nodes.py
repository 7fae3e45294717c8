"""One vLLM instance over several hosts (issue 33): ranks, argv, capacity and the refusals before any change.

Every topology is a real recording (tests/fixtures/topology: the 8 x RTX 4090 dual-socket server of
NVIDIA/go-gpuallocator#17, the lent 2 x H200 machine, the 4-GPU host of NVIDIA/nccl#667, and the CPU-only view
of the H200 machine the lab plans from); every model config.json is a real one from tests/fixtures/models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from plans import LAB_VARS, TINY_CONFIG, cpu_topology

from vllm_fleet.plan.build import build_host_plan
from vllm_fleet.plan.capacity import plan_capacity
from vllm_fleet.plan.host import HostPlan, InstancePlan
from vllm_fleet.plan.inventory import plan_inventory
from vllm_fleet.plan.nodes import Peer, peer_of
from vllm_fleet.probe.topology import Topology, build_topology_from_dir, build_topology_from_texts

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
EXAMPLE = ROOT / "inventory" / "examples" / "2x4x4090-pp"
RECORDED = FIXTURES / "topology" / "recorded"


def model(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / "models" / f"{name}.config.json").read_text())


def rtx4090x8() -> Topology:
    return build_topology_from_dir(str(RECORDED / "8x4090-dual-socket"))


def h200x2() -> Topology:
    return build_topology_from_dir(str(RECORDED / "h200x2"))


def four_gpus() -> Topology:
    text = (FIXTURES / "topology" / "topo-4gpu-pxb-pix-sys-no-gpunumaid-tabs-nccl-667.txt").read_text()
    return build_topology_from_texts({"topo_m": text})


SERVE = {
    "vllm_service_model": "/data/models/m",
    "vllm_service_max_model_len": 32768,
    "vllm_service_kv_cache_memory_bytes": 4 * 2**30,
    "vllm_service_host": "127.0.0.1",
    "vllm_service_nodes": ["a", "b"],
}
ADDRESSES = {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"}


def group(
    topologies: dict[str, Topology],
    variables: dict[str, Any],
    *,
    config: dict[str, Any],
    version: str = "0.32.0",
    per_host: dict[str, dict[str, Any]] | None = None,
) -> dict[str, HostPlan]:
    """Every member's plan, each seeing the others as preflight does (peers from their variables/facts)."""
    own = {h: {**variables, **(per_host or {}).get(h, {})} for h in topologies}
    peers: dict[str, Peer] = {
        h: peer_of(h, own[h], t, vllm_version=version, ansible_host=ADDRESSES[h])
        for h, t in topologies.items()
    }
    return {
        h: build_host_plan(
            h,
            own[h],
            t,
            vllm_version=version,
            model_config=config,
            model_config_source="fixture",
            peers=peers,
        )
        for h, t in topologies.items()
    }


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def without(argv: list[str], *names: str) -> list[str]:
    """argv without the named flags and their values (--headless has none)."""
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in names:
            skip = word != "--headless"
        else:
            out.append(word)
    return out


# ------------------------------------------------------------------------------------ the example inventory


@pytest.fixture(scope="module")
def example() -> dict[str, HostPlan]:
    return plan_inventory(str(EXAMPLE), project_dir=ROOT)


def test_the_example_plans_one_instance_over_its_two_hosts(example: dict[str, HostPlan]) -> None:
    assert list(example) == ["pp-4090-a", "pp-4090-b"]
    assert all(p.ok for p in example.values()), {h: p.errors for h, p in example.items()}
    (rank0,) = example["pp-4090-a"].instances
    (rank1,) = example["pp-4090-b"].instances
    for plan, rank in ((rank0, 0), (rank1, 1)):
        assert flag(plan.argv, "--nnodes") == "2"
        assert flag(plan.argv, "--node-rank") == str(rank)
        assert flag(plan.argv, "--master-addr") == "192.0.2.21"  # rank 0's ansible_host
        assert flag(plan.argv, "--master-port") == "29501"
        assert flag(plan.argv, "--tensor-parallel-size") == "4"
        assert flag(plan.argv, "--pipeline-parallel-size") == "2"
        assert plan.node is not None and plan.node["stage_layers"] == [24, 24]
    assert flag(rank0.argv, "--port") == "8000" and flag(rank0.argv, "--host") == "0.0.0.0"
    assert "--headless" not in rank0.argv
    assert "--headless" in rank1.argv
    assert "--port" not in rank1.argv and "--host" not in rank1.argv  # no API beyond rank 0
    assert rank0.env["VLLM_HOST_IP"] == "192.0.2.21" and rank1.env["VLLM_HOST_IP"] == "192.0.2.22"
    # apart from rank, headless and the API's address, both ranks run the same command
    assert without(rank0.argv, "--node-rank", "--host", "--port") == without(
        rank1.argv, "--node-rank", "--headless"
    )


def test_the_examples_capacity_is_plan_capacitys_for_two_stages(example: dict[str, HostPlan]) -> None:
    """The one capacity function with the instance's PP: the pool is the block count of the stage with the
    most layers, the same figure on both ranks (vLLM takes the smallest count of all workers)."""
    config = model("qwen3-coder-next")
    expected = plan_capacity(
        config,
        tensor_parallel_size=4,
        pipeline_parallel_size=2,
        kv_cache_dtype="auto",
        max_model_len=131072,
        kv_bytes_per_gpu=2 * 2**30,
        vllm_version="0.32.0",
        dtype="bfloat16",
        device="GPU",
        env={
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": "0,1,2,3",
            "VLLM_HOST_IP": "192.0.2.21",
        },
    )
    for host in example.values():
        capacity = host.instances[0].capacity
        assert capacity is not None
        assert capacity["gpu_kv_tokens"] == expected.gpu_kv_tokens
        assert capacity["pipeline_parallel_size"] == 2
    # rank 0's engine core prints the instance's KV figure; verify expects it there only
    assert example["pp-4090-a"].instances[0].expectations["kv_cache_tokens"] == expected.gpu_kv_tokens
    assert "kv_cache_tokens" not in example["pp-4090-b"].instances[0].expectations


def test_the_capacity_is_the_largest_stages_block_count_wherever_it_sits() -> None:
    """--pp-layer-partition (VLLM_PP_LAYER_PARTITION) moves layers between stages: the stage with more layers
    has fewer blocks and sets the instance's capacity, first stage or last."""
    config = model("llama-3.1-8b")

    def tokens(partition: list[int]) -> int:
        plans = group(
            {"a": rtx4090x8(), "b": rtx4090x8()},
            {**SERVE, "vllm_service_pp_layer_partition": partition},
            config=config,
        )
        capacity = plans["a"].instances[0].capacity
        assert plans["a"].ok and capacity is not None, plans["a"].errors
        assert capacity == plans["b"].instances[0].capacity
        return int(capacity["gpu_kv_tokens"])

    even = tokens([16, 16])
    assert tokens([20, 12]) == tokens([12, 20]) < even
    plans = group(
        {"a": rtx4090x8(), "b": rtx4090x8()},
        {**SERVE, "vllm_service_pp_layer_partition": [20, 12]},
        config=config,
    )
    (rank1,) = plans["b"].instances
    assert rank1.env["VLLM_PP_LAYER_PARTITION"] == "20,12"
    assert rank1.node is not None and rank1.node["stages"] == [1] and rank1.node["stage_layers"] == [20, 12]


def test_more_stages_than_hosts_keep_tensor_parallelism_inside_each_host() -> None:
    """TP4 x PP4 on two 8-GPU hosts: each host holds two stages (vLLM's ranks: pp_rank x TP + tp_rank)."""
    plans = group(
        {"a": rtx4090x8(), "b": rtx4090x8()},
        {**SERVE, "vllm_service_tensor_parallel_size": 4},
        config=model("llama-3.1-8b"),
    )
    (rank1,) = plans["b"].instances
    assert plans["b"].ok, plans["b"].errors
    assert (
        flag(rank1.argv, "--pipeline-parallel-size") == "4"
        and flag(rank1.argv, "--tensor-parallel-size") == "4"
    )
    assert rank1.gpus == list(range(8))
    assert rank1.node is not None and rank1.node["stages"] == [2, 3] and rank1.node["stage_layers"] == [8] * 4


def test_a_cpu_lab_pair_is_pp2_over_the_two_hosts() -> None:
    """The lab's case: two CPU hosts, one worker each, the tiny model's 2 layers one per stage."""
    variables = {
        **LAB_VARS,
        "vllm_service_nodes": ["a", "b"],
        "vllm_service_enforce_eager": False,
        "vllm_service_compilation_config": {"mode": 2, "backend": "eager"},
    }
    plans = group({"a": cpu_topology(), "b": cpu_topology()}, variables, config=TINY_CONFIG)
    assert plans["a"].ok and plans["b"].ok, (plans["a"].errors, plans["b"].errors)
    (rank0,) = plans["a"].instances
    assert flag(rank0.argv, "--pipeline-parallel-size") == "2" and "--tensor-parallel-size" not in rank0.argv
    assert rank0.node is not None and rank0.node["stage_layers"] == [1, 1]


# ------------------------------------------------------------------------------- single-host plans unchanged


def test_a_single_host_instance_plan_has_no_node_key_and_round_trips() -> None:
    single = build_host_plan(
        "a",
        {k: v for k, v in SERVE.items() if k != "vllm_service_nodes"},
        rtx4090x8(),
        vllm_version="0.32.0",
        model_config=model("llama-3.1-8b"),
    )
    assert single.ok, single.errors
    assert all("node" not in i.to_dict() for i in single.instances)
    assert all("--nnodes" not in i.argv for i in single.instances)
    multi = group({"a": rtx4090x8(), "b": rtx4090x8()}, SERVE, config=model("llama-3.1-8b"))["b"].instances[0]
    assert InstancePlan.from_dict(multi.to_dict()).node == multi.node


# ------------------------------------------------------------------------------------------------- refusals


def errors_of(plans: dict[str, HostPlan], host: str = "a") -> str:
    assert not plans[host].ok
    return "\n".join(plans[host].errors)


def test_hosts_with_different_gpus_are_refused_naming_both() -> None:
    text = errors_of(group({"a": rtx4090x8(), "b": h200x2()}, SERVE, config=model("llama-3.1-8b")))
    assert "vllm_service_nodes: the hosts of ['a', 'b'] have different GPUs" in text
    assert "a: 8 x GPU of unknown model" in text and "b: 2 x NVIDIA H200" in text


def test_hosts_with_the_same_count_but_other_gpus_are_refused() -> None:
    """Same count, other kind: the H200 machine's query-gpu names its GPUs; the nccl#667 host's do not."""
    plans = group({"a": h200x2(), "b": four_gpus()}, SERVE, config=model("llama-3.1-8b"))
    assert "have different GPUs" in errors_of(plans)


def test_a_release_without_the_multi_node_flags_is_refused() -> None:
    text = errors_of(
        group({"a": rtx4090x8(), "b": rtx4090x8()}, SERVE, config=model("llama-3.1-8b"), version="0.11.0")
    )
    assert "vllm_service_nodes: --nnodes does not exist in vLLM 0.11.0" in text
    assert "0.11.1" in text and "upgrade vLLM" in text


def test_tp_that_does_not_divide_the_heads_is_refused() -> None:
    """falcon-h1-7b has 12 attention heads; two 8-GPU hosts give TP8 by default."""
    text = errors_of(group({"a": rtx4090x8(), "b": rtx4090x8()}, SERVE, config=model("falcon-h1-7b")))
    assert "vllm_service_tensor_parallel_size: 8 does not divide the model's num_attention_heads (12)" in text


def test_more_stages_than_layers_are_refused() -> None:
    """The lab's tiny model has 2 layers; TP4 on two 8-GPU hosts makes 4 stages."""
    variables = {**SERVE, "vllm_service_tensor_parallel_size": 4}
    text = errors_of(group({"a": rtx4090x8(), "b": rtx4090x8()}, variables, config=TINY_CONFIG))
    assert "vllm_service_pipeline_parallel_size: 4 stages for a model of 2 layers; use at most 2" in text


def test_a_partition_that_does_not_add_up_is_refused() -> None:
    variables = {**SERVE, "vllm_service_pp_layer_partition": [20, 20]}
    text = errors_of(group({"a": rtx4090x8(), "b": rtx4090x8()}, variables, config=model("llama-3.1-8b")))
    assert "vllm_service_pp_layer_partition: 20,20 must be 2 positive layer counts" in text
    assert "32 layers" in text


def test_tp_times_pp_must_be_the_instances_gpus() -> None:
    variables = {**SERVE, "vllm_service_tensor_parallel_size": 8, "vllm_service_pipeline_parallel_size": 4}
    text = errors_of(group({"a": rtx4090x8(), "b": rtx4090x8()}, variables, config=model("llama-3.1-8b")))
    assert "vllm_service_tensor_parallel_size x vllm_service_pipeline_parallel_size: 8 x 4 = 32" in text
    assert "2 hosts x 8 GPUs = 16 workers" in text


def test_tp_across_hosts_is_refused() -> None:
    variables = {**SERVE, "vllm_service_tensor_parallel_size": 16}
    text = errors_of(group({"a": rtx4090x8(), "b": rtx4090x8()}, variables, config=model("llama-3.1-8b")))
    assert "tensor parallelism must stay inside one host" in text


def test_members_that_disagree_on_the_nodes_or_the_master_port_are_refused() -> None:
    plans = group(
        {"a": rtx4090x8(), "b": rtx4090x8()},
        SERVE,
        config=model("llama-3.1-8b"),
        per_host={"b": {"vllm_service_nodes": ["b", "a"], "vllm_service_master_port": 29600}},
    )
    text = errors_of(plans)
    assert "vllm_service_nodes: a says ['a', 'b'] but b says ['b', 'a']" in text
    assert "vllm_service_master_port: a uses 29501 but b uses 29600" in text
    assert "vllm_service_nodes: b says ['b', 'a'] but a says ['a', 'b']" in errors_of(plans, "b")


def test_a_member_missing_from_the_run_or_the_list_is_refused() -> None:
    variables = {**SERVE, "vllm_service_nodes": ["a", "b", "c"]}
    text = errors_of(group({"a": rtx4090x8(), "b": rtx4090x8()}, variables, config=model("llama-3.1-8b")))
    assert "vllm_service_nodes: c (in ['a', 'b', 'c']) not in the inventory, or not in this run" in text
    outsider = {**SERVE, "vllm_service_nodes": ["b", "c"]}
    text = errors_of(group({"a": rtx4090x8(), "b": rtx4090x8()}, outsider, config=model("llama-3.1-8b")))
    assert "vllm_service_nodes: ['b', 'c'] on a does not list a itself" in text


def test_an_address_that_is_no_ip_and_a_master_port_on_the_api_port_are_refused() -> None:
    variables = {**SERVE, "vllm_service_master_port": 8000}
    plans = group(
        {"a": rtx4090x8(), "b": rtx4090x8()},
        variables,
        config=model("llama-3.1-8b"),
        per_host={"a": {"vllm_service_node_address": "head.example"}},
    )
    text = errors_of(plans)
    assert (
        "vllm_service_node_address: a's address between the nodes is 'head.example', not an IP address"
        in text
    )
    assert "vllm_service_master_port: 8000 is also vllm_service_port" in text


def test_cpu_pipeline_stages_with_enforce_eager_are_refused() -> None:
    """The lab's own variables set enforce_eager: over two CPU hosts that kills the first request."""
    variables = {**LAB_VARS, "vllm_service_nodes": ["a", "b"]}
    text = errors_of(group({"a": cpu_topology(), "b": cpu_topology()}, variables, config=TINY_CONFIG))
    assert "vllm_service_enforce_eager: true on a CPU host with pipeline parallelism" in text


# ------------------------------------------------------------------------- the interface between the nodes

IP_ADDR = json.loads((FIXTURES / "network" / "ip-j-addr-controller.json").read_text())


def test_the_interface_that_carries_the_nodes_address_is_gloos_and_nccls() -> None:
    """`ip -j addr show` of a real machine (its eth0 holds 192.0.2.2): the rank whose address that is gets
    GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME eth0."""
    variables = {**SERVE, "vllm_service_node_address": "192.0.2.2"}
    peers = {
        "a": peer_of("a", variables, rtx4090x8(), vllm_version="0.32.0"),
        "b": peer_of("b", SERVE, rtx4090x8(), vllm_version="0.32.0", ansible_host="10.0.0.2"),
    }
    plan = build_host_plan(
        "a",
        variables,
        rtx4090x8(),
        vllm_version="0.32.0",
        model_config=model("llama-3.1-8b"),
        peers=peers,
        interfaces=IP_ADDR,
    )
    assert plan.ok, plan.errors
    (rank0,) = plan.instances
    assert rank0.env["GLOO_SOCKET_IFNAME"] == rank0.env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert rank0.node is not None and rank0.node["interface"] == "eth0"
    # without the host's addresses (vllm-fleet plan --inventory reads no host) the interface is not planned
    (unread,) = build_host_plan(
        "a", variables, rtx4090x8(), vllm_version="0.32.0", model_config=model("llama-3.1-8b"), peers=peers
    ).instances
    assert "GLOO_SOCKET_IFNAME" not in unread.env


def test_an_address_the_host_does_not_have_is_refused() -> None:
    variables = {**SERVE, "vllm_service_node_address": "192.0.2.7"}
    peers = {
        "a": peer_of("a", variables, rtx4090x8(), vllm_version="0.32.0"),
        "b": peer_of("b", SERVE, rtx4090x8(), vllm_version="0.32.0", ansible_host="10.0.0.2"),
    }
    plan = build_host_plan(
        "a",
        variables,
        rtx4090x8(),
        vllm_version="0.32.0",
        model_config=model("llama-3.1-8b"),
        peers=peers,
        interfaces=IP_ADDR,
    )
    text = "\n".join(plan.errors)
    assert "vllm_service_node_address: 192.0.2.7 is no address of a (ip addr shows" in text
    assert "192.0.2.2" in text and "127.0.0.1" in text


def test_vllm_fleet_plan_json_shows_one_instance_over_the_two_hosts() -> None:
    """The issue's check, through the console script: `vllm-fleet plan --inventory ... --json`."""
    import subprocess
    import sys

    cli = Path(sys.executable).parent / "vllm-fleet"
    proc = subprocess.run(
        [str(cli), "plan", "--inventory", str(EXAMPLE), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    (spanning,) = data["instances_over_hosts"]
    assert spanning["nodes"] == ["pp-4090-a", "pp-4090-b"] and spanning["api"]["host"] == "pp-4090-a"
    assert [(r["host"], r["rank"], r["headless"]) for r in spanning["ranks"]] == [
        ("pp-4090-a", 0, False),
        ("pp-4090-b", 1, True),
    ]
    rank0 = data["hosts"]["pp-4090-a"]["instances"][0]["argv"]
    rank1 = data["hosts"]["pp-4090-b"]["instances"][0]["argv"]
    assert (
        flag(rank0, "--nnodes") == "2"
        and flag(rank0, "--node-rank") == "0"
        and flag(rank0, "--port") == "8000"
    )
    assert flag(rank0, "--master-addr") == "192.0.2.21" and "--headless" in rank1
    capacity = spanning["capacity"]
    assert (
        capacity["gpu_kv_tokens"] == data["hosts"]["pp-4090-b"]["instances"][0]["capacity"]["gpu_kv_tokens"]
    )
    # and a single-host inventory's JSON has no such key (its output is as it was)
    single = subprocess.run(
        [str(cli), "plan", "--inventory", str(ROOT / "inventory" / "examples" / "seed-4x4090"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "instances_over_hosts" not in json.loads(single.stdout)
