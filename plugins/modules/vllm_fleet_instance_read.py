#!/usr/bin/python
"""One read of a vLLM instance on its host: the unit's state, /health and, once it answers 200, the journal of
the current start, /v1/models and /metrics. The readiness wait polls with it, and its last answer is what
verify checks, so an instance that was not restarted costs one round trip (issue 21). A read that finds the
instance loading may hold: read again on the host every `interval` seconds until it answers, its unit
changes or `hold` seconds pass, so a wait costs a round trip (a Python start on the host) per `hold`
seconds, not per poll (issue 32). Nothing is decided here: the controller reads the answers
(vllm_fleet.verify.hostread)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

DOCUMENTATION = r"""
---
module: vllm_fleet_instance_read
short_description: The state of one vLLM instance (unit, /health, journal, /v1/models, /metrics) in one call
description:
  - One C(systemctl show) of O(unit) (the properties of O(properties)), then C(GET) of O(base_url)C(/health).
  - When O(checks) is true and C(/health) answered 200, also the journal of the current
    start (O(journal_argv) followed by C(_SYSTEMD_INVOCATION_ID=) the unit's InvocationID), C(GET /v1/models)
    (with O(api_key) as a Bearer token) and C(GET /metrics), what a check of a running instance needs, in the
    same round trip as the readiness poll.
  - With an empty O(base_url) (a headless rank of a multi-host instance, which has no API), the journal of
    the current start once the unit is active, whatever O(checks) says, since that journal is the rank's
    readiness.
  - With O(hold) above 0, a read that finds the instance loading (the unit activating or active, C(/health)
    not 200) reads the unit and C(/health) again every O(interval) seconds, for up to O(hold) seconds, and
    answers as soon as C(/health) answers 200 or the unit's ActiveState, SubState, InvocationID, NRestarts or
    MainPID changes, with the last read (and its checks, when ready).
  - Used by the P(vllm_fleet.serving.vllm_fleet_wait#module) action, which decides on the controller
    (C(vllm_fleet.verify.hostread)). Changes nothing on the host.
version_added: "0.1.0"
options:
  unit:
    description: The instance's systemd unit.
    type: str
    required: true
  properties:
    description: The C(systemctl show) properties to read.
    type: list
    elements: str
    required: true
  base_url:
    description: Where the instance's API answers, from the host (C(http://127.0.0.1:8000)).
    type: str
    required: true
  checks:
    description: Also read the journal, C(/v1/models) and C(/metrics) when the instance is ready.
    type: bool
    default: false
  journal_argv:
    description: The journalctl command the current start's match is appended to.
    type: list
    elements: str
    default: []
  api_key:
    description: Sent to C(/v1/models) as an C(Authorization) Bearer header; never returned.
    type: str
    default: ""
  request_timeout:
    description: Seconds the C(/health) request may take.
    type: int
    default: 5
  checks_timeout:
    description: Seconds the C(/v1/models) and C(/metrics) requests may take.
    type: int
    default: 120
  hold:
    description: Seconds a read that finds the instance loading may go on reading; 0 answers at once.
    type: float
    default: 0
  interval:
    description: Seconds between two reads while it holds.
    type: float
    default: 2
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
author:
  - vllm-fleet
"""

EXAMPLES = r"""
- name: Read instance i0 in one call
  vllm_fleet.serving.vllm_fleet_instance_read:
    unit: vllm-fleet-i0.service
    properties: [ActiveState, SubState, Result, NRestarts, InvocationID, MainPID, ExecMainStatus, LoadState]
    base_url: http://127.0.0.1:8000
    checks: true
    journal_argv: [journalctl, --no-pager, -o, json, "--output-fields=MESSAGE,_PID,_STREAM_ID"]
"""

RETURN = r"""
unit_show:
  description: The C(systemctl show) text.
  type: str
  returned: always
health:
  description: C(status) (-1 without an answer) and C(msg) of C(GET /health).
  type: dict
  returned: always
journal:
  description: C(rc) and C(stdout) of the journal of the current start; C({}) when not read.
  type: dict
  returned: always
models:
  description: C(status), C(msg) and C(content) of C(GET /v1/models); C({}) when not read.
  type: dict
  returned: always
metrics:
  description: C(status), C(msg) and C(content) of C(GET /metrics); C({}) when not read.
  type: dict
  returned: always
reads:
  description: How many times the unit and C(/health) were read (more than 1 when it held).
  type: int
  returned: always
"""

# what a start in progress keeps until it is ready, crashes or restarts: a change of one ends a hold
HELD_PROPERTIES = ("ActiveState", "SubState", "InvocationID", "NRestarts", "MainPID")
LOADING_STATES = ("activating", "active")


def show_props(text: str) -> dict[str, str]:
    """`KEY=value` lines of `systemctl show` as a dict."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def http_get(url: str, timeout: int, headers: dict[str, str] | None = None, opener=open_url) -> dict:
    """status, msg and content of one GET, as ansible.builtin.uri reports them (-1: no answer)."""
    try:
        resp = opener(url, headers=headers or {}, timeout=timeout, follow_redirects="none")
        return {"status": resp.getcode(), "msg": "OK", "content": resp.read().decode("utf-8", "replace")}
    except Exception as exc:  # HTTPError, URLError, socket errors: each is an answer to record
        code = getattr(exc, "code", None)
        if isinstance(code, int):
            body = exc.read().decode("utf-8", "replace") if hasattr(exc, "read") else ""
            return {"status": code, "msg": str(exc), "content": body}
        return {"status": -1, "msg": f"{type(exc).__name__}: {exc}", "content": ""}


def _journal(params: dict, props: dict, run) -> dict:
    """The journal of the unit's current start ({} without an invocation id or a journal command)."""
    if not (params["journal_argv"] and props.get("InvocationID")):
        return {}
    argv = [*params["journal_argv"], f"_SYSTEMD_INVOCATION_ID={props['InvocationID']}"]
    journal = run(argv, capture_output=True, text=True, check=False)
    return {"rc": journal.returncode, "stdout": journal.stdout}


def read_instance(
    params: dict, run=subprocess.run, get=http_get, clock=time.monotonic, sleep=time.sleep
) -> dict:
    """The instance's reads, in the order a poll needs them (see the module's description)."""
    until = clock() + (params.get("hold") or 0)
    out, props = _unit_and_health(params, run, get)
    started, reads = _held(props), 1
    while _loading(out, props) and _held(props) == started and clock() + params["interval"] <= until:
        sleep(params["interval"])
        out, props = _unit_and_health(params, run, get)
        reads += 1
    out["reads"] = reads
    if out.get("failed") or props.get("LoadState") == "not-found":
        return out
    base = params["base_url"].rstrip("/")
    if not base:
        # a headless rank of a multi-host instance: no API; once its unit runs, its journal is the read, and
        # its readiness too (its workers' `rank R in world size N` line), so it is read without O(checks)
        if props.get("ActiveState") == "active":
            out["journal"] = _journal(params, props, run)
        return out
    if not (params["checks"] and out["health"]["status"] == 200):
        return out
    out["journal"] = _journal(params, props, run)
    headers = {"Authorization": f"Bearer {params['api_key']}"} if params["api_key"] else {}
    out["models"] = get(f"{base}/v1/models", params["checks_timeout"], headers)
    out["metrics"] = get(f"{base}/metrics", params["checks_timeout"])
    return out


def _unit_and_health(params: dict, run, get) -> tuple[dict, dict[str, str]]:
    """One `systemctl show` of the unit and, for an instance with an API whose unit exists, its /health."""
    show = run(
        ["systemctl", "show", "-p", ",".join(params["properties"]), "--", params["unit"]],
        capture_output=True,
        text=True,
        check=False,
    )
    if show.returncode != 0:
        return {"failed": True, "msg": f"systemctl show {params['unit']} failed: {show.stderr.strip()}"}, {}
    props = show_props(show.stdout)
    out = {"unit_show": show.stdout, "health": {}, "journal": {}, "models": {}, "metrics": {}}
    base = params["base_url"].rstrip("/")
    if base and props.get("LoadState") != "not-found":
        health = get(f"{base}/health", params["request_timeout"])
        out["health"] = {"status": health["status"], "msg": health["msg"]}
    return out, props


def _loading(out: dict, props: dict[str, str]) -> bool:
    """An instance with an API still on its way up: its unit starting or running, /health not yet 200."""
    health = out.get("health") or {}
    return bool(health) and health["status"] != 200 and props.get("ActiveState") in LOADING_STATES


def _held(props: dict[str, str]) -> tuple:
    return tuple(props.get(name) for name in HELD_PROPERTIES)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "properties": {"type": "list", "elements": "str", "required": True},
            "base_url": {"type": "str", "required": True},
            "checks": {"type": "bool", "default": False},
            "journal_argv": {"type": "list", "elements": "str", "default": []},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "request_timeout": {"type": "int", "default": 5},
            "checks_timeout": {"type": "int", "default": 120},
            "hold": {"type": "float", "default": 0},
            "interval": {"type": "float", "default": 2},
        },
        supports_check_mode=True,
    )
    out = read_instance(module.params)
    if out.pop("failed", False):
        module.fail_json(msg=out["msg"])
    # a models answer that is JSON is returned parsed as well, like ansible.builtin.uri does
    if out["models"].get("content"):
        with contextlib.suppress(ValueError):
            out["models"]["json"] = json.loads(out["models"]["content"])
    module.exit_json(changed=False, **out)


if __name__ == "__main__":
    main()
