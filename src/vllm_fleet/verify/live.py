"""The HTTP side of `vllm-fleet verify`: ask a running vLLM what the vllm_verify role asks, with urllib only.

The role reads an instance in its readiness wait and sends the test requests with `send_test_requests`
through the module vllm_fleet_http on the host (the vllm_fleet_requests action); this module gathers the same
answers, in the same order and shape (`status`, `content`, `json`: what `uri` registers), with urllib, for a
vLLM that runs under no systemd unit of this toolkit (a container, another supervisor, a GPU host without
systemd). The verdict is `vllm_fleet.verify.report.build_report`'s in both cases.

    answers = gather(target, Request())           # what the role's wait and vllm_fleet_requests read
    readiness = wait_ready(target, timeout_s=600, log_path=..., pid=...)
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from vllm_fleet.errors import FleetInputError
from vllm_fleet.verify.logcheck import parse_log
from vllm_fleet.verify.report import (
    ApiTarget,
    Readiness,
    UnitState,
    cache_block_size,
    classify_readiness,
    crash_message,
    log_errors,
    probe_prompt,
)

# The vllm_verify role's defaults (roles/vllm_verify/defaults/main.yml); a unit test keeps them equal.
DEFAULT_PROMPT = (
    "vllm-fleet verification request. The quick brown fox jumps over the lazy dog while the fleet checks "
    "its cache, its answers and its latency."
)
DEFAULT_MAX_TOKENS = 8
DEFAULT_WARMUP_REQUESTS = 8
DEFAULT_REQUEST_TIMEOUT_S = 120
DEFAULT_POLL_INTERVAL_S = 2.0


@dataclass(frozen=True)
class Request:
    """What the test requests send (the role's vllm_verify_prompt, _max_tokens, _warmup_requests, ...)."""

    prompt: str = DEFAULT_PROMPT
    max_tokens: int = DEFAULT_MAX_TOKENS
    warmup_requests: int = DEFAULT_WARMUP_REQUESTS
    timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    api_key: str = ""

    def __repr__(self) -> str:  # the key never reaches a log or a report
        return (
            f"Request(max_tokens={self.max_tokens}, warmup_requests={self.warmup_requests}, "
            f"timeout_s={self.timeout_s}, api_key={'***' if self.api_key else ''!r})"
        )


def target_at(target: ApiTarget, url: str | None) -> ApiTarget:
    """The plan's target, reached at `url` (`--url http://host:port`) instead of the plan's address."""
    if not url:
        return target
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise FleetInputError(
            f"--url {url!r}: give the vLLM server's base URL as http://HOST:PORT (https and paths are not "
            "supported: vLLM serves plain HTTP unless put behind a proxy)"
        )
    if parts.path not in ("", "/"):
        raise FleetInputError(f"--url {url!r}: give the base URL without a path (e.g. http://{parts.netloc})")
    try:
        port = parts.port or 80
    except ValueError as exc:
        raise FleetInputError(f"--url {url!r}: the port is not a number") from exc
    return replace(target, address=parts.hostname, port=port)


def http(
    method: str,
    url: str,
    *,
    body: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
) -> dict[str, Any]:
    """One request; the answer as `ansible.builtin.uri` registers it: status (-1: no answer), content, json.

    Like `uri` with `failed_when: false`, an HTTP error status is an answer, not an exception.
    """
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        req.add_header(key, value)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return {"status": -1, "content": "", "msg": f"{method} {url}: {reason}", "url": url}
    content = raw.decode("utf-8", "replace")
    answer: dict[str, Any] = {"status": status, "content": content, "url": url}
    if content.lstrip().startswith(("{", "[")):
        with contextlib.suppress(ValueError):
            answer["json"] = json.loads(content)
    return answer


def _headers(request: Request) -> dict[str, str]:
    return {"Authorization": f"Bearer {request.api_key}"} if request.api_key else {}


def _prompt_tokens(answer: Mapping[str, Any]) -> int:
    body = answer.get("json")
    usage = body.get("usage") if isinstance(body, dict) else None
    return int(usage.get("prompt_tokens") or 0) if isinstance(usage, dict) else 0


def gather(
    target: ApiTarget,
    request: Request,
    send: Callable[..., dict[str, Any]] = http,
) -> dict[str, Any]:
    """Every answer verify checks, in the role's order, keyed as build_report reads: the reads the role's
    readiness wait makes once the instance is ready (/health, /v1/models, /metrics), then
    `send_test_requests`.

    Returns `{"api": {health, models, completion, chat, metrics}, "metrics_before", "metrics_after",
    "warmup": [statuses], "probe_prompt"}`.
    """
    base, timeout, auth = target.base_url, request.timeout_s, _headers(request)
    health = send("GET", f"{base}/health", timeout_s=timeout)
    models = send("GET", f"{base}/v1/models", headers=auth, timeout_s=timeout)
    before = send("GET", f"{base}/metrics", timeout_s=timeout)
    answers = send_test_requests(target, request, before.get("content") or "", send)
    answers["api"] = {"health": health, "models": models, **answers["api"]}
    return answers


@dataclass(frozen=True)
class Call:
    """One of the test requests: what `send` is given, the API key sent where `auth`."""

    method: str
    url: str
    body: dict[str, Any] | None = None
    auth: bool = False


def one_by_one(
    request: Request, send: Callable[..., dict[str, Any]] = http
) -> Callable[[list[Call]], list[dict[str, Any]]]:
    """A `send_batch` that sends each call through `send` (the CLI's urllib), one after another."""
    auth = _headers(request)

    def send_batch(calls: list[Call]) -> list[dict[str, Any]]:
        return [
            send(
                call.method,
                call.url,
                body=call.body,
                headers=auth if call.auth else None,
                timeout_s=request.timeout_s,
            )
            for call in calls
        ]

    return send_batch


def send_test_requests(
    target: ApiTarget,
    request: Request,
    metrics_before: str,
    send: Callable[..., dict[str, Any]] = http,
    send_batch: Callable[[list[Call]], list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The test requests after a (re)start: a completion, a chat completion, the warm-up load on a prompt
    that spans a KV block (prefix-cache hits, TTFT), then the /metrics scrape they are measured against.
    They go in two batches, `send_batch(calls) -> answers`: the completion and the chat, then (the warm-up
    prompt sized from the completion's answer) the warm-up requests and the scrape. The CLI sends each call
    with `http` (`one_by_one`, the default); the role's vllm_fleet_requests action sends each batch as one
    call of the module vllm_fleet_http on the host (one Python start there per batch).

    Returns `{"api": {completion, chat, metrics}, "metrics_before", "metrics_after", "warmup": [statuses],
    "probe_prompt"}`.
    """
    batch = send_batch or one_by_one(request, send)
    base = target.base_url

    def completion(prompt: str) -> Call:
        body = {
            "model": target.served_model_name,
            "prompt": prompt,
            "max_tokens": request.max_tokens,
            "temperature": 0,
        }
        return Call("POST", f"{base}/v1/completions", body, auth=True)

    chat_body = {
        "model": target.served_model_name,
        "messages": [{"role": "user", "content": request.prompt}],
        "max_tokens": request.max_tokens,
        "temperature": 0,
    }
    first, chat = batch(
        [completion(request.prompt), Call("POST", f"{base}/v1/chat/completions", chat_body, True)]
    )
    # The prompt repeated to span more than one KV block: prefix caching hits whole blocks only.
    probe = probe_prompt(
        request.prompt,
        _prompt_tokens(first),
        cache_block_size(metrics_before),
        target.max_model_len,
        request.max_tokens,
    )
    *warmup, after = batch([completion(probe)] * request.warmup_requests + [Call("GET", f"{base}/metrics")])
    return {
        "api": {"completion": first, "chat": chat, "metrics": after},
        "metrics_before": metrics_before,
        "metrics_after": after.get("content") or "",
        "warmup": [answer.get("status") for answer in warmup],
        "probe_prompt": probe,
    }


# ------------------------------------------------------------------------------------------- readiness

# No systemd here: the process is taken to be running, so only /health (and a fatal line in the log, or
# the process gone) tells a loading server from a dead one. classify_readiness then decides exactly as it
# does for a unit that systemd reports active.
_RUNNING = UnitState(active_state="active", sub_state="running")


def _alive(pid: int | None) -> bool:
    if not pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_log(path: str | None) -> str:
    """The log file's text ('' when it does not exist yet: a server still starting may not have written)."""
    if not path:
        return ""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise FleetInputError(f"--log: cannot read {path!r}: {exc.strerror}") from exc


def health_status(
    target: ApiTarget, timeout_s: float, send: Callable[..., dict[str, Any]] = http
) -> int | None:
    status = send("GET", f"{target.base_url}/health", timeout_s=timeout_s).get("status")
    return status if isinstance(status, int) and status > 0 else None


def wait_ready(
    target: ApiTarget,
    *,
    timeout_s: float,
    interval_s: float = DEFAULT_POLL_INTERVAL_S,
    log_path: str | None = None,
    pid: int | None = None,
    send: Callable[..., dict[str, Any]] = http,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Poll /health until ready, dead or `timeout_s`; the readiness dict build_report takes.

    Fail fast like the role's vllm_fleet_wait: a fatal line in the log (or the process `pid` gone) while
    /health does not answer means the start died, and the message carries vLLM's own line and the fix.
    """
    start = clock()
    polls = 0
    while True:
        polls += 1
        status = health_status(target, min(5.0, max(interval_s, 1.0)), send)
        verdict = classify_readiness(_RUNNING, None, status)
        if status is None:
            text = read_log(log_path)
            fatal = log_errors(parse_log(text)) if text else []
            if fatal or not _alive(pid):
                why = "the process exited" if not _alive(pid) else "the log shows a fatal error"
                verdict = Readiness("crashed", f"{why} and {target.base_url} does not answer")
        if verdict.final:
            break
        if clock() - start >= timeout_s:
            verdict = Readiness("timeout", f"not ready within {timeout_s:.0f} s ({verdict.reason})")
            break
        sleep(interval_s)
    waited = round(clock() - start, 1)
    readiness: dict[str, Any] = {
        "state": verdict.state,
        "reason": verdict.reason,
        "waited_s": waited,
        "timeout": timeout_s,
        "polls": polls,
    }
    if verdict.state != "ready":
        msg, errors = crash_message(target.base_url, verdict, read_log(log_path), waited)
        readiness.update(msg=msg, errors=errors)
    return readiness
