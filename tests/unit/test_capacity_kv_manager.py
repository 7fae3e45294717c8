"""vLLM's KV-cache manager choices, release by release (plan.kv_manager), as read in each release's sources
(the wheels scripts/gen_flag_catalog.py caches): chunked-local attention with and without the hybrid manager
and VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE, prefix caching switched off by the model, the default
block size per device. Where a real log exists it is the test (test_capacity_both_paths.py: the Qwen3-Next
0.13.0 log); the chunked-local figures have no real log here, so the plan must call itself approximate."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from vllm_fleet.cli import main
from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.capacity import KvShape, plan_capacity
from vllm_fleet.plan.kv_manager import CHUNKED_LOCAL_ENV, default_block_size, hybrid_manager

MODELS = Path(__file__).resolve().parent.parent / "fixtures" / "models"
FIXTURES_LOGS = MODELS.parent / "vllm-logs"
GIB = 2**30


def config(name: str) -> dict[str, Any]:
    return json.loads((MODELS / f"{name}.config.json").read_text(encoding="utf-8"))


def scout(vllm_version: str, env: dict[str, str] | None = None, **kwargs: Any) -> Any:
    common: dict[str, Any] = {
        "tensor_parallel_size": 8,
        "kv_cache_dtype": "auto",
        "max_model_len": 1_048_576,
        "kv_bytes_per_gpu": 40 * GIB,
        "max_num_batched_tokens": 8192,
    }
    shape = config("llama-4-scout-17b-16e")
    return plan_capacity(shape, vllm_version=vllm_version, env=env, **common | kwargs)


def test_llama4_rope_layers_are_chunked_local_and_every_fourth_is_global() -> None:
    shape = KvShape.from_model_config(config("llama-4-scout-17b-16e"))
    assert (shape.full_attention_layers, shape.chunked_local_layers) == (12, 36)
    assert shape.layer_kinds[:4] == ("chunked", "chunked", "chunked", "full")
    assert shape.attention_chunk_size == 8192
    assert shape.as_full_attention().full_attention_layers == 48


def test_vllm_0_12_sizes_chunked_layers_as_full_attention_unless_the_variable_says_1() -> None:
    """0.10.1-0.13.0 switch the hybrid manager off for chunked-local attention unless the variable is 1
    (vllm/config/vllm.py 0.12.0); `unify_hybrid_kv_cache_specs` then makes every layer full attention."""
    off = scout("0.12.0")
    on = scout("0.12.0", env={CHUNKED_LOCAL_ENV: "1"})
    page = 16 * 1 * 128 * 2 * 2  # one KV head per GPU at TP 8, K and V of 128, bf16
    blocks = math.ceil(1_048_576 / 16)
    # off: one group of 48 layers, every one keeping the whole request
    assert off.num_gpu_blocks == 40 * GIB // (48 * page)
    assert off.blocks_per_request == blocks
    # on: 4 groups of 12 (one full, three chunked-local), a chunked group keeps one chunk and the batch
    # (ChunkedLocalAttentionSpec.max_memory_usage_bytes: cdiv(min(8192 + 8192, max_model_len), 16))
    assert on.num_gpu_blocks == 40 * GIB // (12 * page)
    assert on.blocks_per_request == blocks + 3 * math.ceil((8192 + 8192) / 16)
    assert on.max_concurrency / off.max_concurrency == pytest.approx(
        4 * blocks / (blocks + 3 * 1024), rel=1e-3
    )
    assert any("switches the hybrid KV-cache manager off" in note for note in off.notes)
    # no real log of Llama 4 is here, with or without the hybrid manager: approximate both, and said why
    assert not off.exact and not on.exact
    assert any("sized as full attention" in r for r in off.approximate_because)
    assert any("chunked-local attention under the hybrid" in r for r in on.approximate_because)


def test_the_variable_defaults_to_1_from_0_14_and_0_10_0_keeps_the_hybrid_manager() -> None:
    assert hybrid_manager("0.14.0", chunked_local=True, env={})[0] is True  # vllm/envs.py 0.14.0: "1"
    assert hybrid_manager("0.14.0", chunked_local=True, env={CHUNKED_LOCAL_ENV: "0"})[0] is False
    assert hybrid_manager("0.13.0", chunked_local=True, env={})[0] is False
    assert hybrid_manager("0.10.0", chunked_local=True, env={CHUNKED_LOCAL_ENV: "0"})[0] is True
    assert hybrid_manager("0.12.0", chunked_local=False, env={})[0] is True
    # in the plan: 0.26.0 keeps the hybrid manager unless told 0, and a chunk per group holds more requests
    assert scout("0.26.0").max_concurrency > 3 * scout("0.26.0", env={CHUNKED_LOCAL_ENV: "0"}).max_concurrency


def test_a_variable_vllm_cannot_read_names_itself() -> None:
    with pytest.raises(FleetInputError, match=rf"{CHUNKED_LOCAL_ENV}: 'yes' is not 0 or 1"):
        scout("0.12.0", env={CHUNKED_LOCAL_ENV: "yes"})


def test_plan_cli_takes_the_variable_with_env(capsys) -> None:
    argv = [
        "plan", "--model-config", str(MODELS / "llama-4-scout-17b-16e.config.json"), "-tp", "8",
        "--kv-cache-memory-bytes", "40GiB", "--max-model-len", "1048576", "--max-num-batched-tokens", "8192",
        "--vllm-version", "0.12.0", "--json",
    ]  # fmt: skip
    assert main(argv) == 0
    off = json.loads(capsys.readouterr().out)
    assert main([*argv, "--env", f"{CHUNKED_LOCAL_ENV}=1"]) == 0
    on = json.loads(capsys.readouterr().out)
    assert off["blocks_per_request"] == 65_536 and on["blocks_per_request"] == 65_536 + 3 * 1024
    assert main([*argv, "--env", "NOEQUALS"]) == 2
    assert "--env: 'NOEQUALS' is not NAME=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("version", "kept", "mode_blocks"),
    [
        ("0.11.0", False, 1),  # every hybrid loses prefix caching before 0.11.1
        ("0.13.0", False, 1),  # Qwen3-Next lacks supports_mamba_prefix_caching: "disabling" (the real log)
        ("0.14.1", False, 1),
        ("0.15.0", True, 2),  # mamba_cache_mode "align" for every other hybrid
        ("0.26.0", True, 2),
    ],
)
def test_prefix_caching_asked_for_qwen3_next_by_release(version: str, kept: bool, mode_blocks: int) -> None:
    plan = plan_capacity(
        config("qwen3-coder-next"),
        tensor_parallel_size=2,
        kv_cache_dtype="fp8",
        max_model_len=32_768,
        kv_bytes_per_gpu=18_876_530_688,
        max_num_batched_tokens=8192,
        enable_prefix_caching=True,
        vllm_version=version,
    )
    attention_blocks = math.ceil(32_768 / plan.block_size)
    assert plan.blocks_per_request == attention_blocks + 3 * mode_blocks
    assert any("prefix caching switched off" in note for note in plan.notes) is not kept


def test_a_model_that_supports_mamba_prefix_caching_keeps_it_on_0_13() -> None:
    plan = plan_capacity(
        config("nemotron-3-nano-30b-a3b"),
        tensor_parallel_size=1,
        kv_cache_dtype="auto",
        max_model_len=32_768,
        kv_bytes_per_gpu=2 * GIB,
        enable_prefix_caching=True,
        vllm_version="0.13.0",
    )
    assert not any("prefix caching switched off" in note for note in plan.notes)
    assert "(all mode)" in " ".join(plan.notes)


@pytest.mark.parametrize(
    ("device", "version", "size"),
    [
        ("GPU", "0.26.0", 16),
        ("GPU", "0.34.0", 64),  # CacheConfig.DEFAULT_BLOCK_SIZE = 64
        ("CPU", "0.12.0", 128),  # CpuPlatform.check_and_update_config
        ("CPU", "0.32.0", 128),
        ("CPU", "0.33.0", 32),  # the CPU backend's smallest kernel block size
        ("CPU", "0.34.0", 64),
    ],
)
def test_default_block_size_per_device_and_release(device: str, version: str, size: int) -> None:
    assert default_block_size(device, version) == (size, "")
    plan = plan_capacity(
        config("lab-tiny-qwen2"),
        tensor_parallel_size=1,
        kv_cache_dtype="auto",
        max_model_len=256,
        kv_bytes_per_gpu=GIB,
        device=device,
        vllm_version=version,
    )
    assert plan.block_size == size


def test_cpu_before_0_11_1_depends_on_ipex_and_says_so() -> None:
    size, note = default_block_size("CPU", "0.10.2")
    assert size == 128 and "intel_extension_for_pytorch" in note
    with pytest.raises(FleetInputError, match="--device: 'TPU'"):
        default_block_size("TPU", "0.26.0")


def _oss(version: str, **kwargs: Any) -> Any:
    common: dict[str, Any] = {
        "tensor_parallel_size": 1,
        "kv_cache_dtype": "auto",
        "max_model_len": 131_072,
        "kv_bytes_per_gpu": 4 * GIB,
        "max_num_batched_tokens": 8192,
    }
    return plan_capacity(config("gpt-oss-20b"), vllm_version=version, **common | kwargs)


def test_the_cpu_offload_tier_turns_the_hybrid_manager_off_before_0_22() -> None:
    """--kv-transfer-config (what render adds for vllm_service_kv_offload_cpu_bytes) turns the hybrid manager
    off before 0.22.0; from 0.22.0 the OffloadingConnector is SupportsHMA and it stays on."""
    plain, offload = _oss("0.20.0"), _oss("0.20.0", kv_transfer=True)
    page = 16 * 8 * 64 * 2 * 2  # 8 KV heads x 64, K and V, bf16
    assert offload.num_gpu_blocks == 4 * GIB // (24 * page)  # one group of every layer
    assert offload.blocks_per_request == 131_072 // 16
    assert plain.num_gpu_blocks == 4 * GIB // (12 * page)
    assert any("--kv-transfer-config" in note for note in offload.notes)
    assert _oss("0.22.0", kv_transfer=True).blocks_per_request == _oss("0.22.0").blocks_per_request
    forced = _oss("0.26.0", disable_hybrid_kv_cache_manager=True)
    assert forced.blocks_per_request == 131_072 // 16


def test_a_mamba_hybrid_without_the_hybrid_manager_is_a_refusal() -> None:
    plan = plan_capacity(
        config("granite-4.0-h-350m"),
        tensor_parallel_size=1,
        kv_cache_dtype="auto",
        max_model_len=32_768,
        kv_bytes_per_gpu=2 * GIB,
        kv_transfer=True,
        vllm_version="0.20.0",
    )
    assert any(w.startswith("vLLM refuses to start this hybrid") for w in plan.warnings)


def test_the_cpu_backend_before_0_10_2_has_no_hybrid_manager() -> None:
    assert hybrid_manager("0.10.1", chunked_local=False, env={}, device="CPU")[0] is False
    assert hybrid_manager("0.10.2", chunked_local=False, env={}, device="CPU")[0] is True


def test_extra_args_switch_the_hybrid_manager() -> None:
    from vllm_fleet import flags
    from vllm_fleet.render.extra_args import plan_flags

    release = flags.release("0.26.0")
    assert plan_flags(["--disable-hybrid-kv-cache-manager"], release).capacity_args() == {
        "disable_hybrid_kv_cache_manager": True
    }
    off = plan_flags(["--no-disable-hybrid-kv-cache-manager", "--block-size", "32"], release)
    assert off.capacity_args() == {"disable_hybrid_kv_cache_manager": False, "block_size": 32}


def test_the_llama4_scout_figures_a_public_h200_readme_quotes_from_vllm_0_12() -> None:
    """tests/fixtures/vllm-logs/doc-v0.12.0-llama4-scout-tp8-h200-hybrid-readme.md: vLLM 0.12.0, TP 8 on H200,
    fp8_e4m3, max_model_len 10,000,000, 89.71 GiB of KV per GPU, the hybrid manager on through the variable:
    7,838,976 tokens and 3.12x (8,192 batched tokens, vLLM 0.12's default for the API server on an H200).
    Without the variable the same pool holds a quarter of the requests: the issue's 0.47x-for-1.86x gap. A
    README's quotes are not a log, so the plan stays approximate (plan.proven has no row for it)."""
    quoted = (FIXTURES_LOGS / "doc-v0.12.0-llama4-scout-tp8-h200-hybrid-readme.md").read_text()
    assert "**7,838,976 tokens**" in quoted and "**3.12x**" in quoted and "**89.71 GiB**" in quoted
    kwargs: dict[str, Any] = {
        "kv_cache_dtype": "fp8_e4m3",
        "max_model_len": 10_000_000,
        "kv_bytes_per_gpu": int(89.71 * GIB),
    }
    on = scout("0.12.0", env={CHUNKED_LOCAL_ENV: "1"}, **kwargs)
    assert (on.gpu_kv_tokens, f"{on.max_concurrency:.2f}") == (7_838_976, "3.12")
    off = scout("0.12.0", **kwargs)
    assert (off.gpu_kv_tokens, f"{off.max_concurrency:.2f}") == (7_838_976, "0.78")
    assert not on.exact
