"""Action plugin: take one vLLM instance out of the gateway and wait until it is drained, or put it back.

Thin by design: the task runs on the gateway host (`delegate_to`); every poll is one `command` there running
`vllm_fleet.gateway.drain.READ_SCRIPT` (HAProxy's runtime API on its local socket, then the instance's
/metrics), and `vllm_fleet.gateway.drain` names the server and decides when it is drained.
"""

from __future__ import annotations

import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from vllm_fleet.errors import FleetInputError
from vllm_fleet.gateway.drain import (
    UNKNOWN_SERVER,
    Read,
    drain_argv,
    drain_target,
    drain_verdict,
    parse_drain,
    parse_read,
    read_argv,
    server_row,
)
from vllm_fleet.plan.host import InstancePlan

ARGUMENT_SPEC = {
    "plan": {"type": "dict", "required": True},
    "instance_set": {"type": "str", "default": "long"},
    "host_address": {"type": "str", "required": True},
    "gateway_host": {"type": "str"},
    "state": {"type": "str", "choices": ["drain", "ready"], "required": True},
    "socket": {"type": "path", "default": "/run/haproxy/admin.sock"},
    "timeout": {"type": "int", "default": 300},
    "interval": {"type": "float", "default": 1.0},
    "python": {"type": "path", "default": "/usr/bin/python3"},
}
display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def _on_gateway(self, args: dict, argv: list[str], task_vars: dict) -> str:
        """One script run on the gateway host (this task is delegated there): its stdout."""
        res = self._execute_module(
            module_name="ansible.builtin.command", module_args={"argv": argv}, task_vars=task_vars
        )
        if res.get("rc") != 0:
            raise AnsibleActionFail(
                f"vllm_fleet_gateway_server: the gateway's runtime API at {args['socket']} did not answer: "
                f"{(res.get('stderr') or res.get('msg') or '')[-500:]}"
            )
        return res.get("stdout", "")

    def _read(self, args: dict, commands: list[str], metrics_url: str, task_vars: dict):
        argv = read_argv(args["python"], args["socket"], commands, metrics_url)
        return parse_read(self._on_gateway(args, argv, task_vars))

    def _drain(self, args: dict, target, task_vars: dict) -> Read:
        """Drain the server once another one that takes its requests is UP (the drain script decides, under
        the gateway's lock), waiting up to the timeout; answered as the first read of a `ready` is."""
        argv = drain_argv(args["python"], args["socket"], target)
        start = next_line = time.monotonic()
        while True:
            drain = parse_drain(self._on_gateway(args, argv, task_vars))
            if drain.no_socket or drain.drained:
                return Read([drain.reply], None, "", drain.no_socket)
            others = ", ".join(f"{name} {status}" for name, status in drain.others.items())
            waited = time.monotonic() - start
            if waited >= args["timeout"]:
                raise AnsibleActionFail(
                    f"vllm_fleet_gateway_server: {target.backend}/{target.server} was not drained: no other "
                    f"server that takes its requests came back in service within {args['timeout']} s "
                    f"({others}), and draining it too would leave the gateway nothing to send them to; "
                    "restart the hosts one at a time (playbooks/rollout.yml), bring the others back, or "
                    "raise vllm_service_drain_timeout"
                )
            if time.monotonic() >= next_line:
                next_line = time.monotonic() + 10
                display.display(
                    f"{target.backend}/{target.server}: waiting for another server to be in service before "
                    f"it leaves the gateway, {waited:.0f} s of {args['timeout']} s ({others})"
                )
            time.sleep(args["interval"])

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(ARGUMENT_SPEC)
        try:
            plan = InstancePlan.from_dict(args["plan"])
            target = drain_target(plan, args["instance_set"], args["host_address"], args["gateway_host"])
            if args["state"] == "drain":
                first = self._drain(args, target, task_vars)
            else:
                first = self._read(args, [target.command(args["state"])], "", task_vars)
        except FleetInputError as exc:
            raise AnsibleActionFail(f"vllm_fleet_gateway_server: {exc}") from exc
        result.update(backend=target.backend, server=target.server, state=args["state"])
        if first.no_socket:
            # no gateway installed yet (site.yml deploys the instances before the gateway): nothing to leave
            result.update(changed=False, behind_gateway=False, verdict="no gateway running")
            return result
        reply = first.replies[0].strip()
        if reply.startswith(UNKNOWN_SERVER):
            # not behind this gateway (a config generated without it): vLLM's --shutdown-timeout still drains
            result.update(changed=False, behind_gateway=False, reply=reply, verdict="not behind the gateway")
            return result
        if reply:
            raise AnsibleActionFail(
                f"vllm_fleet_gateway_server: the gateway refused `{target.command(args['state'])}`: {reply}"
            )
        result.update(changed=True, behind_gateway=True)
        if args["state"] == "ready":
            return result
        start = time.monotonic()
        while True:
            read = self._read(args, ["show stat"], target.metrics_url, task_vars)
            try:
                verdict = drain_verdict(
                    server_row(read.replies[0], target), read, time.monotonic() - start, args["timeout"]
                )
            except FleetInputError as exc:
                raise AnsibleActionFail(f"vllm_fleet_gateway_server: {exc}") from exc
            if verdict.final:
                break
            time.sleep(args["interval"])
        if verdict.state == "timeout":
            # the restart goes on: vLLM's --shutdown-timeout finishes what is left
            display.warning(f"{target.server}: {verdict.reason}; restarting, vLLM drains what is left")
        waited = round(time.monotonic() - start, 1)
        result.update(verdict=verdict.state, reason=verdict.reason, waited_s=waited)
        result.update(scur=verdict.scur, running=verdict.running, waiting=verdict.waiting)
        return result
