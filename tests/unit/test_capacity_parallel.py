"""Pipeline stages, decode context parallelism and the exact/approximate verdict of plan_capacity.

Worked out by hand from vLLM 0.26's sources: the stage split is get_pp_indices (vllm/distributed/utils.py) and
the DCP count FullAttentionSpec.max_memory_usage_bytes. The real PP and DCP logs that the planner reproduces
are in test_capacity_pp_cpu.py (vLLM 0.32.0's CPU build).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.capacity import plan_capacity, pp_stage_layers

MODELS = Path(__file__).resolve().parent.parent / "fixtures" / "models"
GIB = 2**30


def config(name: str) -> dict:
    return json.loads((MODELS / f"{name}.config.json").read_text())


@pytest.mark.parametrize(
    ("layers", "pp", "stages"),
    [(27, 2, [14, 13]), (48, 2, [24, 24]), (62, 4, [15, 16, 16, 15]), (61, 4, [15, 15, 16, 15]), (7, 1, [7])],
)
def test_stage_split_is_get_pp_indices(layers: int, pp: int, stages: list[int]) -> None:
    assert pp_stage_layers(layers, pp) == stages


def test_explicit_partition_and_its_errors() -> None:
    assert pp_stage_layers(48, 2, [16, 32]) == [16, 32]
    with pytest.raises(FleetInputError, match="--pp-layer-partition: 16,30 must be 2 positive layer counts"):
        pp_stage_layers(48, 2, [16, 30])
    with pytest.raises(FleetInputError, match="--pipeline-parallel-size: 30 stages"):
        pp_stage_layers(27, 30)


def test_pp_pool_is_the_largest_stage_s() -> None:
    """DeepSeek-V2-Lite (27 MLA layers, 576 latent values x 2 B): 14 layers on stage 0 at TP 2 x PP 2."""
    common = dict(
        tensor_parallel_size=2,
        kv_cache_dtype="auto",
        max_model_len=32768,
        kv_bytes_per_gpu=20 * GIB,
        vllm_version="0.32.0",  # pipeline parallelism reproduced on 0.32.0 (lab-cpu-vllm-0.32.0-pp)
    )
    one = plan_capacity(config("deepseek-v2-lite-chat"), **common)
    two = plan_capacity(config("deepseek-v2-lite-chat"), pipeline_parallel_size=2, **common)
    page = 16 * 576 * 2
    assert one.num_gpu_blocks == 20 * GIB // (27 * page)
    assert two.num_gpu_blocks == 20 * GIB // (14 * page)
    assert two.gpu_kv_tokens == int(two.num_gpu_blocks / 2048 * 32768)
    assert two.exact and two.pipeline_parallel_size == 2


def test_dcp_shards_tokens_of_full_attention() -> None:
    """MLA at TP 8 with DCP 8: each rank keeps 1/8 of every request's latent cache."""
    common = dict(
        tensor_parallel_size=8,
        kv_cache_dtype="auto",
        max_model_len=32768,
        kv_bytes_per_gpu=20 * GIB,
        vllm_version="0.32.0",
    )
    plain = plan_capacity(config("deepseek-v2-lite-chat"), **common)
    dcp = plan_capacity(config("deepseek-v2-lite-chat"), decode_context_parallel_size=8, **common)
    assert dcp.num_gpu_blocks == plain.num_gpu_blocks
    assert plain.blocks_per_request == 2048 and dcp.blocks_per_request == 256
    assert dcp.max_concurrency == pytest.approx(plain.max_concurrency * 8)


def test_exact_and_approximate_verdicts() -> None:
    """Exact only where a real log of the release reproduces every feature (plan.proven.PROVEN)."""
    common = dict(
        tensor_parallel_size=1, kv_cache_dtype="auto", max_model_len=32768, kv_bytes_per_gpu=20 * GIB
    )
    assert plan_capacity(config("llama-3.1-8b"), vllm_version="0.32.0", **common).exact
    newest = plan_capacity(config("llama-3.1-8b"), vllm_version="0.34.0", **common)
    assert not newest.exact
    assert newest.approximate_because == [
        "full-attention layers: counted from vLLM's sources, no real log of vLLM 0.34.0 reproduced (real "
        "logs reproduce 0.10.1-0.32.0)"
    ]
    # gpt-oss (sliding window, sinks): reproduced on vLLM 0.26.0's real logs (test_capacity_families.py),
    # approximate for the releases before it (and, for the sinks, after it)
    oss = dict(max_num_batched_tokens=8192, **common)
    assert plan_capacity(config("gpt-oss-120b"), vllm_version="0.26.0", **oss).exact
    old = plan_capacity(config("gpt-oss-120b"), vllm_version="0.11.0", **oss)
    assert not old.exact and any("sliding-window" in r for r in old.approximate_because)
    assert any("attention sinks" in r for r in old.approximate_because)
    old_pp = plan_capacity(config("llama-3.1-8b"), pipeline_parallel_size=2, vllm_version="0.15.1", **common)
    assert not old_pp.exact
    assert old_pp.approximate_because == [
        "pipeline parallelism (the largest stage's pool): counted from vLLM's sources, no real log of vLLM "
        "0.15.1 reproduced (real logs reproduce 0.32.0)"
    ]
    assert plan_capacity(
        config("llama-3.1-8b"), pipeline_parallel_size=2, vllm_version="0.32.0", **common
    ).exact


# Granite-4.0-H's shape (layer_types mamba/attention), small: 3 Mamba-2 layers and one attention layer.
GRANITE_H_SHAPED: dict[str, Any] = {
    "model_type": "granitemoehybrid",
    "num_hidden_layers": 4,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "layer_types": ["mamba", "mamba", "mamba", "attention"],
    "mamba_n_heads": 128,
    "mamba_d_head": 64,
    "mamba_d_state": 128,
    "mamba_n_groups": 1,
    "mamba_d_conv": 4,
    "torch_dtype": "bfloat16",
}


def test_mamba2_hybrid_is_sized_and_approximate() -> None:
    """A Granite-4.0-H-shaped config (layer_types mamba/attention): the Mamba-2 state per layer and GPU is
    conv (conv_dim / TP x (d_conv - 1)) + ssm (heads / TP x head_dim x d_state), vLLM's mamba2_state_shape."""
    cfg = GRANITE_H_SHAPED
    plan = plan_capacity(
        cfg,
        tensor_parallel_size=1,
        kv_cache_dtype="auto",
        max_model_len=8192,
        kv_bytes_per_gpu=GIB,
        vllm_version="0.26.0",
    )
    conv = (128 * 64 + 2 * 1 * 128) * 3 * 2
    ssm = 128 * 64 * 128 * 2
    assert plan.linear_state_bytes_per_request_per_gpu == 3 * (conv + ssm)  # 0.26.0, no prefix caching: 1
    assert plan.exact  # Mamba-2 reproduced on vLLM 0.26.0's real logs (test_capacity_families.py)
    older = plan_capacity(
        cfg,
        tensor_parallel_size=1,
        kv_cache_dtype="auto",
        max_model_len=8192,
        kv_bytes_per_gpu=GIB,
        vllm_version="0.20.0",
    )
    assert not older.exact and any("mamba layers" in r for r in older.approximate_because)


def test_mamba2_hybrid_asked_for_prefix_caching_on_0_26_is_planned_in_all_mode() -> None:
    """vLLM 0.26 gives a SupportsMambaPrefixCaching model asked for prefix caching mamba_cache_mode "all": the
    attention block is a multiple of lcm(chunk_size, 16) holding a state, and every block of a request keeps
    one state per Mamba group (MambaSpec.max_memory_usage_bytes). Read in the source and reproduced on a
    real 0.26.0 log (Nemotron-3-Nano with prefix caching, test_capacity_families.py): exact there.
    """
    cfg = {**GRANITE_H_SHAPED, "architectures": ["GraniteMoeHybridForCausalLM"], "mamba_chunk_size": 256}
    kwargs: dict[str, Any] = {
        "tensor_parallel_size": 1,
        "kv_cache_dtype": "auto",
        "max_model_len": 8192,
        "kv_bytes_per_gpu": GIB,
    }
    plan = plan_capacity(cfg, vllm_version="0.26.0", enable_prefix_caching=True, **kwargs)
    state = (128 * 64 + 2 * 128) * 3 * 2 + 128 * 64 * 128 * 2  # conv + ssm, bf16
    per_token = 8 * 128 * 2 * 2  # K and V of 8 heads x 128, bf16
    tokens_per_state = math.ceil(state / per_token)  # 525
    assert plan.block_size == 256 * math.ceil(tokens_per_state / 256) == 768
    assert plan.blocks_per_request == 11 + 3 * 11  # 8,192 / 768 -> 11 blocks: attention and each Mamba group
    assert plan.exact
    # the same model on 0.28, or not asked on 0.26: "align" (2 states) / "none" (1 state), blocks of 528
    align = plan_capacity(cfg, vllm_version="0.28.0", **kwargs)
    none = plan_capacity(cfg, vllm_version="0.26.0", **kwargs)
    assert align.block_size == none.block_size == 16 * math.ceil(state / (16 * per_token)) == 528
    assert (align.blocks_per_request, none.blocks_per_request) == (16 + 3 * 2, 16 + 3 * 1)
