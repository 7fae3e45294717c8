"""Pipeline and decode context parallelism on real vLLM 0.32.0 logs (the CPU build, one worker process per
rank), reproduced by the planner digit for digit: uneven stages (3+2, 2+2+1), VLLM_PP_LAYER_PARTITION, stages
holding different mixes of sliding-window and full-attention layers (a Gemma 3 geometry), and TP 2 x DCP 2 of
a one-KV-head model (vLLM sizes the cache and prints its line, then the CPU attention backend refuses DCP at
its first use: the sizing is vLLM's own, the start fails). The logs, configs and how they were made:
tests/fixtures/lab-cpu-vllm-0.32.0-pp/README.md. The KV memory per worker is the log's own
"Available KV cache memory" (VLLM_CPU_KVCACHE_SPACE), the block size the CPU backend's 128."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from vllm_fleet.cli import main
from vllm_fleet.plan.capacity import plan_capacity
from vllm_fleet.verify.logcheck import parse_file

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "lab-cpu-vllm-0.32.0-pp"
CPU_BLOCK_SIZE = 128  # vLLM's CPU platform default (the GPU default is 16)


def rows() -> list[list[str]]:
    lines = (RUNS / "runs.tsv").read_text().splitlines()
    return [line.split("\t") for line in lines if line and not line.startswith("#")]


def served() -> list:
    out = []
    for name, model, stages, partition, args in rows():
        report = parse_file(RUNS / "logs" / f"{name}.log")
        if report.kv_cache_tokens:
            out.append(pytest.param(name, model, int(stages), partition, shlex.split(args), id=name))
    return out


def config(model: str) -> dict:
    return json.loads((RUNS / "models" / f"{model}.config.json").read_text())


def flag(args: list[str], *names: str, default: int | None = None) -> int | None:
    found = [i for i, arg in enumerate(args) if arg in names]
    return int(args[found[-1] + 1]) if found else default


def test_the_runs_cover_uneven_partitioned_and_hybrid_stages() -> None:
    names = [p.id for p in served()]
    stages = {int(row[2]) for row in rows() if row[0] in names}
    assert {1, 2, 3} <= stages
    assert any(row[3] for row in rows() if row[0] in names)  # a VLLM_PP_LAYER_PARTITION run
    assert sum(name.startswith("gemma3-pp2") for name in names) >= 2
    assert sum(name.startswith("dcp2") for name in names) >= 2


@pytest.mark.parametrize(("name", "model", "stages", "partition", "args"), served())
def test_the_plan_gives_vllms_kv_line(
    name: str, model: str, stages: int, partition: str, args: list[str]
) -> None:
    report = parse_file(RUNS / "logs" / f"{name}.log")
    assert report.version == "0.32.0" and report.kv_cache_device == "CPU"
    assert (report.pipeline_parallel_size or 1) == stages
    plan = plan_capacity(
        config(model),
        tensor_parallel_size=flag(args, "-tp", "--tensor-parallel-size", default=1),
        pipeline_parallel_size=stages,
        decode_context_parallel_size=flag(args, "-dcp", "--decode-context-parallel-size", default=1),
        pp_layer_partition=[int(n) for n in partition.split(",")] if partition else None,
        kv_cache_dtype="auto",
        max_model_len=flag(args, "--max-model-len", default=2048),
        kv_bytes_per_gpu=int(report.available_kv_cache_gib * 2**30),
        block_size=CPU_BLOCK_SIZE,
        max_num_batched_tokens=flag(args, "--max-num-batched-tokens"),
        vllm_version=report.version,
    )
    assert plan.gpu_kv_tokens == report.kv_cache_tokens
    assert f"{plan.max_concurrency:.2f}" == f"{report.max_concurrency:.2f}"
    assert plan.exact, plan.approximate_because


def test_stages_the_even_split_would_get_wrong() -> None:
    """vLLM reports the stage with the most layers (the fewest blocks): 3 of 5 layers on 2 stages."""
    even = parse_file(RUNS / "logs" / "l5-pp1.log").kv_cache_tokens
    two = parse_file(RUNS / "logs" / "pp2-l5.log").kv_cache_tokens
    assert two == 699_008 and two != 2 * even  # 5/3 of the one-stage pool, not twice it


def test_the_cli_prints_the_same_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model-config", str(RUNS / "models" / "gemma3-5.config.json"), "-pp", "2",
            "--kv-bytes-per-gpu", "1GiB", "--block-size", "128", "--max-model-len", "2048",
            "--max-num-batched-tokens", "2048", "--vllm-version", "0.32.0"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "671,088 tokens, Maximum concurrency for 2,048 tokens per request: 327.68x" in out
    assert "APPROXIMATE" not in out


@pytest.mark.parametrize(
    ("name", "sized", "cause"),
    [
        ("swa-pp1", False, "Sliding window for some but all layers is not supported"),
        ("dcp2-tp2", False, "requires `--tensor-parallel-size` (2) to be greater than"),
        ("dcp2-tp2-mqa", True, "CPUAttentionBackendImpl does not"),
        ("dcp2-tp2-mqa-flex", True, "CPUAttentionBackendImpl does not"),
    ],
)
def test_what_this_backend_refuses_is_a_failed_start_naming_why(name: str, sized: bool, cause: str) -> None:
    report = parse_file(RUNS / "logs" / f"{name}.log")
    assert not report.ready and (report.kv_cache_tokens is not None) == sized
    assert report.errors and any(cause in e.line or cause in str(e.values) for e in report.errors), [
        (e.kind, e.line[-160:]) for e in report.errors
    ]
