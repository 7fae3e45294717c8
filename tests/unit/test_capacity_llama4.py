"""Llama 4's chunked-local attention on vLLM 0.26.0, and the GPU bundle built on a second machine, both from
one real H200 run (tests/fixtures/gpu-h200-vllm-0.26.0-llama4, README.md there says how).

The served rows of its runs.tsv are checked digit for digit by both paths in test_capacity_both_paths (which
discovers every runs.tsv); here: the refused row is refused by the plan with vLLM's own figures, every row
left a KV line or a refusal, and the bundle as the GPU host built and packed it is the controller's.
"""

from __future__ import annotations

import json
from pathlib import Path

from vllm_fleet.plan.capacity import plan_capacity
from vllm_fleet.verify.logcheck import parse_log

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
RUNS = FIXTURES / "gpu-h200-vllm-0.26.0-llama4"


def _rows() -> dict[str, tuple[str, str]]:
    lines = (RUNS / "runs.tsv").read_text(encoding="utf-8").splitlines()
    return {
        name: (model, args)
        for _wave, name, model, args in (
            line.split("\t") for line in lines if line and not line.startswith("#")
        )
    }


def _report(name: str):
    return parse_log((RUNS / "run1" / f"{name}.log").read_text(encoding="utf-8"))


def test_the_refused_start_is_refused_with_vllms_figures() -> None:
    model, args = _rows()["l4-text-128k-refused"]
    assert "--max-model-len 131072 --kv-cache-memory-bytes 256M --max-num-batched-tokens 8192" in args
    refusal = next(
        e for e in _report("l4-text-128k-refused").errors if e.kind == "max_model_len_exceeds_kv_cache"
    )
    config = json.loads((FIXTURES / "models" / f"{model}.config.json").read_text(encoding="utf-8"))
    plan = plan_capacity(
        config, tensor_parallel_size=1, vllm_version="0.26.0", max_model_len=131072,
        kv_bytes_per_gpu=256 << 20, max_num_batched_tokens=8192, kv_cache_dtype="auto",
    )  # fmt: skip
    assert not plan.fits_on_gpu
    assert plan.estimated_max_model_len == refusal.values["estimated_max_model_len"] == 8192
    assert round(plan.kv_bytes_needed_per_request / 2**30, 2) == refusal.values["needed_gib"] == 1.56


def test_every_row_left_a_kv_line_or_a_refusal() -> None:
    for name in _rows():
        report = _report(name)
        refused = any(e.kind == "max_model_len_exceeds_kv_cache" for e in report.errors)
        assert report.kv_cache_tokens or refused, name


def _sums(path: Path) -> dict[str, str]:
    return {name: digest for digest, name in (line.split() for line in path.read_text().splitlines())}


def test_the_bundle_built_and_packed_on_the_gpu_host_is_the_controllers_byte_for_byte() -> None:
    """Recorded outputs of two machines: the controller (Debian 12, CPython 3.11) and the H200 host (CPython
    3.12, its own liblzma: run1/env.txt). The full bundle: 3 parts, 163.5 MB; the mini lock: 60 wheels."""
    controller, gpu_host = (
        _sums(RUNS / "SHA256SUMS.controller"),
        _sums(RUNS / "run1" / "SHA256SUMS.gpu-host-repack"),
    )
    assert sorted(controller) == ["bundle.tar.xz.part00", "bundle.tar.xz.part01", "bundle.tar.xz.part02"]
    assert gpu_host == controller
    assert _sums(RUNS / "run1" / "SHA256SUMS.gpu-host-mini") == _sums(RUNS / "SHA256SUMS.controller-mini")
    steps = (RUNS / "run1" / "steps.log").read_text(encoding="utf-8")
    assert "mini build rc=0" in steps and steps.count(": OK") == 3
