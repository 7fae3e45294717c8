"""Action plugin: render and validate every instance's `vllm serve` command of one host (on the controller).

Thin by design: the schema, the per-release spelling and every rule live in `vllm_fleet.render.schema`,
`vllm_fleet.render.serve` and `vllm_fleet.render.validate`; this plugin only collects the inputs (the
`vllm_service_*`
variables, the layout from the `gpu_topology` fact, the vLLM version, the model config, the topology), calls
them and fails the task with every error at once. Touches no host.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from vllm_fleet.errors import FleetInputError
from vllm_fleet.render.schema import PREFIX, ServeSpec
from vllm_fleet.render.serve import render_instance

display = Display()

ARGUMENT_SPEC = {
    "vars": {"type": "dict"},
    "layout": {"type": "raw", "required": True},
    "vllm_version": {"type": "str", "required": True},
    "model_config": {"type": "dict", "default": {}},
    "topology": {"type": "dict", "default": {}},
    "fail_on_error": {"type": "bool", "default": True},
}


def layout_instances(layout: Any) -> list[dict[str, Any]]:
    """Instances of a layout (`gpu_topology.layout`), of the whole fact, or a bare instance list."""
    if isinstance(layout, dict) and "layout" in layout:
        layout = layout["layout"]
    if isinstance(layout, dict):
        layout = layout.get("instances")
    if not isinstance(layout, list) or not layout or not all(isinstance(i, dict) for i in layout):
        raise FleetInputError(
            "layout: no instances (expected gpu_topology.layout with a non-empty 'instances' list); run the "
            "gpu_topology role (probe) on this host first"
        )
    return layout


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def _collect_vars(self, task_vars: dict[str, Any]) -> dict[str, Any]:
        """Every vllm_service_* variable of the host, templated, when the task passes none explicitly."""
        return {
            name: self._templar.template(value)
            for name, value in task_vars.items()
            if isinstance(name, str) and name.startswith(PREFIX)
        }

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(ARGUMENT_SPEC)
        host = task_vars.get("inventory_hostname", "localhost")
        variables = args["vars"] if args["vars"] is not None else self._collect_vars(task_vars)
        try:
            spec = ServeSpec.from_vars(variables)
            instances = [
                render_instance(
                    spec,
                    instance,
                    args["vllm_version"],
                    model_config=args["model_config"],
                    topology=args["topology"],
                )
                for instance in layout_instances(args["layout"])
            ]
        except FleetInputError as exc:
            raise AnsibleActionFail(f"vllm_fleet_render ({host}): {exc}") from exc

        errors = [f"{r.name}: {e}" for r in instances for e in r.errors]
        warnings = [f"{r.name}: {w}" for r in instances for w in r.warnings]
        result.update(
            changed=False,
            instances=[r.to_dict() for r in instances],
            errors=errors,
            spec=spec.to_dict(),
        )
        for warning in warnings:
            display.warning(f"vllm_fleet_render ({host}) {warning}")
        result["render_warnings"] = warnings
        if errors:
            result["msg"] = (
                f"vllm_fleet_render ({host}): {len(errors)} error(s) in the vllm serve command for vLLM "
                f"{args['vllm_version']}:\n- " + "\n- ".join(errors)
            )
            result["failed"] = args["fail_on_error"]
        return result
