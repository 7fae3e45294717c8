"""Action plugin: send one vLLM instance's test requests after a (re)start, from the host it runs on.

Thin by design: the requests, their order and the warm-up prompt are
`vllm_fleet.verify.live.send_test_requests` (which `vllm-fleet verify` sends with urllib); here each of its
two batches (the completion and the chat; the warm-up requests and the /metrics scrape) is one call of the
module `vllm_fleet_http` on the host, so an instance that listens on loopback is reached where it runs, with
one Python start there per batch instead of one per request (issue 32). One task looped over a host's
instances replaces five tasks included once per instance, which Ansible ran one host after another (issue
21). The answers come back in the shape `ansible.builtin.uri` registers (status, content, json); the API key
never does: it is a no_log argument, and each answer is cut to ANSWER_KEYS.
"""

from __future__ import annotations

import time
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.host import InstancePlan
from vllm_fleet.verify.live import Call, Request, send_test_requests
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
HTTP_MODULE = "vllm_fleet.serving.vllm_fleet_http"
# what a request's answer keeps of the module's (as of a uri result: no invocation, which holds the key)
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

        def send_batch(calls: list[Call]) -> list[dict[str, Any]]:
            http_args = {
                "requests": [
                    {"method": c.method, "url": c.url, "auth": c.auth}
                    | ({"body": c.body} if c.body is not None else {})
                    for c in calls
                ],
                "api_key": args["api_key"],
                "timeout": args["timeout"],
            }
            res = self._execute_module(module_name=HTTP_MODULE, module_args=http_args, task_vars=task_vars)
            # skipped (check mode) or failed: no answer, as a skipped uri call gives none
            answers = res.get("answers") or [{"status": -1, "msg": res.get("msg", "")}] * len(calls)
            nonlocal answered, last_line
            answered += len(calls)
            # a line at least every interval plus one batch's time
            if time.monotonic() - last_line >= WAIT_PROGRESS_INTERVAL_S:
                last_line = time.monotonic()
                elapsed, status = last_line - started, answers[-1]["status"]
                display.display(requests_progress_line(host, target.instance, answered, elapsed, status))
            return [{key: answer[key] for key in ANSWER_KEYS if key in answer} for answer in answers]

        answers = send_test_requests(target, request, args["metrics_before"], send_batch=send_batch)
        result.update(changed=False, **answers)
        return result
