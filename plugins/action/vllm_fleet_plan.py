"""Action plugin: the host's plan, built once on the controller, and every role's argument spec checked.

Thin by design: the plan is `vllm_fleet.plan.build.build_host_plan` (layout, serve command, rules, capacity,
fleet checks); the argument specs are checked with ansible-core's own `ArgumentSpecValidator` against the
variables the inventory sets (role defaults are not variables of this play, so only what the user set is
judged). Touches no host. Fails with every error of the host at once; returns the plan as the fact
`vllm_fleet_plan` (`HostPlan.to_dict()`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.build import build_host_plan
from vllm_fleet.plan.model_config import model_config_from
from vllm_fleet.probe.topology import Topology

display = Display()

ARGUMENT_SPEC = {
    "topology": {"type": "dict", "required": True},
    "source": {"type": "str", "default": "probed live"},
    "vllm_version": {"type": "str", "required": True},
    "model_config": {"type": "raw"},
    "model_config_read": {"type": "dict", "default": {}},
    "roles_dir": {"type": "path", "required": True},
}


def _loose(options: dict[str, Any]) -> dict[str, Any]:
    """The spec with `required` dropped: a role's default provides what the inventory leaves unset."""
    out = {}
    for name, option in options.items():
        option = {k: v for k, v in option.items() if k not in ("required", "description", "default")}
        if isinstance(option.get("options"), dict):
            option["options"] = _loose(option["options"])
        out[name] = option
    return out


def argument_spec_errors(roles_dir: Path, variables: dict[str, Any]) -> list[str]:
    """Every role's `meta/argument_specs.yml` (entry point main) against the variables that are set."""
    spec_files = sorted(roles_dir.glob("*/meta/argument_specs.yml"))
    if not spec_files:
        raise AnsibleActionFail(f"vllm_fleet_plan: no roles/*/meta/argument_specs.yml under {roles_dir}")
    errors: list[str] = []
    for path in spec_files:
        role = path.parent.parent.name
        options = (yaml.safe_load(path.read_text()) or {})["argument_specs"]["main"]["options"]
        given = {name: variables[name] for name in options if name in variables}
        if not given:
            continue
        result = ArgumentSpecValidator(_loose(options)).validate(given)
        errors += [
            f"{role}: {message} (roles/{role}/meta/argument_specs.yml)" for message in result.error_messages
        ]
    return errors


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def _variables(self, task_vars: dict[str, Any], roles_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
        """(what the inventory sets, what the roles will see: their defaults under it), both templated.

        Role defaults are not variables of this play; they are read here so that the plan sees exactly
        what the roles see later (a default such as vllm_service_model derives from vllm_install_*)."""
        roles = [p for p in sorted(roles_dir.iterdir()) if (p / "meta").is_dir()]
        prefixes = tuple(f"{p.name}_" for p in roles)
        defaults: dict[str, Any] = {}
        for role in roles:
            path = role / "defaults" / "main.yml"
            if path.is_file():
                defaults.update(yaml.safe_load(path.read_text()) or {})
        templar = self._templar.copy_with_new_env(available_variables={**defaults, **task_vars})
        own = {n for n in task_vars if isinstance(n, str) and n.startswith(prefixes)}
        seen = {
            name: templar.template(value)
            for name, value in {**defaults, **{n: task_vars[n] for n in own}}.items()
            if isinstance(name, str) and name.startswith(prefixes)
        }
        return {n: seen[n] for n in own}, seen

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(ARGUMENT_SPEC)
        host = task_vars.get("inventory_hostname", "localhost")
        roles_dir = Path(args["roles_dir"])
        given, variables = self._variables(task_vars, roles_dir)
        errors = argument_spec_errors(roles_dir, given)
        try:
            config, config_source = model_config_from(
                args["model_config"],
                args["model_config_read"],
                base_dir=task_vars.get("inventory_dir") or ".",
                model=str(variables.get("vllm_service_model") or ""),
            )
            plan = build_host_plan(
                host,
                variables,
                Topology.from_dict(args["topology"]),
                vllm_version=args["vllm_version"],
                source=args["source"],
                model_config=config,
                model_config_source=config_source,
            )
        except FleetInputError as exc:
            raise AnsibleActionFail(f"vllm_fleet_plan ({host}): {exc}") from exc
        errors += plan.errors
        for warning in plan.warnings:
            display.warning(f"vllm_fleet_plan ({host}) {warning}")
        data = plan.to_dict()
        data["errors"] = errors
        data["ok"] = not errors
        result.update(changed=False, ansible_facts={"vllm_fleet_plan": data}, plan=data)
        if errors:
            result["failed"] = True
            result["msg"] = (
                f"vllm_fleet_plan ({host}): {len(errors)} error(s); nothing was changed on any host:\n- "
                + "\n- ".join(errors)
            )
        return result
