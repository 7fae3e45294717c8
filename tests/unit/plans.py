"""Instance plans for tests, built by the real pipeline (`build_host_plan`), never written by hand.

The lab's own variables (inventory/group_vars/lab/vllm.yml), the tiny model's real config.json
(tests/fixtures/models/lab-tiny-qwen2.config.json) and a CPU-only topology from the real 2 x H200 host's
`numactl -H` and `lscpu` (tests/fixtures/topology/recorded/h200x2, without its nvidia-smi outputs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from vllm_fleet.plan.build import build_host_plan
from vllm_fleet.plan.host import HostPlan
from vllm_fleet.probe.topology import Topology, build_topology_from_texts

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
LAB_VARS = yaml.safe_load((ROOT / "inventory" / "group_vars" / "lab" / "vllm.yml").read_text())
TINY_CONFIG = json.loads((FIXTURES / "models" / "lab-tiny-qwen2.config.json").read_text())
H200X2 = FIXTURES / "topology" / "recorded" / "h200x2"


def cpu_topology() -> Topology:
    return build_topology_from_texts(
        {"numactl": (H200X2 / "numactl-H.txt").read_text(), "lscpu": (H200X2 / "lscpu.txt").read_text()}
    )


def lab_host_plan(host: str = "lab-1", **overrides: Any) -> HostPlan:
    plan = build_host_plan(
        host,
        {**LAB_VARS, **overrides},
        cpu_topology(),
        vllm_version="0.32.0",
        model_config=TINY_CONFIG,
        model_config_source="tests/fixtures/models/lab-tiny-qwen2.config.json",
    )
    assert plan.ok, plan.errors
    return plan


def lab_instance_plan(**overrides: Any) -> dict[str, Any]:
    return lab_host_plan(**overrides).instances[0].to_dict()
