"""Serve flags in vllm_service_extra_args that change the capacity plan (render/extra_args.py): read with
argparse's spellings and given to the planner, or refused in preflight naming vllm_service_extra_args.

The spec is the seed inventory's (inventory/examples/seed-4x4090), the instance one TP4 instance of the
recorded 8 x RTX 4090 host (tests/fixtures/topology), the model configs real checkpoints'
(tests/fixtures/models, source beside each). The expected figures are plan_capacity's own with the flag
given directly: the test shows the flag reaches the planner, not what the planner computes
(tests/unit/test_capacity*.py do that).
"""

from __future__ import annotations

import pytest
from test_render_support import model_config, rtx4090_instance, seed_spec

from vllm_fleet import flags as flagcat
from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.capacity import plan_capacity
from vllm_fleet.render.extra_args import plan_flags
from vllm_fleet.render.serve import render_instance

VERSION = "0.33.0"
RELEASE = flagcat.release(VERSION)


def rendered(extra_args: list[str], model: str = "qwen3-14b"):
    spec = seed_spec(rope_scaling={}, extra_args=extra_args, max_model_len=32768)
    return render_instance(spec, rtx4090_instance(), VERSION, model_config=model_config(model), topology={})


def direct(model: str = "qwen3-14b", **flags) -> dict:
    spec = seed_spec(rope_scaling={}, max_model_len=32768)
    return plan_capacity(
        model_config(model),
        tensor_parallel_size=4,
        kv_cache_dtype=spec.kv_cache_dtype or "auto",
        max_model_len=32768,
        kv_bytes_per_gpu=spec.kv_cache_memory_bytes,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        avg_input_len=spec.avg_input_len,
        vllm_version=VERSION,
        num_speculative_tokens=spec.num_speculative_tokens,
        enable_prefix_caching=spec.enable_prefix_caching,
        dtype=spec.dtype,
        **flags,
    ).to_dict()


@pytest.mark.parametrize(
    "words",
    [
        ["--block-size", "32"],
        ["--block-size=32"],
        ["--block_size", "32"],
        ["--block-size", "64", "--block-size", "32"],  # argparse: the last one wins
        ["--tokenizer", "Qwen/Qwen3-14B", "--block-size", "32", "--trust-remote-code"],
    ],
)
def test_block_size_spellings(words: list[str]) -> None:
    flags = plan_flags(words, RELEASE)
    assert flags.block_size == 32 and flags.pipeline_parallel_size is None


def test_aliases_and_modes() -> None:
    flags = plan_flags(["-dcp", "2", "--mamba-cache-mode=align", "-pp", "1"], RELEASE)
    assert (flags.decode_context_parallel_size, flags.mamba_cache_mode, flags.pipeline_parallel_size) == (
        2,
        "align",
        1,
    )
    assert flags.spelled["decode_context_parallel_size"] == "-dcp 2"


def test_another_flags_value_is_not_read_as_a_flag() -> None:
    # '--served-model-name'-like values are skipped with their flag; '-1' is a number, not an option
    assert plan_flags(["--seed", "-1", "--block-size", "8"], RELEASE).block_size == 8


@pytest.mark.parametrize(
    ("words", "text"),
    [
        (["--block-size", "big"], "vllm_service_extra_args: --block-size 'big' is not a whole number >= 1"),
        (["--block-size=0"], "vllm_service_extra_args: --block-size '0' is not a whole number >= 1"),
        (["--block-size"], "vllm_service_extra_args: --block-size needs a value"),
        (["-dcp", "--enforce-eager"], "vllm_service_extra_args: -dcp needs a value"),
        (
            ["--mamba-cache-mode", "every"],
            "--mamba-cache-mode 'every' is not a mode vLLM 0.33.0 takes; use one of",
        ),
    ],
)
def test_bad_values_name_the_variable_and_the_fix(words: list[str], text: str) -> None:
    with pytest.raises(FleetInputError, match="vllm_service_extra_args") as info:
        plan_flags(words, RELEASE)
    assert text in str(info.value)


def test_block_size_reaches_the_plan() -> None:
    out = rendered(["--block-size", "32"])
    assert out.expectations["capacity"] == direct(block_size=32)
    assert out.expectations["capacity"] != rendered([]).expectations["capacity"]
    assert out.expectations["capacity"]["block_size"] == 32


def test_mamba_cache_mode_reaches_the_plan_of_a_hybrid() -> None:
    # the seed turns prefix caching on, so 0.33's default for the hybrid is "align"; "none" keeps one state
    default = rendered([], model="qwen3.6-27b").expectations["capacity"]
    none = rendered(["--mamba-cache-mode", "none"], model="qwen3.6-27b").expectations["capacity"]
    assert none == direct("qwen3.6-27b", mamba_cache_mode="none")
    assert default == direct("qwen3.6-27b") == direct("qwen3.6-27b", mamba_cache_mode="align")
    assert none["max_concurrency"] > default["max_concurrency"]


def test_decode_context_parallelism_reaches_the_plan() -> None:
    out = rendered(["--decode-context-parallel-size", "2"])
    assert out.expectations["capacity"] == direct(decode_context_parallel_size=2)
    assert out.expectations["kv_cache_tokens"] == direct(decode_context_parallel_size=2)["gpu_kv_tokens"]


@pytest.mark.parametrize(
    "words", [["-pp", "2"], ["--pipeline-parallel-size=2"], ["--data-parallel-size", "2"]]
)
def test_pipeline_or_data_parallelism_is_refused_before_any_host_changes(words: list[str]) -> None:
    out = rendered(words)
    refusal = [e for e in out.errors if e.startswith("vllm_service_extra_args:")]
    assert len(refusal) == 1 and "i.e. 4 x 2 GPUs, but the layout gives it its 4" in refusal[0]
    assert "remove it from vllm_service_extra_args" in refusal[0]


def test_a_dcp_size_that_does_not_divide_tp_is_refused() -> None:
    # vllm/config/parallel.py: "tp_size needs to be divisible by dcp_size" (DCP reuses the TP group's GPUs)
    out = rendered(["-dcp", "3"])
    assert any(
        e.startswith("vllm_service_extra_args: -dcp 3 does not divide instance")
        and "tensor_parallel_size 4" in e
        for e in out.errors
    )
    assert not any("does not divide" in e for e in rendered(["-dcp", "4"]).errors)


def test_a_bad_value_is_a_preflight_error() -> None:
    out = rendered(["--block-size", "big"])
    assert any("vllm_service_extra_args: --block-size 'big'" in e for e in out.errors)
    assert "kv_cache_tokens" not in out.expectations


def test_num_gpu_blocks_override_leaves_the_kv_cache_unplanned() -> None:
    out = rendered(["--num-gpu-blocks-override", "512"])
    assert "kv_cache_tokens" not in out.expectations
    assert any("--num-gpu-blocks-override 512: vLLM allocates that many blocks" in w for w in out.warnings)


@pytest.mark.parametrize(
    "word", ["--no-enable-prefix-caching", "--enable_prefix_caching", "--kv-cache-dtype=fp8"]
)
def test_flags_with_a_variable_stay_refused(word: str) -> None:
    with pytest.raises(FleetInputError, match="remove it from vllm_service_extra_args and set vllm_service_"):
        seed_spec(extra_args=[word])
