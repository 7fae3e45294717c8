"""The planner against vLLM 0.26.0's own KV-cache lines for every attention family, recorded on a real H200.

tests/fixtures/gpu-h200-vllm-0.26.0-families/ holds what the GPU host printed (README.md there says how:
released config.json files served with `--load-format dummy` and a fixed `--kv-cache-memory-bytes`). Each row
of its runs.tsv is planned here with the row's own serve arguments and the model's config, and the plan's
expected line must be the log's line, digit for digit; the one refusal must be refused with vLLM's estimate
of the longest request. No GPU is needed: the logs are the real output.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from vllm_fleet.plan.capacity import plan_capacity
from vllm_fleet.sizes import parse_size
from vllm_fleet.verify.logcheck import parse_log

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
RUNS = FIXTURES / "gpu-h200-vllm-0.26.0-families"


def runs() -> list[tuple[str, str, list[str]]]:
    """(name, model, serve arguments) of every row of runs.tsv."""
    rows = []
    for line in (RUNS / "runs.tsv").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            _wave, name, model, args = line.split("\t")
            rows.append((name, model, shlex.split(args)))
    return rows


def log_of(name: str) -> str | None:
    """The run's log as the host wrote it (a later run of the same name wins), None if it never ran."""
    found = sorted(RUNS.glob(f"run*/{name}.log"))
    return found[-1].read_text(encoding="utf-8") if found else None


def plan_args(args: list[str]) -> dict[str, Any]:
    """plan_capacity's keywords from the run's vllm serve arguments (vLLM's defaults where a flag is absent:
    auto KV dtype, block size 16, 8192 batched tokens on this GPU as its log says, prefix caching off)."""
    flags = dict(zip(args[::2], args[1::2], strict=False))
    flags.update({a: "" for a in args if a == "--enable-prefix-caching"})
    return {
        "max_model_len": int(flags["--max-model-len"]),
        # vLLM's `4G` is binary (human_readable_int): the planner's 4GiB
        "kv_bytes_per_gpu": parse_size(flags["--kv-cache-memory-bytes"].replace("G", "GiB")),
        "kv_cache_dtype": flags.get("--kv-cache-dtype", "auto"),
        "block_size": int(flags.get("--block-size", 16)),
        "max_num_batched_tokens": int(flags.get("--max-num-batched-tokens", 8192)),
        "enable_prefix_caching": "--enable-prefix-caching" in flags,
    }


def plan_for(model: str, args: list[str]) -> Any:
    config = json.loads((FIXTURES / "models" / f"{model}.config.json").read_text(encoding="utf-8"))
    return plan_capacity(config, tensor_parallel_size=1, vllm_version="0.26.0", **plan_args(args))


SERVED = [
    pytest.param(name, model, args, id=name)
    for name, model, args in runs()
    if (text := log_of(name)) and parse_log(text).kv_cache_tokens
]


def test_every_family_the_issue_names_has_two_served_logs() -> None:
    families = {
        "gpt_oss": ("gpt-oss",),
        "mamba2 hybrids": ("nemotron", "granite", "falcon-h1"),
        "kda": ("kimi-linear",),
    }
    names = [p.values[0] for p in SERVED]
    for family, prefixes in families.items():
        assert sum(name.startswith(prefixes) for name in names) >= 2, family
    mamba2_models = {p.values[1] for p in SERVED if p.values[0].startswith(("nemotron", "granite", "falcon"))}
    assert len(mamba2_models) >= 3, mamba2_models


@pytest.mark.parametrize(("name", "model", "args"), SERVED)
def test_the_plan_prints_vllms_own_kv_cache_line(name: str, model: str, args: list[str]) -> None:
    report = parse_log(log_of(name) or "")
    real = (
        f"GPU KV cache size: {report.kv_cache_tokens:,} tokens, Maximum concurrency for "
        f"{report.concurrency_max_model_len:,} tokens per request: {report.max_concurrency:.2f}x"
    )
    plan = plan_for(model, args)
    assert plan.kv_cache_line == real
    assert plan.exact, plan.approximate_because
    assert plan.fits_on_gpu


def test_the_refused_start_is_refused_with_vllms_longest_request() -> None:
    name, model, args = next(row for row in runs() if row[0] == "falcon-h1-7b-128k")
    report = parse_log(log_of(name) or "")
    refusal = next(e for e in report.errors if e.kind == "max_model_len_exceeds_kv_cache")
    plan = plan_for(model, args)
    assert not plan.fits_on_gpu
    assert plan.estimated_max_model_len == refusal.values["estimated_max_model_len"] == 68_992
    # vLLM's "5.59 GiB KV cache is needed": the blocks of one request in the pool's bytes per block
    assert round(plan.kv_bytes_needed_per_request / 2**30, 2) == refusal.values["needed_gib"] == 5.59
    assert any("vLLM refuses to start" in w for w in plan.warnings)


def test_older_releases_stay_approximate_for_the_families_read_in_0_26() -> None:
    _name, model, args = next(row for row in runs() if row[0] == "gpt-oss-20b-128k")
    config = json.loads((FIXTURES / "models" / f"{model}.config.json").read_text(encoding="utf-8"))
    older = plan_capacity(config, tensor_parallel_size=1, vllm_version="0.11.0", **plan_args(args))
    assert not older.exact
    assert any("sliding-window" in reason for reason in older.approximate_because)


@pytest.mark.parametrize(
    ("name", "shape", "dtype"),
    [
        ("nemotron-3-nano-256k", "mamba2_state_shape", "float32"),  # mamba_ssm_cache_dtype default
        ("granite-h-350m-32k", "mamba2_state_shape", "bfloat16"),
        ("jamba-1.5-mini-64k", "mamba1_state_shape", "bfloat16"),
        ("kimi-linear-128k-alone", "kda_state_shape", "float32"),  # kda_state_dtype
    ],
)
def test_an_exact_hybrid_plan_names_the_state_vllm_sizes_and_warns_nothing(
    name: str, shape: str, dtype: str
) -> None:
    """The state note names vLLM's MambaStateShapeCalculator function and dtype of THIS family; an exact
    plan carries no 'compare with the real log' warning (the approximate verdict says when to)."""
    _name, model, args = next(row for row in runs() if row[0] == name)
    plan = plan_for(model, args)
    note = next(n for n in plan.notes if n.startswith("linear-attention state"))
    assert f"vLLM's {shape}, state dtype {dtype}" in note
    assert plan.exact and not [w for w in plan.warnings if "hybrid model" in w]
