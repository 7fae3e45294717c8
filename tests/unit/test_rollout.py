"""vllm_fleet.rollout.decisions: batch plan (checked against Ansible's own batching), stop rule, hashes,
summary."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from ansible.executor.playbook_executor import PlaybookExecutor
from plans import lab_instance_plan

from vllm_fleet.errors import FleetInputError
from vllm_fleet.rollout import decisions as rollout

HOSTS = [f"h{i}" for i in range(1, 11)]


def ansible_batches(hosts: list[str], serial: list) -> list[list[str]]:
    """What ansible-core itself does with `serial` (its PlaybookExecutor method, on a minimal play)."""
    inventory = SimpleNamespace(get_hosts=lambda pattern, order=None: list(hosts))
    executor = SimpleNamespace(_inventory=inventory)
    play = SimpleNamespace(hosts="all", order="inventory", serial=serial)
    return PlaybookExecutor._get_serialized_batches(executor, play)


@pytest.mark.parametrize(
    "serial",
    [[1], [2], ["25%"], [1, "25%", "100%"], ["10%", "50%"], [3, 1], ["100%"], [1, 1, "30%"], ["1%"]],
)
@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 10])
def test_plan_batches_matches_ansible(serial: list, count: int) -> None:
    hosts = HOSTS[:count]
    assert rollout.plan_batches(hosts, serial) == ansible_batches(hosts, serial)


def test_plan_batches_default_serial_on_ten_hosts() -> None:
    assert rollout.plan_batches(HOSTS, [1, "25%", "100%"]) == [["h1"], ["h2", "h3"], HOSTS[3:]]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1,25%,100%", [1, "25%", "100%"]), ("2", [2]), (3, [3]), ([1, "50 %"], [1, "50%"]), ("25%", ["25%"])],
)
def test_parse_serial(value, expected) -> None:
    assert rollout.parse_serial(value) == expected


@pytest.mark.parametrize("value", [0, "0", "-1", "0%", "150%", "abc", True, [], [1, None], "1,,2"])
def test_parse_serial_rejects_and_names_the_variable(value) -> None:
    with pytest.raises(FleetInputError, match=r"vllm_rollout_serial=.*(positive integer|empty)"):
        rollout.parse_serial(value)


def test_split_canary_first_host_or_named() -> None:
    assert rollout.split_canary(["a", "b", "c"], []) == (["a"], ["b", "c"])
    assert rollout.split_canary(["a", "b", "c"], ["c", "b"]) == (["b", "c"], ["a"])
    with pytest.raises(FleetInputError, match="vllm_rollout_canary names z"):
        rollout.split_canary(["a", "b"], ["z"])
    with pytest.raises(FleetInputError, match="vllm_rollout_hosts matches no host"):
        rollout.split_canary([], [])


def test_verdict_canary_stops_on_any_failure() -> None:
    verdict = rollout.batch_verdict({"a": "unreachable"}, 100, canary=True)
    assert verdict["stop"] and verdict["reason"] == "canary failed: a"
    assert not rollout.batch_verdict({"a": "ok"}, 0, canary=True)["stop"]


def test_verdict_rolled_back_always_stops() -> None:
    statuses = {"a": "ok", "b": "ok", "c": "ok", "d": "rolled_back"}
    verdict = rollout.batch_verdict(statuses, 50)
    assert verdict["stop"] and "failed verification on d" in verdict["reason"]


def test_verdict_max_fail_percentage_counts_unreachable() -> None:
    statuses = {"a": "ok", "b": "ok", "c": "ok", "d": "unreachable"}
    assert rollout.batch_verdict(statuses, 25)["stop"] is False  # 25% is not above 25%
    assert rollout.batch_verdict(statuses, 24)["stop"] is True
    assert rollout.batch_verdict(statuses, 0)["failed"] == ["d"]


def test_verdict_from_records_missing_host_counts_as_failed() -> None:
    records = [{"host": "a", "status": "ok"}, {"host": "b", "status": "in_progress"}]
    assert rollout.batch_statuses(records, ["a", "b", "c"]) == {
        "a": "ok",
        "b": "in_progress",
        "c": "in_progress",
    }
    assert rollout.batch_verdict_from_records(records, ["a", "b", "c"], 50)["stop"] is True


@pytest.mark.parametrize("value", [-1, 101, "ten", 1.5, None, True])
def test_max_fail_percentage_is_checked(value) -> None:
    with pytest.raises(FleetInputError, match="vllm_rollout_max_fail_percentage="):
        rollout.check_max_fail_percentage(value)


def test_argv_hash_and_fingerprint_are_stable_and_sensitive() -> None:
    argv = ["/opt/vllm-fleet/venv/bin/vllm", "serve", "/m", "--max-model-len", "256"]
    assert rollout.argv_hash(argv) == rollout.argv_hash(list(argv))
    assert rollout.argv_hash(argv) != rollout.argv_hash([*argv[:-1], "512"])
    # argv boundaries matter: "a b" as one argument is not "a", "b"
    assert rollout.argv_hash(["a b"]) != rollout.argv_hash(["a", "b"])
    assert rollout.argv_hash([]) is None
    files = {"i0.json": "aa", "i0.env": "bb", "vllm-fleet-i0.service": "cc"}
    assert rollout.config_fingerprint(files) == rollout.config_fingerprint(dict(reversed(files.items())))
    assert rollout.config_fingerprint({**files, "i0.env": "bx"}) != rollout.config_fingerprint(files)
    assert rollout.config_fingerprint({}) is None


def test_history_to_prune_keeps_newest_and_protected() -> None:
    entries = [{"path": f"/h/cfg-{n}", "mtime": n} for n in range(1, 8)]
    assert rollout.history_to_prune(entries, 3) == ["/h/cfg-1", "/h/cfg-2", "/h/cfg-3", "/h/cfg-4"]
    # the snapshot a rollback needs survives even when it is the oldest
    assert rollout.history_to_prune(entries, 3, ["cfg-1"]) == ["/h/cfg-2", "/h/cfg-3", "/h/cfg-4", "/h/cfg-5"]
    assert rollout.history_to_prune(entries[:2], 5) == []
    with pytest.raises(FleetInputError, match="vllm_rollout_history_keep=0"):
        rollout.history_to_prune(entries, 0)


def test_instance_names_from_units() -> None:
    units = [
        "/etc/systemd/system/vllm-fleet-i1.service",
        "/etc/systemd/system/vllm-fleet-i0.service",
        "x.service",
    ]
    assert rollout.instance_names(units) == ["i0", "i1"]


# Instance plans as deploy writes them (build_host_plan over the lab's variables), max_model_len 256 -> 128.
PLAN_OLD = json.dumps(lab_instance_plan())
PLAN_NEW = json.dumps(lab_instance_plan(vllm_service_max_model_len=128))


def record(**overrides):
    base = {
        "host": "h1",
        "canary": True,
        "batch": 1,
        "old_plans": [PLAN_OLD],
        "new_plans": [PLAN_NEW],
        "old_fingerprint": "f-old",
        "new_fingerprint": "f-new",
        "started_at": 100.0,
        "ready_at": 142.25,
    }
    base.update(overrides)
    return rollout.host_result(**base)


def test_host_result_statuses() -> None:
    ok = record()
    assert ok["status"] == "ok" and ok["time_to_ready_s"] == 42.2
    assert ok["old"]["version"] == "0.32.0" and ok["old"]["argv_hash"] != ok["new"]["argv_hash"]
    assert ok["old"]["instances"]["i0"] == rollout.argv_hash(json.loads(PLAN_OLD)["argv"])
    assert record(new_fingerprint="f-old", new_plans=[PLAN_OLD])["status"] == "unchanged"
    assert record(failure="verify: x", rolled_back=True)["status"] == "rolled_back"
    down = record(failure="verify: x", rolled_back=False, rollback_failure="restart: y")
    assert (down["status"], down["failure"], down["rollback_failure"]) == ("down", "verify: x", "restart: y")
    assert record(failure="connect: timed out", unreachable=True)["status"] == "unreachable"
    assert record(failure="x", rolled_back=True)["time_to_ready_s"] is None


def test_plan_identity_tolerates_foreign_plans() -> None:
    ident = rollout.plan_identity(["not json", "[1, 2]", {"argv": ["a"]}])
    assert ident == {"version": None, "argv_hash": None, "instances": {}}
    mixed = rollout.plan_identity([PLAN_OLD, {"argv": ["a"]}])
    assert mixed["version"] == "0.32.0" and list(mixed["instances"]) == ["i0"]


def test_summarize_good_rollout() -> None:
    records = [record(host="h1"), record(host="h2", canary=False, batch=2)]
    summary = rollout.summarize(["h1", "h2"], records, started_at=10.0, finished_at=70.0)
    assert summary["result"] == "ok" and summary["stop_reason"] is None
    assert summary["totals"]["ok"] == 2 and summary["totals"]["wall_s"] == 60.0
    assert summary["totals"]["time_to_ready_max_s"] == 42.2


def test_summarize_stopped_rollout_marks_unreachable_and_not_started() -> None:
    records = [
        record(host="h1"),
        {**record(host="h2", failure="turn started, no result yet"), "status": "in_progress"},
    ]
    summary = rollout.summarize(
        ["h1", "h2", "h3"], records, unreachable={"h2": "ssh: connect timed out"}, stop_reason="canary failed"
    )
    statuses = [h["status"] for h in summary["hosts"]]
    assert statuses == ["ok", "unreachable", "not_started"]
    assert summary["result"] == "failed" and summary["stop_reason"] == "canary failed"
    # without the event stream, the host stays in progress, which still counts as failed
    again = rollout.summarize(["h1", "h2"], records)
    assert again["hosts"][1]["status"] == "in_progress" and again["result"] == "failed"


def test_summarize_unchanged_and_refused() -> None:
    same = record(new_fingerprint="f-old", new_plans=[PLAN_OLD])
    assert rollout.summarize(["h1"], [same])["result"] == "unchanged"
    refused = rollout.summarize(["h1", "h2"], [], refused={"h2": "vllm_service_max_model_len: too big"})
    assert refused["result"] == "refused"
    assert [h["status"] for h in refused["hosts"]] == ["refused", "refused"]
    assert refused["hosts"][1]["failure"] == "vllm_service_max_model_len: too big"
    assert "preflight refused h2" in refused["stop_reason"]


def test_record_with_unknown_status_is_an_input_error() -> None:
    with pytest.raises(FleetInputError, match="status 'weird'"):
        rollout.summarize(["h1"], [{"host": "h1", "status": "weird"}])


def test_format_summary_table() -> None:
    summary = rollout.summarize(
        ["h1", "h2"],
        [record(), record(host="h2", canary=False, failure="verify: boom", rolled_back=True)],
        started_at=0.0,
        finished_at=90.0,
    )
    text = rollout.format_summary(summary)
    lines = text.splitlines()
    assert lines[0].split() == [
        "host",
        "result",
        "old",
        "version/argv",
        "new",
        "version/argv",
        "ready",
        "in",
        "detail",
    ]
    assert lines[1].startswith("h1 (canary)  ok") and "42.2s" in lines[1]
    assert "rolled_back" in lines[2] and "verify: boom" in lines[2]
    assert "rollout failed in 90.0s: 1 ok, 1 rolled_back" in text


# Recorded from a real `vllm-fleet rollout --events` on three lab hosts (vLLM 0.32.0 CPU): the canary's new
# argv (--max-num-seqs 0) was refused by vLLM at startup, the canary was rolled back, the rollout stopped (the
# lab was torn down under the re-verification, so the canary ended `down`).
EVENTS = Path(__file__).resolve().parents[1] / "fixtures" / "rollout" / "events-canary-rejected-lab.jsonl"


def recorded_events() -> list[dict]:
    return [json.loads(line) for line in EVENTS.read_text(encoding="utf-8").splitlines()]


def test_digest_of_a_recorded_canary_failure() -> None:
    digest = rollout.digest_events(recorded_events())
    assert digest.plays == [
        "Preflight checks (controller side, nothing changes)",
        "Rollout | mark the hosts that passed preflight",
        "Rollout | plan on the controller",
        "Rollout | canary",
        "Rollout | batches",
        "Rollout | summary",
    ]
    assert sorted(digest.failed) == ["localhost", "ro1-1"]
    assert any("failed verification" in f for f in digest.failed["ro1-1"])
    assert digest.failed["localhost"] == [
        "Fail when the rollout did not finish well: rollout failed: canary failed: ro1-1"
    ]
    assert digest.unreachable == {}
    # the hosts after the canary were never changed
    assert rollout.changed_total(digest, ["ro1-2", "ro1-3"]) == 0
    # the turn's rescue (roll back) and the rollback's own rescue (its verification failed too)
    assert digest.stats["ro1-1"]["rescued"] == 2


def test_progress_lines_of_a_recorded_canary_failure() -> None:
    lines = [line for line in map(rollout.progress_line, recorded_events()) if line]
    steps = [line.strip() for line in lines if line.startswith("   ro1-1: ") and "FAILED" not in line]
    assert steps == [
        "ro1-1: start",
        "ro1-1: connect",
        "ro1-1: keep the last-known-good configuration",
        "ro1-1: deploy",
        "ro1-1: verify",
        "ro1-1: roll back to the last-known-good configuration",
    ]
    assert "   rollout stops: canary failed: ro1-1" in lines
    assert not any(line.startswith(("   ro1-2", "   ro1-3")) for line in lines)
