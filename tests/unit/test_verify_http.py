"""verify's test requests in two calls on the host (issue 32): the module vllm_fleet_http against a real HTTP
server that answers with a lab vLLM's recorded completion and /metrics (tests/fixtures/metrics/healthy), and
send_test_requests handing it the completion and the chat, then the warm-up requests and the scrape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest
from httpserve import serving
from plans import lab_instance_plan
from pluginload import load_plugin

from vllm_fleet.plan.host import InstancePlan
from vllm_fleet.verify import live
from vllm_fleet.verify.report import api_target

REPO = Path(__file__).resolve().parents[2]
HEALTHY = REPO / "tests" / "fixtures" / "metrics" / "healthy"
MODULE = load_plugin(REPO / "plugins" / "modules" / "vllm_fleet_http.py", "http_under_test")
COMPLETION = json.loads((HEALTHY / "api.json").read_text())["completion"]["content"]
METRICS = (HEALTHY / "metrics-before.txt").read_text()


class Completions(BaseHTTPRequestHandler):
    """Answers POST with the recorded completion and GET /metrics with the recorded scrape; `statuses`
    (consumed in order) override the status, `seen` logs (method, path, Authorization, body)."""

    statuses: ClassVar[list[int]] = []
    seen: ClassVar[list[tuple[str, str, str, Any]]] = []

    def answer(self, body: Any, content: str) -> None:
        type(self).seen.append((self.command, self.path, self.headers.get("Authorization", ""), body))
        status = type(self).statuses.pop(0) if type(self).statuses else 200
        raw = content.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self) -> None:
        self.answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))), COMPLETION)

    def do_GET(self) -> None:
        self.answer(None, METRICS)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Completions.statuses, Completions.seen = [], []
    with serving(Completions) as url:
        yield url


def params(requests: list[dict[str, Any]], api_key: str = "") -> dict[str, Any]:
    return {"requests": requests, "api_key": api_key, "timeout": 5}


BODY = {"model": "tiny", "prompt": "ab ab", "max_tokens": 8, "temperature": 0}


def test_one_call_sends_each_request_in_order_with_the_key_where_asked_and_keeps_each_answer(
    server: str,
) -> None:
    Completions.statuses = [200, 500, 200]
    requests = [
        {"method": "POST", "url": f"{server}/v1/completions", "body": BODY, "auth": True},
        {"method": "POST", "url": f"{server}/v1/completions", "body": BODY, "auth": True},
        {"method": "GET", "url": f"{server}/metrics", "auth": False},
    ]
    answers = MODULE.send_all(params(requests, api_key="s3cret"))
    assert [a["status"] for a in answers] == [200, 500, 200]
    assert [(m, path, auth) for m, path, auth, _ in Completions.seen] == [
        ("POST", "/v1/completions", "Bearer s3cret"),
        ("POST", "/v1/completions", "Bearer s3cret"),
        ("GET", "/metrics", ""),
    ]
    assert all(body == BODY for m, _, _, body in Completions.seen if m == "POST")
    # as uri registers them: the body, parsed where it is JSON; an error status is an answer with its body
    assert answers[0]["json"] == json.loads(COMPLETION) and answers[1]["content"] == COMPLETION
    assert answers[2]["content"] == METRICS and "json" not in answers[2]
    assert "s3cret" not in json.dumps(answers)


def test_a_request_without_an_answer_is_minus_one_and_says_why(server: str) -> None:
    port = int(server.rsplit(":", 1)[1])
    closed = f"http://127.0.0.1:{port + 1 if port < 65535 else port - 1}/v1/completions"
    answers = MODULE.send_all(params([{"method": "POST", "url": closed, "body": BODY}] * 2))
    assert [a["status"] for a in answers] == [-1, -1] and "refused" in answers[0]["msg"].lower()


def test_send_test_requests_sends_two_batches(server: str) -> None:
    """The completion and the chat in one batch; the warm-up prompt, sized from the completion's answer, sent
    `warmup_requests` times and the /metrics scrape after them in the second (each batch one module call on
    the host in the role: vllm_fleet_requests)."""
    batches: list[list[live.Call]] = []

    def send_batch(calls: list[live.Call]) -> list[dict[str, Any]]:
        batches.append(calls)
        requests = [{"method": c.method, "url": c.url, "body": c.body, "auth": c.auth} for c in calls]
        return MODULE.send_all(params(requests, api_key="s3cret"))

    plan = lab_instance_plan(vllm_service_host="127.0.0.1", vllm_service_port=int(server.rsplit(":", 1)[1]))
    target = api_target(InstancePlan.from_dict(plan))
    request = live.Request(prompt="ab", warmup_requests=8, api_key="s3cret")
    answers = live.send_test_requests(target, request, METRICS, send_batch=send_batch)
    assert [[(c.method, c.url.rsplit("/", 2)[-1]) for c in batch] for batch in batches] == [
        [("POST", "completions"), ("POST", "completions")],
        [("POST", "completions")] * 8 + [("GET", "metrics")],
    ]
    assert batches[0][1].url == f"{target.base_url}/v1/chat/completions"
    assert all(c.auth for c in batches[0] + batches[1][:-1]) and not batches[1][-1].auth
    probe = {"model": "tiny", "prompt": answers["probe_prompt"], "max_tokens": 8, "temperature": 0}
    assert all(c.body == probe for c in batches[1][:-1])
    assert answers["warmup"] == [200] * 8
    assert answers["api"]["completion"]["json"] == json.loads(COMPLETION)
    assert answers["metrics_after"] == METRICS
    # the CLI's path sends the same calls one by one (with urllib): the same answers (its own msg aside)
    by_urllib = live.send_test_requests(target, request, METRICS)
    assert by_urllib["warmup"] == answers["warmup"] and by_urllib["probe_prompt"] == answers["probe_prompt"]
    for name, answer in answers["api"].items():
        assert by_urllib["api"][name] == {key: value for key, value in answer.items() if key != "msg"}
