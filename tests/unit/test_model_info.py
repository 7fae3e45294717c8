"""ModelInfo.from_config over the real config.json files of tests/fixtures/models/ (source beside each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.model import ModelInfo

MODELS = Path(__file__).resolve().parent.parent / "fixtures" / "models"


def info(name: str) -> ModelInfo:
    return ModelInfo.from_config(json.loads((MODELS / f"{name}.config.json").read_text()), name)


def test_gpt_oss_alternates_sliding_and_full_with_sinks() -> None:
    model = info("gpt-oss-120b")
    assert model.model_type == "gpt_oss" and model.attention_sinks
    assert model.count("sliding") == 18 and model.count("full") == 18 and model.sliding_window == 128
    assert (model.num_kv_heads, model.head_dim) == (8, 64)
    assert model.position_limit == 4096 * 32 and model.max_position_embeddings == 131072
    assert not model.is_hybrid and not model.is_mla


def test_qwen3_next_is_a_gated_deltanet_hybrid() -> None:
    model = info("qwen3-coder-next")
    assert model.is_hybrid and model.count("full") == 12 and model.count("linear") == 36


def test_deepseek_v2_lite_is_mla_with_one_latent_head() -> None:
    model = info("deepseek-v2-lite-chat")
    assert model.is_mla and model.num_kv_heads == 1
    assert (model.mla_kv_lora_rank, model.mla_rope_head_dim) == (512, 64)
    assert model.position_limit == 4096 * 40


def test_multimodal_wrapper_reads_text_config() -> None:
    model = info("qwen3.6-27b")
    assert model.model_type == "qwen3_5_text" and model.num_layers == 64 and model.num_kv_heads == 4
    assert model.rope_scaling is not None and model.rope_scaling["mrope_section"] == [11, 11, 10]


def test_llama_rope_scaling_and_dense_layers() -> None:
    model = info("llama-3.1-8b")
    assert model.layer_kinds == ("full",) * 32 and model.head_dim == 128
    assert model.position_limit == 8192 * 8
    assert model.architectures == ("LlamaForCausalLM",)


def test_nemotron_h_pattern_keeps_only_cache_layers() -> None:
    config = {
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "head_dim": 16,
        "hybrid_override_pattern": "M-M*",
    }
    assert ModelInfo.from_config(config).layer_kinds == ("mamba", "mamba", "full")


def test_bad_pattern_names_the_field() -> None:
    config = {
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "head_dim": 16,
        "hybrid_override_pattern": "MX",
    }
    with pytest.raises(FleetInputError, match="hybrid_override_pattern 'MX'"):
        ModelInfo.from_config(config)
