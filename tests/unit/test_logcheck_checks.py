"""check_log: named checks of real vLLM logs against planned expectations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.capacity import plan_capacity
from vllm_fleet.sizes import parse_size
from vllm_fleet.verify.logcheck import check_log, parse_log

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SENTINEL = "# ---- verbatim below ----\n"


def log(name: str) -> str:
    return (FIXTURES / "vllm-logs" / name).read_text(encoding="utf-8").split(SENTINEL, 1)[1]


def by_name(checks):
    return {check.name: check for check in checks}


def test_plan_expectations_pass_on_the_real_log_they_describe() -> None:
    # Llama-3.1-8B's config (131,072 B/token in bf16) with the log's own 112.61 GiB, vLLM ~0.10.1.
    config = json.loads((FIXTURES / "models" / "llama-3.1-8b.config.json").read_text())
    plan = plan_capacity(
        config,
        tensor_parallel_size=1,
        kv_cache_dtype="auto",
        max_model_len=40_000,
        kv_bytes_per_gpu=parse_size("112.61GiB"),
        vllm_version="0.10.1",
    )
    rep = parse_log(log("log-v0.10.1ish-enginecore0-112gib-kv-pr20707.txt"))
    expectations = {k: v for k, v in plan.expectations.items() if k != "kv_cache_dtype"}
    checks = by_name(check_log(rep, expectations))
    assert set(checks) == {"kv_cache_tokens", "max_concurrency", "max_model_len"}
    assert all(check.ok for check in checks.values()), [c.detail for c in checks.values()]
    assert checks["kv_cache_tokens"].seen == 922_496
    assert "GPU KV cache size: 922,496 tokens" in (checks["kv_cache_tokens"].line or "")


def test_kv_tokens_tolerance_boundary() -> None:
    rep = parse_log(log("log-v0.10.1ish-enginecore0-112gib-kv-pr20707.txt"))
    inside = check_log(rep, {"kv_cache_tokens": 940_000, "kv_tokens_tolerance": 0.02})[0]
    outside = check_log(rep, {"kv_cache_tokens": 950_000, "kv_tokens_tolerance": 0.02})[0]
    default = check_log(rep, {"kv_cache_tokens": 950_000})[0]
    assert inside.ok and not outside.ok and not default.ok
    assert "tolerance 2%" in outside.detail


def test_kv_dtype_fp8_is_fp8_e4m3_but_not_e5m2() -> None:
    rep = parse_log(log("log-v0.20.1-qwen3.6-27b-int4-tp2-2x3090-mtp-club3090-91.txt"))
    assert check_log(rep, {"kv_cache_dtype": "fp8_e5m2"})[0].ok
    wrong = check_log(rep, {"kv_cache_dtype": "fp8"})[0]
    assert not wrong.ok and wrong.seen == "fp8_e5m2"
    same = parse_log(
        "INFO [core.py:1] Initializing a V1 LLM engine (v0.33.0) with config: kv_cache_dtype=fp8,"
    )
    assert check_log(same, {"kv_cache_dtype": "fp8_e4m3"})[0].ok


def test_attention_backend_and_missing_lines() -> None:
    rep = parse_log(log("misc-2026-07-attn-backend-out-of-potential-backends-v2-runner-pr45288.txt"))
    checks = by_name(
        check_log(rep, {"attention_backend": "flash_attn", "kv_cache_tokens": 1000, "kv_cache_dtype": "auto"})
    )
    assert checks["attention_backend"].ok
    assert not checks["kv_cache_tokens"].ok and checks["kv_cache_tokens"].seen is None
    assert "no line" in checks["kv_cache_dtype"].detail
    flashinfer = check_log(rep, {"attention_backend": "FLASHINFER"})[0]
    assert not flashinfer.ok and flashinfer.seen == "FLASH_ATTN"


def test_old_logs_with_blocks_say_so() -> None:
    rep = parse_log(log("err-v0.4.x-ray-iso-timestamps-gpu-blocks-initialize-cache-openrlhf-336.txt"))
    check = check_log(rep, {"kv_cache_tokens": 6048})[0]
    assert not check.ok
    assert "blocks" in check.detail and "# GPU blocks: 378" in (check.line or "")


def test_custom_all_reduce_state() -> None:
    warned = parse_log(log("warn-v0.4.2ish-custom-allreduce-disabled-no-p2p-ci-vllm-4770.txt"))
    assert check_log(warned, {"custom_all_reduce_disabled": True})[0].ok
    enabled_expected = check_log(warned, {"custom_all_reduce_disabled": False})[0]
    assert not enabled_expected.ok and "no_p2p" in enabled_expected.detail
    config_only = parse_log(log("cfg-v0.10.2dev378-qwen2.5-0.5b-tp2-startup-pr24162.txt"))
    assert check_log(config_only, {"custom_all_reduce_disabled": False})[0].ok
    silent = parse_log(log("log-v0.10.1ish-enginecore0-112gib-kv-pr20707.txt"))
    assert not check_log(silent, {"custom_all_reduce_disabled": False})[0].ok


def test_numa_nodes_ready_and_errors() -> None:
    text = "\n".join(
        [
            "INFO [numa_utils.py:1] Binding worker subprocess (local_rank=0, gpu_index=0) to NUMA node 1",
            "INFO [launcher.py:1] Starting vLLM server on http://0.0.0.0:8000",
        ]
    )
    rep = parse_log(text)
    checks = by_name(check_log(rep, {"numa_nodes": [1], "ready": True, "no_errors": True}))
    assert all(check.ok for check in checks.values())
    assert not check_log(rep, {"numa_nodes": [0]})[0].ok
    failed = parse_log(log("err-v0.10.1ish-gptoss120b-h100-negative-kv-memory-vllm-23278.txt"))
    checks = by_name(check_log(failed, {"ready": True, "no_errors": True}))
    assert not checks["ready"].ok
    assert not checks["no_errors"].ok
    assert checks["no_errors"].seen == ["negative_kv_cache_memory", "engine_init_failed"]
    assert "Available KV cache memory: -2.14 GiB" in (checks["no_errors"].line or "")


def test_unknown_expectation_and_bad_tolerance_are_input_errors() -> None:
    rep = parse_log("")
    with pytest.raises(FleetInputError, match="kv_tokens"):
        check_log(rep, {"kv_tokens": 5})
    with pytest.raises(FleetInputError, match="kv_tokens_tolerance"):
        check_log(rep, {"kv_cache_tokens": 5, "kv_tokens_tolerance": 2})
