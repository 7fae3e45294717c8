#!/usr/bin/python
"""verify's warm-up requests in one call on the host: one JSON body POSTed `count` times to a vLLM instance,
one after another, each answer's status kept. Each was an `ansible.builtin.uri` call of its own, a Python
start on the host and a round trip per request (issue 32). Nothing is decided here: the statuses go back to
the controller (vllm_fleet.verify.live.send_test_requests)."""

from __future__ import annotations

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

DOCUMENTATION = r"""
---
module: vllm_fleet_warmup
short_description: POST one JSON body to a vLLM instance several times, from its host, in one call
description:
  - POSTs O(body) as JSON to O(url) O(count) times, one request after the other, with O(api_key) as a Bearer
    token when given, and returns each answer's HTTP status (-1 where none came).
  - Used by the P(vllm_fleet.serving.vllm_fleet_requests#module) action for verify's warm-up requests (the
    prompt that fills a KV block, sent again so that prefix caching hits), which the instance's /metrics are
    then read against. Changes nothing on the host.
version_added: "0.1.0"
options:
  url:
    description: Where to POST, from the host (C(http://127.0.0.1:8000/v1/completions)).
    type: str
    required: true
  body:
    description: The JSON body of every request.
    type: dict
    required: true
  count:
    description: How many requests to send.
    type: int
    required: true
  api_key:
    description: Sent as an C(Authorization) Bearer header; never returned.
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
- name: Send eight warm-up completions to instance i0
  vllm_fleet.serving.vllm_fleet_warmup:
    url: http://127.0.0.1:8000/v1/completions
    body: {model: tiny, prompt: "Hello there. Hello there.", max_tokens: 8, temperature: 0}
    count: 8
"""

RETURN = r"""
statuses:
  description: The HTTP status of each request, in order; -1 where no answer came.
  type: list
  elements: int
  returned: always
msg:
  description: Why the last request without an answer got none; empty when every request was answered.
  type: str
  returned: always
"""


def post_repeatedly(params: dict, opener=open_url) -> dict:
    """{"statuses": [...], "msg": ...} of `count` POSTs of the same body (see the module's description)."""
    headers = {"Content-Type": "application/json"}
    if params["api_key"]:
        headers["Authorization"] = f"Bearer {params['api_key']}"
    data = json.dumps(params["body"])
    statuses, msg = [], ""
    for _ in range(params["count"]):
        try:
            resp = opener(
                params["url"],
                data=data,
                method="POST",
                headers=headers,
                timeout=params["timeout"],
                follow_redirects="none",
            )
            resp.read()
            statuses.append(resp.getcode())
        except Exception as exc:  # HTTPError is an answer; URLError and socket errors are none
            code = getattr(exc, "code", None)
            if isinstance(code, int):
                statuses.append(code)
            else:
                statuses.append(-1)
                msg = f"{type(exc).__name__}: {exc}"
    return {"statuses": statuses, "msg": msg}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "body": {"type": "dict", "required": True},
            "count": {"type": "int", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "timeout": {"type": "int", "default": 120},
        },
        supports_check_mode=False,
    )
    module.exit_json(changed=False, **post_repeatedly(module.params))


if __name__ == "__main__":
    main()
