"""Action plugin: check one vLLM instance's startup journal, API answers and /metrics against its plan.

Runs on the controller only: the role hands it the raw text it gathered on the host with stock modules, and
`vllm_fleet.verify.report.build_report` (which calls `vllm_fleet.verify.logcheck.parse_log`/`check_log`, the
functions
behind `vllm-fleet logcheck`) gives the verdict. The JSON report is written on the controller, one file per
host and instance; a failed check fails the host with what was expected, what was seen, and where.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from vllm_fleet.errors import FleetInputError
from vllm_fleet.verify.report import (
    Thresholds,
    build_report,
    failure_message,
    save_report,
    warning_lines,
)

ARGUMENT_SPEC = {
    "plan": {"type": "dict", "required": True},
    "journal": {"type": "str", "required": True},
    "unit_show": {"type": "str", "required": True},
    "api": {"type": "dict", "default": {}},
    "metrics_before": {"type": "str", "default": ""},
    "metrics_after": {"type": "str", "default": ""},
    "readiness": {"type": "dict", "default": {}},
    "address": {"type": "str"},
    "host": {"type": "str"},
    "report_dir": {"type": "path"},
    "spec_acceptance_min": {"type": "float"},
    "ttft_p99_max_s": {"type": "float"},
    "max_restarts": {"type": "int", "default": 0},
    "fail_on_error": {"type": "bool", "default": True},
    # vllm_fleet_wait's decision: were the test requests sent (and what did the last full check vouch for)
    "full": {"type": "bool", "default": True},
    "verified_start": {"type": "dict", "default": {}},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(ARGUMENT_SPEC)
        host = args["host"] or task_vars.get("inventory_hostname", "localhost")
        thresholds = Thresholds(
            spec_acceptance_min=args["spec_acceptance_min"],
            ttft_p99_max_s=args["ttft_p99_max_s"],
            max_restarts=args["max_restarts"],
        )
        try:
            report = build_report(
                host=host,
                plan=args["plan"],
                journal=args["journal"],
                unit_show=args["unit_show"],
                api=args["api"],
                metrics_before=args["metrics_before"] or None,
                metrics_after=args["metrics_after"] or None,
                thresholds=thresholds,
                readiness=args["readiness"],
                address=args["address"],
                full=args["full"],
                verified_start=args["verified_start"],
            )
        except FleetInputError as exc:
            raise AnsibleActionFail(f"vllm_fleet_logcheck ({host}): {exc}") from exc

        data = report.to_dict()
        result.update(changed=False, report=data, ok=report.ok)
        if args["report_dir"]:
            result["report_path"] = str(save_report(args["report_dir"], data))
        if warnings := warning_lines(data):
            result["warnings"] = warnings  # Ansible prints them; an approximate capacity never fails
        if not report.ok:
            result["msg"] = failure_message(data)
            result["failed"] = args["fail_on_error"]
        # the line the role keeps per instance (vllm_verify_results): its set_stats and assert read it
        result["verdict"] = {
            "instance": data["instance"],
            "ok": report.ok,
            "msg": result.get("msg", ""),
            "report_path": result.get("report_path", ""),
        }
        return result
