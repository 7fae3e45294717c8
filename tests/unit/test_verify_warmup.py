"""verify's warm-up requests in one call on the host (issue 32): the module vllm_fleet_warmup against a real
HTTP server that answers with a lab vLLM's recorded completion (tests/fixtures/metrics/healthy/api.json), and
send_test_requests handing them to it as one batch."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from plans import lab_instance_plan
from pluginload import load_plugin

from vllm_fleet.plan.host import InstancePlan
from vllm_fleet.verify import live
from vllm_fleet.verify.report import api_target

REPO = Path(__file__).resolve().parents[2]
HEALTHY = REPO / "tests" / "fixtures" / "metrics" / "healthy"
MODULE = load_plugin(REPO / "plugins" / "modules" / "vllm_fleet_warmup.py", "warmup_under_test")
COMPLETION = json.loads((HEALTHY / "api.json").read_text())["completion"]["content"]


class Completions(BaseHTTPRequestHandler):
    """Answers POST /v1/completions with the recorded completion; `statuses` (consumed in order) override
    the status, `seen` logs (path, Authorization, body)."""

    statuses: ClassVar[list[int]] = []
    seen: ClassVar[list[tuple[str, str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, self.headers.get("Authorization", ""), body))
        status = type(self).statuses.pop(0) if type(self).statuses else 200
        answer = COMPLETION.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Completions.statuses, Completions.seen = [], []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Completions)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def params(url: str, count: int, api_key: str = "") -> dict[str, Any]:
    body = {"model": "tiny", "prompt": "ab ab", "max_tokens": 8, "temperature": 0}
    return {"url": url, "body": body, "count": count, "api_key": api_key, "timeout": 5}


def test_one_call_sends_the_body_count_times_with_the_key_and_keeps_each_status(server: str) -> None:
    Completions.statuses = [200, 500, 200]
    answered = MODULE.post_repeatedly(params(f"{server}/v1/completions", 3, api_key="s3cret"))
    assert answered == {"statuses": [200, 500, 200], "msg": ""}
    assert [(path, auth) for path, auth, _ in Completions.seen] == [("/v1/completions", "Bearer s3cret")] * 3
    assert all(body["prompt"] == "ab ab" for _, _, body in Completions.seen)
    assert "s3cret" not in json.dumps(answered)


def test_a_request_without_an_answer_is_minus_one_and_says_why(server: str) -> None:
    port = int(server.rsplit(":", 1)[1])
    closed = f"http://127.0.0.1:{port + 1 if port < 65535 else port - 1}/v1/completions"
    answered = MODULE.post_repeatedly(params(closed, 2))
    assert answered["statuses"] == [-1, -1] and "refused" in answered["msg"].lower()


def test_send_test_requests_hands_the_warmup_over_as_one_batch() -> None:
    """The completion and the chat go through `send`, the warm-up requests through `send_warmup` at once:
    the same URL and body `send` would have been given, `warmup_requests` times."""
    completion = {"status": 200, "json": json.loads(COMPLETION)}
    before = (HEALTHY / "metrics-before.txt").read_text()
    sent: list[tuple[str, str]] = []
    batches: list[tuple[str, dict[str, Any], int]] = []

    def send(method, url, *, body=None, headers=None, timeout_s=0):
        sent.append((method, url.rsplit("/", 2)[-1]))
        return completion if url.endswith("/completions") else {"status": 200, "content": "after"}

    def send_warmup(url: str, body: dict[str, Any], count: int) -> list[int]:
        batches.append((url, body, count))
        return [200] * count

    target = api_target(InstancePlan.from_dict(lab_instance_plan(vllm_service_host="127.0.0.1")))
    request = live.Request(prompt="ab", warmup_requests=8)
    answers = live.send_test_requests(target, request, before, send, send_warmup)
    assert sent == [("POST", "completions"), ("POST", "completions"), ("GET", "metrics")]
    ((url, body, count),) = batches
    assert (url, count) == (f"{target.base_url}/v1/completions", 8)
    assert body == {"model": "tiny", "prompt": answers["probe_prompt"], "max_tokens": 8, "temperature": 0}
    assert answers["warmup"] == [200] * 8
