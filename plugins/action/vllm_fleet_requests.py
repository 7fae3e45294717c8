"""Action plugin: send one vLLM instance's test requests after a (re)start, from the host it runs on.

Thin by design: the requests, their order and the warm-up prompt are
`vllm_fleet.verify.live.send_test_requests` (which `vllm-fleet verify` sends with urllib); here each request
is one call of the stock `ansible.builtin.uri` module on the host, so an instance that listens on loopback is
reached where it runs, but the warm-up requests, one body sent `warmup_requests` times, are one call of
`vllm_fleet_warmup` (a Python start on the host for all of them, not one each: issue 32). One task looped
over a host's instances replaces five tasks included once per instance, which Ansible ran one host after
another (issue 21). The answers come back in the shape `uri` registers (status, content, json); the API key
never does: it is a no_log argument, and each `uri` result is cut to its answer.
"""

from __future__ import annotations

import time
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.host import InstancePlan
from vllm_fleet.verify.live import Request, send_test_requests
from vllm_fleet.verify.progress import WAIT_PROGRESS_INTERVAL_S, requests_progress_line
from vllm_fleet.verify.report import api_target

display = Display()

ARGUMENT_SPEC = {
    # the instance plan and the address to call, as vllm_fleet_wait takes them (the same target)
    "plan": {"type": "dict", "required": True},
    "address": {"type": "str"},
    # the /metrics body read before the requests (vllm_fleet_wait's reads.metrics.content): the KV block size
    "metrics_before": {"type": "str", "default": ""},
    "prompt": {"type": "str", "required": True},
    "max_tokens": {"type": "int", "default": 8},
    "warmup_requests": {"type": "int", "default": 8},
    "timeout": {"type": "int", "default": 120},
    "api_key": {"type": "str", "default": "", "no_log": True},
}
WARMUP_MODULE = "vllm_fleet.serving.vllm_fleet_warmup"
# what a request's answer keeps of the uri module's result (not its invocation: that holds the headers)
ANSWER_KEYS = ("status", "content", "json", "msg", "url")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(ARGUMENT_SPEC)
        try:
            target = api_target(InstancePlan.from_dict(args["plan"]), address=args["address"])
        except FleetInputError as exc:
            raise AnsibleActionFail(f"vllm_fleet_requests: {exc}") from exc
        request = Request(
            prompt=args["prompt"],
            max_tokens=args["max_tokens"],
            warmup_requests=args["warmup_requests"],
            timeout_s=args["timeout"],
            api_key=args["api_key"],
        )
        host = task_vars.get("inventory_hostname", "?")
        started = last_line = time.monotonic()
        answered = 0

        def send(
            method: str,
            url: str,
            *,
            body: dict[str, Any] | None = None,
            headers: dict[str, str] | None = None,
            timeout_s: float,
        ) -> dict[str, Any]:
            uri_args: dict[str, Any] = {
                "url": url,
                "method": method,
                "return_content": True,
                "timeout": int(timeout_s),
                # like `failed_when: false`: an HTTP error status is an answer, judged by build_report
                "status_code": list(range(100, 600)),
            }
            if headers:
                uri_args["headers"] = headers
            if body is not None:
                uri_args.update(body=body, body_format="json")
            res = self._execute_module(
                module_name="ansible.builtin.uri", module_args=uri_args, task_vars=task_vars
            )
            answer = {key: res[key] for key in ANSWER_KEYS if key in res}
            answer.setdefault("status", -1)
            nonlocal answered, last_line
            answered += 1
            # a line at least every interval plus one request's time
            if time.monotonic() - last_line >= WAIT_PROGRESS_INTERVAL_S:
                last_line = time.monotonic()
                elapsed, status = last_line - started, answer["status"]
                display.display(requests_progress_line(host, target.instance, answered, elapsed, status))
            return answer

        def send_warmup(url: str, body: dict[str, Any], count: int) -> list[int]:
            warmup_args = {
                "url": url,
                "body": body,
                "count": count,
                "api_key": args["api_key"],
                "timeout": args["timeout"],
            }
            res = self._execute_module(
                module_name=WARMUP_MODULE, module_args=warmup_args, task_vars=task_vars
            )
            nonlocal answered
            answered += count
            # skipped (check mode) or failed: no answer, as a skipped uri call gives none
            return list(res.get("statuses") or [-1] * count)

        answers = send_test_requests(target, request, args["metrics_before"], send, send_warmup)
        result.update(changed=False, **answers)
        return result
