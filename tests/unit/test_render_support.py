"""Shared inputs of the renderer/validator tests: the seed inventory, real model configs and layouts planned
from real recorded topologies (tests/fixtures), never hand-typed instances."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from vllm_fleet.plan.layout import plan_layout
from vllm_fleet.probe.topology import build_topology, build_topology_from_dir
from vllm_fleet.render.schema import ServeSpec

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
SEED_VARS = REPO / "inventory/examples/seed-4x4090/group_vars/all/vllm_service.yml"


def verbatim(path: Path) -> str:
    return path.read_text(encoding="utf-8").split("# ---- verbatim below ----\n", 1)[1]


def seed_vars(**overrides: Any) -> dict[str, Any]:
    data = yaml.safe_load(SEED_VARS.read_text(encoding="utf-8"))
    data.update({f"vllm_service_{k}": v for k, v in overrides.items()})
    return data


def seed_spec(**overrides: Any) -> ServeSpec:
    return ServeSpec.from_vars(seed_vars(**overrides))


def model_config(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / "models" / f"{name}.config.json").read_text(encoding="utf-8"))


def rtx4090_topology():
    """The recorded 8 x RTX 4090 dual-socket host (every GPU pair SYS, no P2P)."""
    return build_topology_from_dir(FIXTURES / "topology/recorded/8x4090-dual-socket")


def rtx4090_instance(tp: int = 4, vllm_version: str | None = None, index: int = 0) -> dict[str, Any]:
    """One instance of its layout: TP4 -> GPUs 0-3 on NUMA node 0, numactl-bound, custom all-reduce off."""
    layout = plan_layout(rtx4090_topology(), tp, vllm_version=vllm_version)
    return layout.to_dict()["instances"][index]


def h200_topology():
    return build_topology_from_dir(FIXTURES / "topology/recorded/h200x2")


def h200_instance() -> dict[str, Any]:
    return plan_layout(h200_topology(), 2).to_dict()["instances"][0]


def rtx5090_no_p2p():
    """2 x RTX 5090 whose `nvidia-smi topo -p2p rw` says GNS (GPU not supported)."""
    topo = verbatim(FIXTURES / "topology/topo-2x5090-threadripper-phb-tabs-club3090-1229.txt")
    p2p = verbatim(FIXTURES / "topology/p2p-rw-2x5090-gns-tabs-club3090-1229.txt")
    topology = build_topology(topo_m=topo, p2p=p2p, allow_incomplete=True)
    instance = plan_layout(topology, 2).to_dict()["instances"][0]
    return topology.to_dict(), instance
