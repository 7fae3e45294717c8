"""Action plugin: wait until a vLLM instance answers /health, failing fast with the fatal log line on a crash.

Thin by design: every poll is one module call on the host (`vllm_fleet_instance_read`: the unit's
`systemctl show` and /health, and once /health answers 200 also the journal of the current start, /v1/models
and /metrics), and `vllm_fleet.verify.report.classify_readiness` decides. An instance that is already up is
thus read for verify in the wait's first poll: one round trip (issue 21); the model's size (`du`, for the
deadline) is read only when the first poll finds it still loading. After the first poll, a poll that finds
the instance loading holds on the host (the module reads again every `interval` seconds until /health
answers or the unit changes) for up to HOLD_S seconds, never past the next progress line or the deadline: a
start waited on costs a module call (a Python start on the host) per HOLD_S seconds, not one per `interval`
(issue 32). A unit that dies while loading is caught within `interval` (NRestarts, a new InvocationID,
failed or auto-restart), and the journal of the start that was waited on is read and parsed with
`vllm_fleet.verify.logcheck`, so the message carries the fatal line. While it waits it prints a progress
line every `progress_interval` seconds (waited of the timeout, unit state, /health, vLLM's last log line:
vllm_fleet.verify.progress).
"""

from __future__ import annotations

import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.host import InstancePlan
from vllm_fleet.verify.hostread import READ_MODULE, check_reads, headless_joined, poll_of, read_args
from vllm_fleet.verify.progress import WAIT_PROGRESS_INTERVAL_S, last_log_line, wait_progress_line
from vllm_fleet.verify.report import (
    JOURNAL_ARGV,
    Readiness,
    UnitState,
    api_target,
    awaited_start,
    classify_readiness,
    crash_message,
    load_report,
    needs_full_checks,
    ready_timeout,
)

ARGUMENT_SPEC = {
    "plan": {"type": "dict", "required": True},
    "address": {"type": "str"},
    "timeout": {"type": "int", "default": 0},
    "timeout_base": {"type": "int", "default": 600},
    "timeout_per_gib": {"type": "int", "default": 20},
    "interval": {"type": "float", "default": 2.0},
    "request_timeout": {"type": "int", "default": 5},
    "journal_lines": {"type": "int", "default": 2000},
    "progress_interval": {"type": "int", "default": WAIT_PROGRESS_INTERVAL_S},
    # where vllm_fleet_logcheck keeps the instance's last report; `full` sends the test requests regardless
    "report_dir": {"type": "path"},
    "full": {"type": "bool", "default": False},
    # read the journal, /v1/models and /metrics in the poll that finds the instance ready (`reads`)
    "checks": {"type": "bool", "default": True},
    "api_key": {"type": "str", "default": "", "no_log": True},
    "checks_timeout": {"type": "int", "default": 120},
}
# Shown live: a worker's display calls go through Ansible's result queue to the terminal as they happen.
display = Display()
# the longest a poll holds on the host: an instance that comes up is still seen within `interval` seconds
HOLD_S = 10.0


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def _module(self, name: str, args: dict, task_vars: dict) -> dict:
        return self._execute_module(module_name=name, module_args=args, task_vars=task_vars)

    def _poll(self, target, args: dict, task_vars: dict, hold: float) -> tuple[UnitState, int | None, dict]:
        """One read of the instance on the host (held up to `hold` seconds while it loads): its unit's state,
        /health's status and the whole read."""
        argv = read_args(
            target,
            checks=args["checks"],
            api_key=args["api_key"],
            request_timeout=args["request_timeout"],
            checks_timeout=args["checks_timeout"],
            hold=hold,
            interval=args["interval"],
        )
        res = self._module(READ_MODULE, argv, task_vars)
        if res.get("failed"):
            raise AnsibleActionFail(f"vllm_fleet_wait: {res.get('msg')}")
        state, health = poll_of(res, target.unit)
        return state, health, res

    def _model_bytes(self, model_path: str, task_vars: dict) -> int | None:
        """Bytes of weights on disk (None for a hub name or an unreadable path: the deadline's base)."""
        if not model_path.startswith("/"):
            return None
        res = self._module("ansible.builtin.command", {"argv": ["du", "-sbL", model_path]}, task_vars)
        first = (res.get("stdout") or "").split()
        return int(first[0]) if res.get("rc") == 0 and first and first[0].isdigit() else None

    def _last_line(self, unit: str, invocation_id: str, task_vars: dict) -> str:
        """The last line vLLM logged in the start being waited on (read-only, one journalctl)."""
        match = [f"_SYSTEMD_INVOCATION_ID={invocation_id}"] if invocation_id else ["-u", unit]
        argv = ["journalctl", "--no-pager", "-o", "cat", "-n", "5", *match]
        res = self._module("ansible.builtin.command", {"argv": argv}, task_vars)
        return last_log_line(res.get("stdout", "")) if res.get("rc") == 0 else "(journal not readable)"

    def _journal(self, unit: str, invocation_id: str, lines: int, task_vars: dict) -> tuple[str, str]:
        """The journal of one start of the unit; the unit's recent lines when that start logged nothing."""
        if invocation_id:
            argv = [*JOURNAL_ARGV, f"_SYSTEMD_INVOCATION_ID={invocation_id}"]
            res = self._module("ansible.builtin.command", {"argv": argv}, task_vars)
            if res.get("rc") == 0 and res.get("stdout", "").strip():
                return res["stdout"], " ".join(argv)
        argv = [*JOURNAL_ARGV, "-u", unit, "-n", str(lines)]
        res = self._module("ansible.builtin.command", {"argv": argv}, task_vars)
        return res.get("stdout", ""), " ".join(argv)

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(ARGUMENT_SPEC)
        try:
            plan = InstancePlan.from_dict(args["plan"])
            target = api_target(plan, address=args["address"])
        except FleetInputError as exc:
            raise AnsibleActionFail(f"vllm_fleet_wait: {exc}") from exc
        unit = target.unit
        timeout = args["timeout"]
        if timeout < 0:
            raise AnsibleActionFail(
                f"vllm_fleet_wait: timeout={timeout}: give a positive number of seconds, or 0 to derive it "
                "from the model's size (vllm_verify_ready_timeout)"
            )

        start = time.monotonic()
        deadline: float | None = None  # set after the first poll: an instance that is up needs no deadline
        baseline: UnitState | None = None
        awaited: UnitState | None = (
            None  # the start waited on (a restart under way at the first poll: the new)
        )
        polls = 0
        host_reads = 0  # the module's reads of the unit and /health, held ones included
        hold = 0.0  # the first poll answers at once: its state is the baseline a restart is told from
        progress_lines = 0
        next_progress = start + args["progress_interval"]
        host = task_vars.get("inventory_hostname", "")
        try:
            while True:
                polls += 1
                polled = time.monotonic()
                state, health, read = self._poll(target, args, task_vars, hold)
                host_reads += int(read.get("reads") or 1)
                joined = headless_joined(read) if target.headless else True
                verdict = classify_readiness(state, baseline, health, headless=target.headless, joined=joined)
                baseline = baseline or state
                awaited = awaited_start(baseline, awaited, state)
                if verdict.final:
                    break
                if deadline is None:
                    if timeout == 0:
                        model_bytes = self._model_bytes(target.model_path, task_vars)
                        timeout = ready_timeout(
                            model_bytes, base_s=args["timeout_base"], per_gib_s=args["timeout_per_gib"]
                        )
                    deadline = start + timeout
                if args["progress_interval"] > 0 and time.monotonic() >= next_progress:
                    next_progress = time.monotonic() + args["progress_interval"]
                    last = self._last_line(unit, awaited.invocation_id, task_vars)
                    sub = f"unit {state.active_state}/{state.sub_state}"
                    display.display(
                        wait_progress_line(host, unit, time.monotonic() - start, timeout, sub, health, last)
                    )
                    progress_lines += 1
                now = time.monotonic()
                if now >= deadline:
                    verdict = Readiness("timeout", f"not ready within {timeout} s ({verdict.reason})")
                    break
                # a poll that held has waited already; one that answered at once waits `interval`
                time.sleep(min(max(0.0, args["interval"] - (now - polled)), max(0.0, deadline - now)))
                next_stop = min(deadline, next_progress) if args["progress_interval"] > 0 else deadline
                hold = max(0.0, min(HOLD_S, next_stop - time.monotonic()))
        except FleetInputError as exc:
            raise AnsibleActionFail(str(exc)) from exc

        waited = time.monotonic() - start
        result.update(
            changed=False,
            state=verdict.state,
            reason=verdict.reason,
            waited_s=round(waited, 1),
            polls=polls,
            host_reads=host_reads,
            progress_lines=progress_lines,
            timeout=timeout,
            target=target.to_dict(),
            unit_state=state.to_dict(),
            last_health=read.get("health") or {},
            unit_show=read.get("unit_show", ""),
            invocation_id=awaited.invocation_id if awaited else "",
        )
        if verdict.state == "ready":
            # The test requests run after a (re)start, a plan change or a failed check, or when asked.
            previous = None
            if args["report_dir"] and not args["full"]:
                previous = load_report(args["report_dir"], host, target.instance)
            full = needs_full_checks(previous, plan, result["invocation_id"])
            result["full_checks"] = full
            result["verified_start"] = {} if full else dict(previous["verified_start"])
            reads = check_reads(read, headless=target.headless) if args["checks"] else None
            if reads is not None:
                result["reads"] = reads
            return result
        journal, source = self._journal(
            unit, awaited.invocation_id if awaited else "", args["journal_lines"], task_vars
        )
        # The PID seen while it loaded picks this start's lines out of the journal (see journal_text).
        main_pid = next((s.main_pid for s in (awaited, state) if s and s.main_pid), None)
        msg, errors = crash_message(unit, verdict, journal, waited, main_pid)
        result.update(failed=True, msg=msg, errors=errors, journal_source=source)
        return result
