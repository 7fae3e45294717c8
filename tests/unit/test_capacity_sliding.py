"""The planner against vLLM 0.26.0's own KV-cache lines for sliding-window models, recorded on a real H200.

tests/fixtures/gpu-h200-vllm-0.26.0-sliding/ holds what the GPU host printed (README.md there says how:
released Gemma 3 and Mistral config.json files served with `--load-format dummy`, a fixed
`--kv-cache-memory-bytes`, several windows, batch sizes and KV dtypes). Each row of its runs.tsv is planned
here with the row's own serve arguments and the model's config (with the row's `--hf-overrides`, merged as
vLLM merges them), and the plan's expected line must be the log's line, digit for digit; a refused start
must be refused with vLLM's estimate of the longest request. No GPU is needed: the logs are the real output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vllm_fleet.cli import main
from vllm_fleet.plan.capacity import plan_capacity
from vllm_fleet.sizes import parse_size
from vllm_fleet.verify.logcheck import parse_log

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
RUNS = FIXTURES / "gpu-h200-vllm-0.26.0-sliding"


def runs() -> list[tuple[str, str, list[str]]]:
    """(name, model, serve arguments) of every row of runs.tsv, split into words as run-on-gpu.sh splits
    them (a JSON value without spaces stays one word, its quotes kept)."""
    rows = []
    for line in (RUNS / "runs.tsv").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            _wave, name, model, args = line.split("\t")
            rows.append((name, model, args.split()))
    return rows


def log_of(name: str) -> str | None:
    """The run's log as the host wrote it (a later run of the same name wins), None if it never ran."""
    found = sorted(RUNS.glob(f"run*/{name}.log"))
    return found[-1].read_text(encoding="utf-8") if found else None


def flags_of(args: list[str]) -> dict[str, str]:
    """`--flag value` pairs; a flag followed by another flag (or last) is a switch, ''."""
    flags: dict[str, str] = {}
    for index, word in enumerate(args):
        if word.startswith("--"):
            following = args[index + 1] if index + 1 < len(args) else "--"
            flags[word] = "" if following.startswith("--") else following
    return flags


def merged(config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The config with `--hf-overrides` applied as vLLM 0.26 applies them (`ModelConfig.
    _apply_dict_overrides`: a dict value updates the nested config of that name, key by key; any other value
    replaces)."""
    out = dict(config)
    for key, value in overrides.items():
        out[key] = (
            merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def plan_for(model: str, args: list[str]) -> Any:
    """plan_capacity for the row, with vLLM's defaults where a flag is absent: auto KV dtype, block size 16,
    8192 batched tokens on this GPU (its logs say so), prefix caching off."""
    flags = flags_of(args)
    config = json.loads((FIXTURES / "models" / f"{model}.config.json").read_text(encoding="utf-8"))
    if "--hf-overrides" in flags:
        config = merged(config, json.loads(flags["--hf-overrides"]))
    return plan_capacity(
        config,
        tensor_parallel_size=1,
        vllm_version="0.26.0",
        max_model_len=int(flags["--max-model-len"]),
        # vLLM's `4G` is binary (human_readable_int): the planner's 4GiB
        kv_bytes_per_gpu=parse_size(flags["--kv-cache-memory-bytes"].replace("G", "GiB")),
        kv_cache_dtype=flags.get("--kv-cache-dtype", "auto"),
        block_size=int(flags.get("--block-size", 16)),
        max_num_batched_tokens=int(flags.get("--max-num-batched-tokens", 8192)),
        enable_prefix_caching="--enable-prefix-caching" in flags,
    )


SERVED = [
    pytest.param(name, model, args, id=name)
    for name, model, args in runs()
    if (text := log_of(name)) and parse_log(text).kv_cache_tokens
]
REFUSED = [
    pytest.param(name, model, args, id=name)
    for name, model, args in runs()
    if (text := log_of(name))
    and any(e.kind == "max_model_len_exceeds_kv_cache" for e in parse_log(text).errors)
]


def window_of(model: str, args: list[str]) -> int:
    flags = flags_of(args)
    config = json.loads((FIXTURES / "models" / f"{model}.config.json").read_text(encoding="utf-8"))
    config = merged(config, json.loads(flags.get("--hf-overrides", "{}")))
    return int(config.get("text_config", config)["sliding_window"])


@pytest.mark.parametrize("family", ["gemma-3", "mistral"])
def test_each_family_has_three_served_runs_at_different_windows_batches_and_kv_dtypes(family: str) -> None:
    served = [p.values for p in SERVED if p.values[0].startswith(family)]
    assert len(served) >= 3, [name for name, _, _ in served]
    assert len({window_of(model, args) for _, model, args in served}) >= 2
    assert len({flags_of(args).get("--max-num-batched-tokens", "8192") for _, _, args in served}) >= 2
    assert {flags_of(args).get("--kv-cache-dtype", "auto") for _, _, args in served} == {"auto", "fp8"}


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


@pytest.mark.parametrize(("name", "model", "args"), SERVED)
def test_the_plan_command_prints_the_same_line(
    name: str, model: str, args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`vllm-fleet plan --vllm-version 0.26.0 --json` with the row's flags (the overridden config written to a
    file, as a user would give it) prints vLLM's line too."""
    flags = flags_of(args)
    config = json.loads((FIXTURES / "models" / f"{model}.config.json").read_text(encoding="utf-8"))
    model_config = tmp_path / "config.json"
    model_config.write_text(json.dumps(merged(config, json.loads(flags.get("--hf-overrides", "{}")))))
    argv = ["plan", "--model-config", str(model_config), "--vllm-version", "0.26.0", "--json"]
    argv += ["--tensor-parallel-size", "1", "--max-model-len", flags["--max-model-len"]]
    argv += ["--kv-cache-memory-bytes", flags["--kv-cache-memory-bytes"]]
    argv += ["--kv-cache-dtype", flags.get("--kv-cache-dtype", "auto")]
    argv += ["--max-num-batched-tokens", flags.get("--max-num-batched-tokens", "8192")]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    report = parse_log(log_of(name) or "")
    assert f"GPU KV cache size: {report.kv_cache_tokens:,} tokens" in printed["kv_cache_line"]
    assert printed["kv_cache_line"] == plan_for(model, args).kv_cache_line and printed["exact"]


@pytest.mark.parametrize(("name", "model", "args"), REFUSED)
def test_a_refused_start_is_refused_with_vllms_longest_request(
    name: str, model: str, args: list[str]
) -> None:
    report = parse_log(log_of(name) or "")
    refusal = next(e for e in report.errors if e.kind == "max_model_len_exceeds_kv_cache")
    plan = plan_for(model, args)
    assert not plan.fits_on_gpu
    assert plan.estimated_max_model_len == refusal.values["estimated_max_model_len"]
    assert round(plan.kv_bytes_needed_per_request / 2**30, 2) == refusal.values["needed_gib"]


def test_every_row_left_a_kv_line_or_a_refusal() -> None:
    """A run that printed neither (it died before sizing the cache) is named in the README, not dropped."""
    names = {p.values[0] for p in SERVED} | {p.values[0] for p in REFUSED}
    assert names == {name for name, _, _ in runs()}
