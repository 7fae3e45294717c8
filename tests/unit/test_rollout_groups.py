"""A rollout treats an instance over several hosts as one unit (issue 33): its hosts in the rollout whole and
in one batch (the canary counts as one), refused before any host changes otherwise. The plans are the example
inventory's (inventory/examples/2x4x4090-pp: recorded topology, real config.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_preflight_master_port import preflight

from vllm_fleet.plan.inventory import plan_inventory
from vllm_fleet.rollout.decisions import (
    group_batch_errors,
    instance_groups,
    plan_batches,
    restore_order,
    split_canary,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventory" / "examples" / "2x4x4090-pp"
PAIR = ("pp-4090-a", "pp-4090-b")


@pytest.fixture(scope="module")
def plans() -> dict[str, dict]:
    return {h: p.to_dict() for h, p in plan_inventory(str(EXAMPLE), project_dir=ROOT).items()}


def batches(targets: list[str], canary: list[str], serial: list) -> list[list[str]]:
    first, rest = split_canary(targets, canary)
    return [first, *plan_batches(rest, serial)]


def test_the_example_pairs_hosts_form_one_group(plans: dict) -> None:
    assert instance_groups(plans) == {"pp-4090-a": PAIR, "pp-4090-b": PAIR}
    assert instance_groups({"gpu-1": {"instances": [{"instance": "i0"}]}}) == {}


def test_the_default_canary_would_split_the_pair_and_is_refused(plans: dict) -> None:
    targets = list(PAIR)
    (error,) = group_batch_errors(batches(targets, [], [1]), instance_groups(plans), targets)
    assert error.startswith(
        "vllm_rollout_serial / vllm_rollout_canary: the instance over pp-4090-a, pp-4090-b"
    )
    assert "(canary: pp-4090-a; batch 1: pp-4090-b)" in error and "name all its hosts as the canary" in error


def test_the_pair_as_the_canary_is_one_unit(plans: dict) -> None:
    targets = [*PAIR, "single-1"]
    assert group_batch_errors(batches(targets, list(PAIR), [1]), instance_groups(plans), targets) == []


def test_a_rollout_of_one_rank_only_is_refused(plans: dict) -> None:
    (error,) = group_batch_errors([["pp-4090-a"]], instance_groups(plans), ["pp-4090-a"])
    assert error.startswith("vllm_rollout_hosts: pp-4090-b of the instance over pp-4090-a, pp-4090-b not in")


def test_the_rollout_playbook_refuses_the_split_before_any_change(tmp_path: Path) -> None:
    """playbooks/rollout.yml on two local hosts (the preflight test's inventory): preflight passes, then the
    rollout's plan refuses the default canary (one rank) before any host changes."""
    proc = preflight(tmp_path, "127.0.0.1", 0, playbook="rollout.yml")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert (
        "rollout refused, no host was changed: vllm_rollout_serial / vllm_rollout_canary: the instance" in out
    )
    assert "Rollout | canary" not in out


def test_a_failed_rank_rolls_its_peers_back_in_the_same_batch(plans: dict) -> None:
    """Rank 0's verify failed and rank 1's passed: rank 1 rolls back with it; a peer's failure left from
    another batch, a single-host instance and a passed peer roll back nothing."""
    from vllm_fleet.rollout.decisions import failed_peers

    groups = instance_groups(plans)
    failures = {"pp-4090-a": "verify: crashed", "pp-4090-b": None}
    assert failed_peers("pp-4090-b", groups, failures, PAIR) == ["pp-4090-a"]
    assert failed_peers("pp-4090-a", groups, failures, PAIR) == []  # its own failure is not a peer's
    assert failed_peers("pp-4090-b", groups, failures, ["pp-4090-b"]) == []
    assert failed_peers("gpu-1", groups, {"gpu-2": "verify: crashed"}, ["gpu-1", "gpu-2"]) == []


def test_the_failed_peers_filter_reads_plans_and_failures_from_hostvars(plans: dict) -> None:
    from ansible_collections.vllm_fleet.serving.plugins.filter.vllm_rollout import vllm_rollout_failed_peers

    hostvars = {
        "pp-4090-a": {"vllm_fleet_plan": plans["pp-4090-a"], "__vllm_rollout_failure": "verify: crashed"},
        "pp-4090-b": {"vllm_fleet_plan": plans["pp-4090-b"], "__vllm_rollout_failure": None},
    }
    assert vllm_rollout_failed_peers("pp-4090-b", hostvars, list(PAIR)) == ["pp-4090-a"]
    assert vllm_rollout_failed_peers("pp-4090-b", hostvars, ["pp-4090-b"]) == []


def test_a_rollback_restarts_each_rank_in_a_deploys_order(plans: dict) -> None:
    """From the instance plans the hosts hold (`<instance>.json`, slurped as text): rank 0 stops first, the
    headless rank starts next, rank 0 after it; an instance of one host, or one without a readable plan,
    restarts in the last step."""
    rank0, rank1 = (plans[host]["instances"][0] for host in PAIR)
    assert restore_order([json.dumps(rank0)], [rank0["instance"]]) == {
        "stop_first": [rank0["instance"]],
        "headless": [],
        "then": [rank0["instance"]],
    }
    assert restore_order([json.dumps(rank1), "not json"], [rank1["instance"], "i9"]) == {
        "stop_first": [],
        "headless": [rank1["instance"]],
        "then": ["i9"],
    }
    single = {**rank0, "instance": "i1"}
    single.pop("node")
    assert restore_order([single], ["i1"]) == {"stop_first": [], "headless": [], "then": ["i1"]}
