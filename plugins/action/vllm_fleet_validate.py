"""Action plugin: every role's variables checked on the controller, for a playbook that builds no plan.

Thin by design: the same `vllm_fleet.plan.inventory.input_errors` the `vllm_fleet_plan` action runs in
preflight (the argument specs' types, then each variable's kind from `vllm_fleet.validate`), for playbooks
that do not import preflight (playbooks/monitoring.yml). Touches no host; fails with every message at once.
"""

from __future__ import annotations

from pathlib import Path

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.inventory import input_errors, role_variables

ARGUMENT_SPEC = {"roles_dir": {"type": "path", "required": True}}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(ARGUMENT_SPEC)
        host = task_vars.get("inventory_hostname", "localhost")
        roles_dir = Path(args["roles_dir"])

        def template(value, available):
            return self._templar.copy_with_new_env(available_variables=available).template(value)

        try:
            given, variables = role_variables(task_vars, roles_dir, template)
        except FleetInputError as exc:  # a template that cannot be rendered, named
            raise AnsibleActionFail(f"vllm_fleet_validate ({host}): {exc}") from exc
        errors = input_errors(host, roles_dir, given, variables, (str(task_vars.get("ansible_host") or ""),))
        result["changed"] = False
        if errors:
            result["failed"] = True
            result["msg"] = (
                f"vllm_fleet_validate ({host}): {len(errors)} error(s) in the variables; nothing was changed "
                "on any host:\n- " + "\n- ".join(dict.fromkeys(errors))
            )
        return result
