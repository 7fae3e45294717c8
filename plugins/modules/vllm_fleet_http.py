#!/usr/bin/python
"""verify's test requests in one call on the host: a list of HTTP requests to a vLLM instance, sent one after
another, each answer kept as `ansible.builtin.uri` registers it. Each request was a `uri` call of its own, a
Python start on the host and a round trip per request (issue 32). Nothing is decided here: the answers go
back to the controller (vllm_fleet.verify.live.send_test_requests)."""

from __future__ import annotations

import contextlib
import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

DOCUMENTATION = r"""
---
module: vllm_fleet_http
short_description: Send a list of HTTP requests to a vLLM instance, from its host, in one call
description:
  - Sends each of O(requests) in order, one after the other, and returns each answer as
    M(ansible.builtin.uri) registers it with C(return_content) (C(status), C(content), C(json) when the body
    is a JSON object or list, C(msg), C(url)); an HTTP error status is an answer, a request that got none
    has status -1.
  - Used by the P(vllm_fleet.serving.vllm_fleet_requests#module) action for verify's test requests (a
    completion and a chat, then the warm-up prompt several times and the /metrics they are read against,
    in two calls). Changes nothing on the host.
version_added: "0.1.0"
options:
  requests:
    description: The requests, in the order they are sent.
    type: list
    elements: dict
    required: true
    suboptions:
      method:
        description: The HTTP method.
        type: str
        choices: [GET, POST]
        default: GET
      url:
        description: Where to send it, from the host (C(http://127.0.0.1:8000/v1/completions)).
        type: str
        required: true
      body:
        description: A JSON body (POST).
        type: dict
      auth:
        description: Send O(api_key) as an C(Authorization) Bearer header.
        type: bool
        default: false
  api_key:
    description: The instance's API key, for the requests with O(requests[].auth); never returned.
    type: str
    default: ""
  timeout:
    description: Seconds each request may take.
    type: int
    default: 120
attributes:
  check_mode:
    support: none
    details: Skipped in check mode, as C(ansible.builtin.uri) is.
  diff_mode:
    support: none
author:
  - vllm-fleet
"""

EXAMPLES = r"""
- name: Send eight warm-up completions to instance i0, then read its metrics
  vllm_fleet.serving.vllm_fleet_http:
    requests: >-
      {{ [{'method': 'POST', 'url': 'http://127.0.0.1:8000/v1/completions', 'auth': true,
           'body': {'model': 'tiny', 'prompt': 'Hello there. Hello there.', 'max_tokens': 8}}] * 8
         + [{'url': 'http://127.0.0.1:8000/metrics'}] }}
    api_key: "{{ vllm_service_api_key }}"
"""

RETURN = r"""
answers:
  description: One answer per request, in order, as M(ansible.builtin.uri) returns it.
  type: list
  elements: dict
  returned: always
  contains:
    status:
      description: The HTTP status; -1 where no answer came.
      type: int
    content:
      description: The body of the answer.
      type: str
    json:
      description: The body parsed, when it is a JSON object or list.
      type: raw
    msg:
      description: Why no answer came, or the status line.
      type: str
    url:
      description: The URL the request went to.
      type: str
"""


def send_all(params: dict, opener=open_url) -> list[dict]:
    """The answers of `params["requests"]` (see the module's description)."""
    return [send_one(request, params["api_key"], params["timeout"], opener) for request in params["requests"]]


def send_one(request: dict, api_key: str, timeout: int, opener=open_url) -> dict:
    headers = {}
    data = None
    if request.get("body") is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(request["body"])
    if request.get("auth") and api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    url = request["url"]
    try:
        resp = opener(
            url,
            data=data,
            method=request.get("method") or "GET",
            headers=headers,
            timeout=timeout,
            follow_redirects="none",
        )
        status, msg = resp.getcode(), f"OK ({resp.getcode()})"
    except Exception as exc:  # HTTPError is an answer (it has a code and a body); others are none
        status = getattr(exc, "code", None)
        if not isinstance(status, int):
            return {"status": -1, "msg": f"{type(exc).__name__}: {exc}", "url": url}
        resp, msg = exc, f"HTTP Error {status}"
    content = resp.read().decode("utf-8", errors="replace")
    answer = {"status": status, "content": content, "msg": msg, "url": url}
    if content.lstrip().startswith(("{", "[")):  # as vllm_fleet.verify.live.http decides
        with contextlib.suppress(ValueError):
            answer["json"] = json.loads(content)
    return answer


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "requests": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "method": {"type": "str", "choices": ["GET", "POST"], "default": "GET"},
                    "url": {"type": "str", "required": True},
                    "body": {"type": "dict"},
                    "auth": {"type": "bool", "default": False},
                },
            },
            "api_key": {"type": "str", "default": "", "no_log": True},
            "timeout": {"type": "int", "default": 120},
        },
        supports_check_mode=False,
    )
    module.exit_json(changed=False, answers=send_all(module.params))


if __name__ == "__main__":
    main()
