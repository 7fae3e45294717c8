"""Action plugin: the host's plan, built once on the controller, and every role's argument spec checked.

Thin by design: the plan is `vllm_fleet.plan.build.build_host_plan` (layout, serve command, rules, capacity,
fleet checks); the variables are read and the argument specs checked by `vllm_fleet.plan.inventory` with
ansible-core's own Templar and ArgumentSpecValidator, exactly as `vllm-fleet plan --inventory` does. Touches
no host. Fails with every error of the host at once; returns the plan as `plan` (`HostPlan.to_dict()`, which
preflight keeps as the run's `vllm_fleet_plan` with set_fact, never a cached fact) and writes it (and the
probe's facts) on the controller in Python: three delegated file tasks per host cost a converged re-run
seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from vllm_fleet import flags
from vllm_fleet.errors import FleetInputError
from vllm_fleet.jsonfile import write_json
from vllm_fleet.plan.build import build_host_plan
from vllm_fleet.plan.host import plain
from vllm_fleet.plan.inventory import DEFAULT_VLLM_VERSION, input_errors, role_variables, with_port_errors
from vllm_fleet.plan.model_config import model_config_from
from vllm_fleet.plan.nodes import NODE_ADDRESS, NODES, Peer, node_list, peer_of
from vllm_fleet.probe.topology import Topology
from vllm_fleet.validate import host_name_errors

display = Display()

# The flag catalog (0.9 MB of JSON, every plan reads it) is parsed when this plugin is imported, not when it
# runs: the vllm_fleet_preload callback imports it in ansible-playbook's own process, so the worker that plans
# each host inherits it parsed instead of parsing it again (issue 21).
flags.catalogued_versions()

ARGUMENT_SPEC = {
    "topology": {"type": "dict", "required": True},
    "source": {"type": "str", "default": "probed live"},
    "vllm_version": {"type": "str", "required": True},
    "model_config": {"type": "raw"},
    "model_config_read": {"type": "dict", "default": {}},
    "roles_dir": {"type": "path", "required": True},
    # On the controller: the probe's facts (`probe`, the gpu_topology fact) kept as <probe_dir>/<host>.json
    # for `vllm-fleet plan --inventory`, and the plan, once it has no error, as <plan_dir>/<host>.json.
    # `ip -j addr show` of the host, read where it is one rank of an instance over several hosts
    "interfaces": {"type": "raw"},
    "probe": {"type": "dict"},
    "probe_dir": {"type": "path"},
    "plan_dir": {"type": "path"},
}


def interfaces_read(text: Any) -> list[dict[str, Any]] | None:
    """The stdout of `ip -j addr show` (None or '': not read)."""
    if not text:
        return None
    try:
        data = json.loads(text) if isinstance(text, str) else text
    except ValueError as exc:
        raise FleetInputError(
            f"ip -j addr show: not JSON ({exc}); is iproute2 installed on the host?"
        ) from exc
    if not isinstance(data, list):
        raise FleetInputError("ip -j addr show: expected a JSON list of interfaces")
    return [dict(link) for link in data if isinstance(link, dict)]


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def _template(self, value: Any, available: dict[str, Any]) -> Any:
        return self._templar.copy_with_new_env(available_variables=available).template(value)

    def _peers(self, names: tuple[str, ...], task_vars: dict[str, Any]) -> dict[str, Peer]:
        """The other members of a multi-host instance, from their hostvars: preflight probed every host of
        the play before this task, so their facts are there (a host outside the run is left out, and
        plan.nodes names it)."""
        hostvars = task_vars.get("hostvars") or {}
        peers: dict[str, Peer] = {}
        for name in names:
            if name not in hostvars:
                continue
            available = hostvars[name]  # templated on access
            wanted = (NODES, NODE_ADDRESS, "vllm_service_master_port", "ansible_host")
            values = {k: available[k] for k in wanted if k in available}
            facts = (available.get("ansible_facts") or {}).get("gpu_topology") or {}
            topology = Topology.from_dict(facts["topology"]) if facts.get("topology") else None
            # the release preflight plans that host for (playbooks/preflight.yml __vllm_fleet_plan_version)
            release = available.get("vllm_install_installed_version") or available.get("vllm_install_version")
            version = flags.public_version(str(release or DEFAULT_VLLM_VERSION))
            peers[name] = peer_of(
                name,
                values,
                topology,
                vllm_version=version,
                ansible_host=str(values.get("ansible_host") or ""),
            )
        return peers

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(ARGUMENT_SPEC)
        host = task_vars.get("inventory_hostname", "localhost")
        roles_dir = Path(args["roles_dir"])
        # the host's name is the file name of its reports: checked before the first is written
        if args["probe"] is not None and args["probe_dir"] and not host_name_errors(host):
            write_json(Path(args["probe_dir"]) / f"{host}.json", plain(args["probe"]))
        try:
            given, variables = role_variables(task_vars, roles_dir, self._template)
            errors = input_errors(
                host, roles_dir, given, variables, (str(task_vars.get("ansible_host") or ""),)
            )
            if errors:
                return self._refused(result, host, errors)
            config, config_source = model_config_from(
                args["model_config"],
                args["model_config_read"],
                base_dir=task_vars.get("inventory_dir") or ".",
                model=str(variables.get("vllm_service_model") or ""),
            )
            topology = Topology.from_dict(args["topology"])
            peers = self._peers(node_list(variables), task_vars)
            # this host as the plan sees it: its own variables and facts, the release it is planned for
            peers[host] = peer_of(
                host,
                variables,
                topology,
                vllm_version=flags.public_version(args["vllm_version"]),
                ansible_host=str(task_vars.get("ansible_host") or ""),
            )
            plan = build_host_plan(
                host,
                variables,
                topology,
                vllm_version=args["vllm_version"],
                source=args["source"],
                model_config=config,
                model_config_source=config_source,
                peers=peers,
                interfaces=interfaces_read(args["interfaces"]),
            )
        except FleetInputError as exc:
            raise AnsibleActionFail(f"vllm_fleet_plan ({host}): {exc}") from exc
        plan = with_port_errors(plan, variables)
        for warning in plan.warnings:
            display.warning(f"vllm_fleet_plan ({host}) {warning}")
        data = plan.to_dict()
        # the plan as `plan`, not as a fact: Ansible's fact cache would keep a fact for the next run, which
        # must plan its own inventory (preflight sets the run's vllm_fleet_plan from it with set_fact)
        result.update(changed=False, plan=data)
        if not plan.errors and args["plan_dir"]:
            result["plan_path"] = str(write_json(Path(args["plan_dir"]) / f"{host}.json", data))
        if plan.errors:
            result["failed"] = True
            result["msg"] = (
                f"vllm_fleet_plan ({host}): {len(plan.errors)} error(s); nothing was changed on any host:\n- "
                + "\n- ".join(plan.errors)
            )
        return result

    @staticmethod
    def _refused(result: dict[str, Any], host: str, errors: list[str]) -> dict[str, Any]:
        """The variables are refused: no plan is built from them."""
        result.update(
            changed=False,
            failed=True,
            msg=(
                f"vllm_fleet_plan ({host}): {len(errors)} error(s) in the variables; nothing was changed on "
                "any host:\n- " + "\n- ".join(dict.fromkeys(errors))
            ),
        )
        return result
