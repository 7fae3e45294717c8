"""One read of an instance per readiness poll (issue 21): the module vllm_fleet_instance_read against a real
HTTP server that answers with a lab vLLM's recorded /health, /v1/models and /metrics, a recorded `systemctl
show` and journal, and what vllm_fleet.verify.hostread and build_report make of its answer."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest
from httpserve import serving
from plans import lab_instance_plan
from pluginload import load_plugin

from vllm_fleet.errors import FleetInputError
from vllm_fleet.verify import hostread
from vllm_fleet.verify.report import JOURNAL_ARGV, SYSTEMCTL_PROPERTIES, ApiTarget, build_report

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "metrics"
MODULE = load_plugin(REPO / "plugins" / "modules" / "vllm_fleet_instance_read.py", "instance_read_under_test")
API = json.loads((FIX / "healthy" / "api.json").read_text())
RUNNING = (FIX / "systemctl" / "running.txt").read_text()
INVOCATION = "5db91e651bdb49c4a611cb97ce39757c"


class Answers(BaseHTTPRequestHandler):
    """Answers GET with the recorded bodies; `status` overrides a path's status, `seen` logs the requests."""

    status: ClassVar[dict[str, int]] = {}
    seen: ClassVar[list[tuple[str, str]]] = []
    bodies: ClassVar[dict[str, str]] = {
        "/health": API["health"]["content"] or "",
        "/v1/models": API["models"]["content"],
        "/metrics": (FIX / "healthy" / "metrics-after.txt").read_text(),
    }

    def do_GET(self) -> None:
        type(self).seen.append((self.path, self.headers.get("Authorization", "")))
        body = self.bodies.get(self.path, "").encode()
        self.send_response(self.status.get(self.path, 200 if self.path in self.bodies else 404))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Answers.status, Answers.seen = {}, []
    with serving(Answers) as url:
        yield url


def target(base_url: str) -> ApiTarget:
    port = int(base_url.rsplit(":", 1)[1])
    return ApiTarget(
        instance="i0",
        unit="vllm-fleet-i0.service",
        address="127.0.0.1",
        port=port,
        served_model_name="tiny",
        max_model_len=256,
        prefix_caching=True,
        spec_decode=False,
        model_path="/srv/vllm-fleet-lab/models/tiny",
    )


class Runner:
    """Stands in for subprocess.run: the recorded `systemctl show` and journal, and the argv it was given."""

    def __init__(self, show: str, journal: str = "", show_rc: int = 0) -> None:
        self.show, self.journal, self.show_rc, self.calls = show, journal, show_rc, []

    def __call__(self, argv, **_kw) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        if argv[0] == "systemctl":
            err = "no bus" if self.show_rc else ""
            return subprocess.CompletedProcess(argv, self.show_rc, self.show, err)
        return subprocess.CompletedProcess(argv, 0, self.journal, "")


def journal_json() -> str:
    lines = (FIX / "healthy" / "startup.log").read_text().splitlines()
    return "\n".join(json.dumps({"MESSAGE": line, "_PID": "2369", "_STREAM_ID": "s1"}) for line in lines)


def test_read_args_name_the_unit_the_properties_and_the_journal() -> None:
    args = hostread.read_args(target("http://127.0.0.1:8000"), checks=True, api_key="k", request_timeout=3)
    assert args["unit"] == "vllm-fleet-i0.service" and args["base_url"] == "http://127.0.0.1:8000"
    assert args["properties"] == list(SYSTEMCTL_PROPERTIES) and args["journal_argv"] == list(JOURNAL_ARGV)
    assert (args["checks"], args["api_key"], args["request_timeout"]) == (True, "k", 3)


def light_report(server: str, read: dict, reads: dict, metrics: str | None, **extra: Any):
    """verify's report without test requests (full=False) over one instance read, ready at the first poll."""
    return build_report(
        host="lab-1",
        plan=_plan(server),
        journal=reads["journal"],
        unit_show=read["unit_show"],
        api={"health": reads["health"], "models": reads["models"], "metrics": reads["metrics"]},
        metrics_before=metrics,
        metrics_after=metrics,
        readiness={"state": "ready", "reason": "/health answered 200", "waited_s": 0.3, "timeout": 0},
        full=False,
        **extra,
    )


def test_a_ready_instance_is_read_whole_in_one_call_and_passes_the_light_check(server: str) -> None:
    runner = Runner(RUNNING, journal_json())
    params = hostread.read_args(target(server), checks=True, api_key="s3cret")
    read = MODULE.read_instance(params, run=runner)
    assert runner.calls[1] == [*JOURNAL_ARGV, f"_SYSTEMD_INVOCATION_ID={INVOCATION}"]
    assert [p for p, _ in Answers.seen] == ["/health", "/v1/models", "/metrics"]
    assert dict(Answers.seen)["/v1/models"] == "Bearer s3cret" and dict(Answers.seen)["/metrics"] == ""
    assert "s3cret" not in json.dumps(read)
    state, health = hostread.poll_of(read, "vllm-fleet-i0.service")
    assert (state.active_state, state.invocation_id, health) == ("active", INVOCATION, 200)
    reads = hostread.check_reads(read)
    assert reads is not None and reads["models"]["status"] == 200 and "vllm:" in reads["metrics"]["content"]
    report = light_report(
        server,
        read,
        reads,
        metrics=reads["metrics"]["content"],
        verified_start={"invocation_id": INVOCATION, "plan_sha256": "x"},
    )
    failed = [c for c in report.checks if not c.ok]
    assert report.ok, failed
    assert {"ready", "restarts", "api_health", "api_models_served_name", "api_metrics"} <= {
        c.name for c in report.checks
    }
    assert report.checks[0].line == "waited 0.3 s (the first poll)"


def test_a_broken_metrics_endpoint_fails_the_light_check(server: str) -> None:
    Answers.status = {"/metrics": 500}
    runner = Runner(RUNNING, journal_json())
    read = MODULE.read_instance(hostread.read_args(target(server), checks=True), run=runner)
    reads = hostread.check_reads(read)
    assert reads is not None and reads["metrics"]["status"] == 500
    report = light_report(server, read, reads, metrics=None)
    assert not report.ok
    assert [c.name for c in report.checks if not c.ok] == ["api_metrics"]


def test_while_loading_only_the_unit_and_health_are_read(server: str) -> None:
    Answers.status = {"/health": 503}
    runner = Runner(RUNNING)
    read = MODULE.read_instance(hostread.read_args(target(server), checks=True), run=runner)
    assert [p for p, _ in Answers.seen] == ["/health"] and len(runner.calls) == 1
    assert hostread.poll_of(read, "u")[1] == 503 and hostread.check_reads(read) is None


class Clock:
    """Stands in for time.monotonic and time.sleep: a sleep moves the clock, and may change the answers."""

    def __init__(self, on_sleep=None) -> None:
        self.now, self.sleeps, self.on_sleep = 0.0, 0, on_sleep

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1
        if self.on_sleep:
            self.on_sleep(self.sleeps)


def held_read(server: str, runner: Runner, clock: Clock, hold: float = 6) -> dict[str, Any]:
    params = hostread.read_args(target(server), checks=True, hold=hold, interval=2)
    return MODULE.read_instance(params, run=runner, clock=clock, sleep=clock.sleep)


def test_a_loading_instance_is_read_again_on_the_host_until_the_hold_ends(server: str) -> None:
    """Issue 32: a wait pays one module call (a Python start on the host) per hold, not one per poll."""
    Answers.status = {"/health": 503}
    runner, clock = Runner(RUNNING), Clock()
    read = held_read(server, runner, clock)
    # reads at 0, 2, 4 and 6 s: a fifth would end past the hold
    assert read["reads"] == 4 and clock.now == 6 and len(runner.calls) == 4
    assert [p for p, _ in Answers.seen] == ["/health"] * 4
    assert hostread.poll_of(read, "u")[1] == 503 and hostread.check_reads(read) is None


def test_a_hold_ends_when_the_instance_answers_and_the_checks_are_read_in_the_same_call(server: str) -> None:
    Answers.status = {"/health": 503}

    def ready_after_two(sleeps: int) -> None:
        if sleeps == 2:
            Answers.status = {}

    runner, clock = Runner(RUNNING, journal_json()), Clock(ready_after_two)
    read = held_read(server, runner, clock, hold=10)
    assert read["reads"] == 3 and clock.now == 4
    assert [p for p, _ in Answers.seen] == ["/health"] * 3 + ["/v1/models", "/metrics"]
    assert hostread.check_reads(read) is not None


def test_a_hold_ends_when_the_unit_changes(server: str) -> None:
    """A restart (a new InvocationID) or a crash answers at once: the controller tells the start apart."""
    Answers.status = {"/health": 503}
    restarted = RUNNING.replace(INVOCATION, "0" * 32)
    runner, clock = Runner(RUNNING), Clock(lambda sleeps: setattr(runner, "show", restarted))
    read = held_read(server, runner, clock, hold=10)
    assert read["reads"] == 2 and hostread.poll_of(read, "u")[0].invocation_id == "0" * 32
    failed = RUNNING.replace("ActiveState=active", "ActiveState=failed")
    runner, clock = Runner(failed), Clock()
    assert held_read(server, runner, clock, hold=10)["reads"] == 1  # not loading: no hold at all


def test_a_refused_connection_is_no_answer_and_no_checks(server: str) -> None:
    port = int(server.rsplit(":", 1)[1])
    closed = f"http://127.0.0.1:{port + 1 if port < 65535 else port - 1}"
    read = MODULE.read_instance(hostread.read_args(target(closed), checks=True), run=Runner(RUNNING))
    assert read["health"]["status"] == -1 and hostread.health_status(read) is None
    assert hostread.check_reads(read) is None


def test_checks_false_reads_no_journal_even_when_ready(server: str) -> None:
    runner = Runner(RUNNING, journal_json())
    read = MODULE.read_instance(hostread.read_args(target(server), checks=False), run=runner)
    assert len(runner.calls) == 1 and [p for p, _ in Answers.seen] == ["/health"]
    assert hostread.check_reads(read) is None


def test_a_missing_unit_is_named_and_its_api_not_called(server: str) -> None:
    show = (FIX / "systemctl" / "not-found.txt").read_text()
    read = MODULE.read_instance(hostread.read_args(target(server), checks=True), run=Runner(show))
    assert Answers.seen == [] and read["health"] == {}
    with pytest.raises(FleetInputError, match="no such unit"):
        hostread.poll_of(read, "vllm-fleet-i0.service")


def test_a_failing_systemctl_fails_the_read(server: str) -> None:
    read = MODULE.read_instance(hostread.read_args(target(server), checks=True), run=Runner("", show_rc=1))
    assert read["failed"] and "no bus" in read["msg"]


def test_a_journal_that_cannot_be_read_leaves_no_log_to_pass() -> None:
    read = {
        "journal": {"rc": 1, "stdout": "partial"},
        "health": {"status": 200},
        "models": {"status": 200},
        "metrics": {"status": 200},
    }
    assert hostread.check_reads(read)["journal"] == ""


def _plan(base_url: str) -> dict:
    """The lab instance's plan (tests/unit/plans.py) on the test server's port, expecting the recorded
    start's KV figures (as tests/unit/test_report.py does)."""
    plan = lab_instance_plan(vllm_service_host="127.0.0.1")
    plan["expectations"] = {
        **plan["expectations"],
        "kv_cache_tokens": 1_048_576,
        "max_concurrency": 4096.0,
        "max_model_len": 256,
        "kv_cache_dtype": "auto",
    }
    plan["port"] = int(base_url.rsplit(":", 1)[1])
    return plan


def test_a_headless_rank_is_read_by_its_unit_and_journal_and_no_url(server: str) -> None:
    """A rank > 0 of a multi-host instance (issue 33) has no API: the read asks no URL at all, and once its
    unit runs it carries the journal of the current start."""
    from dataclasses import replace

    headless = replace(target(server), headless=True)
    runner = Runner(RUNNING, journal_json())
    read = MODULE.read_instance(hostread.read_args(headless, checks=True), run=runner)
    assert Answers.seen == [] and read["health"] == {} and read["models"] == {}
    assert read["journal"]["rc"] == 0 and runner.calls[-1][-1] == f"_SYSTEMD_INVOCATION_ID={INVOCATION}"
    assert hostread.check_reads(read, headless=True)["journal"] == journal_json()
