"""A deliberate stop of a healthy server is not a failure; an engine that dies before it still is.

The logs are vLLM 0.26.0's own, recorded on an H200 (tests/fixtures/gpu-h200-vllm-0.26.0, README there): the
run script stopped every server with SIGINT after verify. seed-dense's stop prints the engine client's
EngineDeadError ("AsyncLLM output_handler failed": the engine was told to exit), next-hybrid-triton's the
uvicorn lifespan's asyncio CancelledError; next-hybrid's engine died at its first request, before the stop.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fleet.cli import main
from vllm_fleet.verify.logcheck import check_log, parse_log

GPU = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-h200-vllm-0.26.0"


def log(run: str) -> str:
    return (GPU / run / "vllm.log").read_text()


def without(text: str, *needles: str) -> str:
    """The real log less its lines holding any of `needles` (to show what each stop line decides)."""
    return "".join(line for line in text.splitlines(True) if not any(n in line for n in needles))


def no_errors(text: str) -> bool:
    (check,) = [c for c in check_log(parse_log(text), {"no_errors": True}) if c.name == "no_errors"]
    return check.ok


def test_sigint_stop_with_engine_dead_error_is_not_a_failure() -> None:
    text = log("seed-dense")
    assert "EngineDeadError: EngineCore encountered an issue" in text  # printed after the SIGINT
    report = parse_log(text)
    assert report.errors == [] and not report.engine_dead and report.ready
    assert report.stop is not None and report.stop["signal"] == "SIGINT" and report.stop["after_ready"]
    assert "[shutdown] EngineCore: trigger received signal=SIGINT" in report.stop["line"]
    assert report.stop["ignored"] == {"engine_dead": 1, "traceback_after_ready": 1}
    assert no_errors(text)


def test_sigint_stop_with_uvicorn_cancelled_error_is_not_a_failure() -> None:
    text = log("next-hybrid-triton")
    assert "asyncio.exceptions.CancelledError" in text
    report = parse_log(text)
    assert report.errors == [] and report.ready
    assert report.stop is not None and report.stop["signal"] == "SIGINT"
    assert report.stop["ignored"] == {"traceback_after_ready": 1}
    assert no_errors(text)


def test_engine_death_before_the_stop_is_still_reported() -> None:
    report = parse_log(log("next-hybrid"))
    assert report.engine_dead and report.engine_death is not None
    assert report.engine_death["root_cause"] == {
        "exception": "NotImplementedError",
        "message": "SM90 GDN prefill DSL kernel is unavailable",
    }
    assert {"engine_dead", "traceback_after_ready", "http_server_error"} <= set(report.error_counts)
    assert report.stop is not None  # the script's SIGINT came after; what it printed is the stop's
    assert not no_errors(log("next-hybrid"))


@pytest.mark.parametrize("run", ["seed-dense", "next-hybrid-triton"])
def test_the_same_tracebacks_without_a_stop_line_are_failures(run: str) -> None:
    # the same real lines with every stop line taken out: nothing says the stop was asked for
    text = without(log(run), "[shutdown]", "Shutting down")
    report = parse_log(text)
    assert report.stop is None and "traceback_after_ready" in report.error_counts
    assert not no_errors(text)


def test_uvicorn_line_alone_excuses_a_cancellation_not_an_engine_death() -> None:
    # older releases print no "[shutdown]" lines; uvicorn's "Shutting down" is also what vLLM's engine-dead
    # watchdog makes it print, so after it only asyncio's cancellation is the stop's
    hybrid = parse_log(without(log("next-hybrid-triton"), "[shutdown]"))
    assert hybrid.errors == [] and hybrid.stop is not None and hybrid.stop["signal"] is None
    dense_lines = without(log("seed-dense"), "[shutdown]").splitlines(True)
    # move uvicorn's line before the EngineDeadError traceback: the death still counts
    stop = next(i for i, line in enumerate(dense_lines) if "Shutting down" in line)
    first = next(i for i, line in enumerate(dense_lines) if "AsyncLLM output_handler failed" in line)
    dense_lines.insert(first, dense_lines.pop(stop))
    dense = parse_log("".join(dense_lines))
    assert dense.engine_dead and "engine_dead" in dense.error_counts


def test_a_restart_after_a_stop_counts_errors_again() -> None:
    stopped = log("seed-dense")
    died = log("next-hybrid")
    report = parse_log(stopped + died)  # one journal: a stopped instance, then a start whose engine dies
    assert report.engine_dead and "engine_dead" in report.error_counts


@pytest.mark.parametrize("run", ["seed-dense"])
def test_verify_replayed_on_the_whole_log_passes(run: str, capsys: pytest.CaptureFixture[str]) -> None:
    d = GPU / run
    argv = ["verify", "--plan", str(d / "plan.json"), "--log", str(d / "vllm.log")]
    rc = main([*argv, "--replay", str(d / "answers.json"), "--host", "h200", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in report["checks"] if not c["ok"]] == [] and rc == 0
