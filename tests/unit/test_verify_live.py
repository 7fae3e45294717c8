"""vllm_fleet.verify.live and `vllm-fleet verify`: the role's requests without Ansible, readiness without
systemd.

The role sends the test requests through the same function (send_test_requests, in vllm_fleet_requests); the
HTTP client runs against a real server (http.server on loopback). What a real vLLM answered is judged in
test_gpu_h200_fixtures.py (recorded on an H200). The lab comparison with the role (test_verify_cli_lab.py) is
out of the suite until it passes (git show 0d09776:tests/integration/test_verify_cli_lab.py).
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from vllm_fleet.cli import main
from vllm_fleet.cli.verify import plan_from_rendered
from vllm_fleet.errors import FleetInputError
from vllm_fleet.verify import live
from vllm_fleet.verify.report import api_target

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = ROOT / "roles" / "vllm_verify" / "defaults" / "main.yml"
HEALTHY = ROOT / "tests" / "fixtures" / "metrics" / "healthy"
PLAN = {
    "name": "i0",
    "argv": [
        "vllm",
        "serve",
        "/m",
        "--served-model-name",
        "tiny",
        "--max-model-len",
        "4096",
        "--port",
        "8001",
    ],
    "port": 8001,
    "expectations": {"max_model_len": 4096},
}
TARGET = api_target(plan_from_rendered(PLAN, "test plan"))


def test_defaults_are_the_roles() -> None:
    defaults = yaml.safe_load(DEFAULTS.read_text())
    assert " ".join(defaults["vllm_verify_prompt"].split()) == live.DEFAULT_PROMPT
    assert defaults["vllm_verify_max_tokens"] == live.DEFAULT_MAX_TOKENS
    assert defaults["vllm_verify_warmup_requests"] == live.DEFAULT_WARMUP_REQUESTS
    assert defaults["vllm_verify_request_timeout"] == live.DEFAULT_REQUEST_TIMEOUT_S
    assert defaults["vllm_verify_poll_interval"] == live.DEFAULT_POLL_INTERVAL_S


def test_target_at_url_replaces_address_and_port() -> None:
    target = live.target_at(TARGET, "http://10.0.0.5:9000")
    assert (target.address, target.port, target.base_url) == ("10.0.0.5", 9000, "http://10.0.0.5:9000")
    assert live.target_at(TARGET, None).base_url == "http://127.0.0.1:8001"


@pytest.mark.parametrize("url", ["https://h:1", "http://h:1/v1", "h:8000", "http://h:x"])
def test_target_at_rejects_what_it_cannot_reach(url: str) -> None:
    with pytest.raises(FleetInputError, match="--url"):
        live.target_at(TARGET, url)


class _Recorder:
    """A `send` that records the requests and answers like vLLM would."""

    def __init__(self, health: list[int | None] | None = None) -> None:
        self.calls: list[tuple[str, str, dict | None]] = []
        self.health = list(health or [200])

    def __call__(self, method, url, *, body=None, headers=None, timeout_s=0):
        self.calls.append((method, url.split("8001", 1)[1], body))
        if url.endswith("/health"):
            status = self.health.pop(0) if len(self.health) > 1 else self.health[0]
            return {"status": status if status is not None else -1, "content": ""}
        if url.endswith("/metrics"):
            return {"status": 200, "content": 'vllm:cache_config_info{block_size="16"} 1.0\n'}
        if url.endswith("/v1/completions"):
            return {"status": 200, "json": {"usage": {"prompt_tokens": 10, "completion_tokens": 8}}}
        return {"status": 200, "json": {}}


def test_gather_asks_what_the_role_asks_in_its_order() -> None:
    send = _Recorder()
    answers = live.gather(TARGET, live.Request(warmup_requests=3), send)
    paths = [(m, p) for m, p, _ in send.calls]
    assert paths == [
        ("GET", "/health"),
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/completions"),
        ("GET", "/metrics"),
    ]
    first, chat, warm = send.calls[3][2], send.calls[4][2], send.calls[5][2]
    assert first == {"model": "tiny", "prompt": live.DEFAULT_PROMPT, "max_tokens": 8, "temperature": 0}
    assert chat["messages"] == [{"role": "user", "content": live.DEFAULT_PROMPT}]
    # 10 tokens a copy, one 16-token block: two copies span more than a block (report.probe_prompt)
    assert warm["prompt"] == " ".join([live.DEFAULT_PROMPT] * 2) == answers["probe_prompt"]
    assert set(answers["api"]) == {"health", "models", "completion", "chat", "metrics"}
    assert answers["warmup"] == [200, 200, 200]


def test_test_requests_size_the_warmup_prompt_from_the_real_answers() -> None:
    """send_test_requests (the body of the role's vllm_fleet_requests action) over the answers a real vLLM CPU
    server gave in the lab (tests/fixtures/metrics/healthy): 92 prompt tokens per copy and 128-token CPU
    blocks, so two copies (184 tokens) fill one block, and 192 tokens fit a max_model_len of 256."""
    api = json.loads((HEALTHY / "api.json").read_text())
    completion = {"status": 200, "json": json.loads(api["completion"]["content"])}
    before = (HEALTHY / "metrics-before.txt").read_text()
    sent: list[tuple[str, str, dict | None]] = []

    def send(method, url, *, body=None, headers=None, timeout_s=0):
        sent.append((method, url.split("8001", 1)[1], body))
        return completion if url.endswith("/completions") else {"status": 200, "content": "after"}

    request = live.Request(prompt="ab", warmup_requests=2)
    answers = live.send_test_requests(replace(TARGET, max_model_len=256), request, before, send)
    assert [(m, p) for m, p, _ in sent] == [
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/completions"),
        ("GET", "/metrics"),
    ]
    assert answers["probe_prompt"] == "ab ab" == sent[2][2]["prompt"] == sent[3][2]["prompt"]
    assert answers["metrics_before"] == before and answers["metrics_after"] == "after"
    assert answers["warmup"] == [200, 200]
    # too short a max_model_len for two copies: one copy, and no prefix-cache hit is expected
    one = live.send_test_requests(replace(TARGET, max_model_len=150), request, before, send)
    assert one["probe_prompt"] == "ab"


def test_api_key_is_sent_and_never_shown() -> None:
    request = live.Request(api_key="sk-secret")
    assert live._headers(request) == {"Authorization": "Bearer sk-secret"}
    assert "sk-secret" not in repr(request)


def _clock():
    now = [0.0]

    def clock() -> float:
        return now[0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    return clock, sleep


def test_wait_ready_polls_until_health_answers() -> None:
    clock, sleep = _clock()
    send = _Recorder(health=[None, None, 200])
    readiness = live.wait_ready(TARGET, timeout_s=60, send=send, clock=clock, sleep=sleep)
    assert readiness["state"] == "ready" and readiness["polls"] == 3 and "msg" not in readiness


def test_wait_ready_fails_fast_on_a_fatal_log_line(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(
        "ERROR 12-01 10:00:00 [core.py:1] ValueError: To serve at least one request with the models's max "
        "seq len (750000), (91.55 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(10.00 GiB). Based on the available memory, the estimated maximum model length is 81920.\n"
    )
    clock, sleep = _clock()
    readiness = live.wait_ready(
        TARGET, timeout_s=600, log_path=str(log), send=_Recorder([None]), clock=clock, sleep=sleep
    )
    assert readiness["state"] == "crashed" and readiness["polls"] == 1
    assert readiness["errors"][0]["kind"] == "max_model_len_exceeds_kv_cache"
    assert "Fix: lower max_model_len" in readiness["msg"]


def test_wait_ready_times_out() -> None:
    clock, sleep = _clock()
    readiness = live.wait_ready(
        TARGET, timeout_s=10, interval_s=2, send=_Recorder([None]), clock=clock, sleep=sleep
    )
    assert readiness["state"] == "timeout" and readiness["polls"] == 6


def test_wait_ready_engine_dead_is_final() -> None:
    clock, sleep = _clock()
    readiness = live.wait_ready(TARGET, timeout_s=60, send=_Recorder([503]), clock=clock, sleep=sleep)
    assert readiness["state"] == "engine_dead" and readiness["polls"] == 1


class _Handler(BaseHTTPRequestHandler):
    answers: ClassVar[dict[str, tuple[int, str]]] = {}
    seen: ClassVar[list[tuple[str, str, dict | None]]] = []

    def _answer(self, body: dict | None) -> None:
        self.seen.append((self.command, self.path, body))
        status, content = self.answers.get(self.path, (404, '{"error": "not found"}'))
        data = content.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer(None)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        self._answer(json.loads(self.rfile.read(length)))

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()


def test_http_returns_what_uri_registers(server) -> None:
    _Handler.answers = {"/v1/models": (200, '{"data": []}'), "/health": (503, "")}
    base = f"http://127.0.0.1:{server.server_address[1]}"
    assert live.http("GET", f"{base}/v1/models")["json"] == {"data": []}
    assert live.http("GET", f"{base}/health")["status"] == 503
    assert live.http("POST", f"{base}/nope", body={"a": 1})["status"] == 404
    server.shutdown()
    server.server_close()
    assert live.http("GET", f"{base}/health", timeout_s=2)["status"] == -1


def test_load_plan_names_the_file_and_the_fix(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text('{"name": "i0"}')
    assert main(["verify", "--plan", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "--plan" in err and "has no argv" in err and "render --json" in err
    bad.write_text("not json")
    assert main(["verify", "--plan", str(bad)]) == 2
    assert "is not JSON" in capsys.readouterr().err


def test_load_plan_reads_deploys_file_and_render_output_alike(tmp_path: Path) -> None:
    from vllm_fleet.cli.verify import load_plan

    rendered = ROOT / "tests" / "fixtures" / "gpu-h200-vllm-0.26.0" / "seed-dense" / "plan.json"
    plan, target = load_plan(str(rendered))
    deployed = tmp_path / "i0.json"
    deployed.write_text(json.dumps(plan.to_dict()))  # what vllm_service writes: InstancePlan.to_dict()
    again, target_again = load_plan(str(deployed))
    assert target_again == target and again.argv == plan.argv
    assert (target.base_url, target.served_model_name, target.max_model_len) == (
        "http://127.0.0.1:8001",
        "qwen3-27b",
        65536,
    )
    assert target.prefix_caching and target.prefix_caching_explicit and target.spec_decode
    assert again.expectations["kv_cache_tokens"] == 81920 and again.capacity["fits_on_gpu"]
