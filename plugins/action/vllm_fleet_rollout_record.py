"""Action plugin: write a host's rollout record and the fleet summary in the run folder, on the controller.

Thin by design: the files and the summary are `vllm_fleet.rollout.records.record_turn`'s. It runs in the
controller's process, not as a module: the two `ansible.builtin.copy` tasks it replaces were a module run on
the controller each, twice a turn (issue 32). The role runs it with `throttle: 1`, as the hosts of a batch all
rewrite the same summary.
"""

from __future__ import annotations

from pathlib import Path

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from vllm_fleet.errors import FleetInputError
from vllm_fleet.rollout.records import record_turn

ARGUMENT_SPEC = {
    "record": {"type": "dict", "required": True},
    "run_dir": {"type": "path", "required": True},
    "targets": {"type": "list", "elements": "str", "required": True},
    "started_at": {"type": "float"},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(ARGUMENT_SPEC)
        host = task_vars.get("inventory_hostname", "localhost")
        try:
            summary = record_turn(
                Path(args["run_dir"]), host, args["record"], args["targets"], args["started_at"]
            )
        except (FleetInputError, OSError, ValueError) as exc:
            raise AnsibleActionFail(f"vllm_fleet_rollout_record: {exc}") from exc
        result.update(changed=False, result=summary["result"])
        return result
