"""Every host's plan from an Ansible inventory, without touching a host (`vllm-fleet plan --inventory`).

The one module of the library that imports ansible-core: the inventory, its group and host variables and
their templates are read with ansible-core's own InventoryManager, VariableManager and Templar, the roles'
argument specs are checked with its ArgumentSpecValidator, so the plan seen here is the plan preflight builds
(the `vllm_fleet_plan` action plugin calls the same functions). Facts come from recorded outputs
(`gpu_topology_recorded_dir`) or from the probe's saved report (`reports/probe/<host>.json`, probe.yml).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vllm_fleet import flags
from vllm_fleet.errors import FleetInputError
from vllm_fleet.jsonfile import read_json
from vllm_fleet.plan.build import build_host_plan, host_needs
from vllm_fleet.plan.host import HostPlan
from vllm_fleet.plan.model_config import model_config_from
from vllm_fleet.plan.nodes import peer_of
from vllm_fleet.probe.topology import Topology, build_topology_from_dir, recorded_source
from vllm_fleet.project import fleet_report_dir
from vllm_fleet.validate import port_errors, variable_errors

# libyaml's loader where PyYAML has it: the nine argument specs are read for every host's plan, and the pure
# Python loader took about 40 ms of them (issue 21)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
DEFAULT_VLLM_VERSION = "0.32.0"  # roles/vllm_install/defaults/main.yml, for an inventory that sets no pin


def roles_of(roles_dir: Path) -> list[Path]:
    return [p for p in sorted(roles_dir.iterdir()) if (p / "meta" / "argument_specs.yml").is_file()]


def role_defaults(roles_dir: Path) -> dict[str, Any]:
    """Every role's defaults, loaded by ansible-core's DataLoader (so their templates are trusted as such)."""
    from ansible.parsing.dataloader import DataLoader

    loader = DataLoader()
    defaults: dict[str, Any] = {}
    for role in roles_of(roles_dir):
        path = role / "defaults" / "main.yml"
        if path.is_file():
            defaults.update(loader.load_from_file(str(path), trusted_as_template=True) or {})
    return defaults


def role_variables(
    host_vars: Mapping[str, Any], roles_dir: Path, template: Callable[[Any, dict[str, Any]], Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what the inventory sets, what the roles will see: their defaults under it), both templated.

    Role defaults are no variables of a play without the role; they are read here so that the plan sees what
    the roles see later (vllm_service_model defaults to vllm_install_model_path, for one)."""
    prefixes = tuple(f"{p.name}_" for p in roles_of(roles_dir))
    defaults = role_defaults(roles_dir)
    available = {**defaults, **host_vars}
    own = [n for n in host_vars if isinstance(n, str) and n.startswith(prefixes)]
    merged = {n: v for n, v in defaults.items() if n.startswith(prefixes)}
    merged.update({n: host_vars[n] for n in own})
    # what the inventory sets first: a template that fails there is named as the variable the user set, not as
    # a role default that reads it (fleet_gateway_api_key defaults to vllm_service_api_key)
    order = [*own, *(n for n in merged if n not in host_vars)]
    seen = {name: _templated(name, merged[name], available, template) for name in order}
    return {n: seen[n] for n in own}, seen


def _templated(
    name: str, value: Any, available: dict[str, Any], template: Callable[[Any, dict[str, Any]], Any]
) -> Any:
    """The value as the role sees it; a template that cannot be rendered (a lookup of a missing file, an
    undefined variable) is refused naming the variable, not raised as a traceback."""
    from ansible.errors import AnsibleError

    try:
        return template(value, available)
    except AnsibleError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FleetInputError(
            f"{name}: its template cannot be rendered ({reason}); fix the expression or what it reads, or "
            "define it in the inventory (a vault file's variables need ansible-playbook with the vault "
            "password)"
        ) from exc


def _loose(options: Mapping[str, Any]) -> dict[str, Any]:
    """A spec without `required` and defaults: a role's default provides what the inventory leaves unset."""
    out = {}
    for name, option in options.items():
        option = {k: v for k, v in option.items() if k not in ("required", "description", "default")}
        if isinstance(option.get("options"), dict):
            option["options"] = _loose(option["options"])
        out[name] = option
    return out


def argument_spec_errors(roles_dir: Path, given: Mapping[str, Any]) -> list[str]:
    """Every role's `meta/argument_specs.yml` (entry point main) against the variables the inventory sets."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    errors: list[str] = []
    for role in roles_of(roles_dir):
        path = role / "meta" / "argument_specs.yml"
        options = (yaml.load(path.read_text(), Loader=SAFE_LOADER) or {})["argument_specs"]["main"]["options"]
        present = {name: given[name] for name in options if name in given}
        if not present:
            continue
        result = ArgumentSpecValidator(_loose(options)).validate(present)
        errors += [
            f"{role.name}: {message} (roles/{role.name}/meta/argument_specs.yml)"
            for message in result.error_messages
        ]
    return errors


def input_errors(
    host: str,
    roles_dir: Path,
    given: Mapping[str, Any],
    variables: Mapping[str, Any],
    own_addresses: tuple[str, ...] = (),
) -> list[str]:
    """The argument specs' types for what the inventory sets, then every variable's kind (vllm_fleet.validate)
    for what the roles will see: a host with any of these is not planned at all."""
    return argument_spec_errors(roles_dir, given) + variable_errors(
        host, variables, own_addresses=own_addresses
    )


def refused_plan(host: str, vllm_version: str, errors: list[str]) -> HostPlan:
    """The plan of a host whose variables were refused: no instance, the refusals as its errors."""
    return HostPlan(
        host=host,
        vllm_version=vllm_version,
        source="not planned",
        cpu_only=False,
        model_config_source="not read",
        instances=[],
        needs=host_needs([]),
        layout={},
        errors=list(dict.fromkeys(errors)),
    )


def with_port_errors(plan: HostPlan, variables: Mapping[str, Any]) -> HostPlan:
    """The plan with the clashes of its instances' ports (the layout's) with the host's other listeners."""
    clashes = port_errors(variables, [i.port for i in plan.instances]) if plan.instances else []
    plan.errors = list(dict.fromkeys([*plan.errors, *clashes]))
    return plan


def facts_topology(host: str, variables: Mapping[str, Any], probe_dir: Path) -> tuple[Topology, str]:
    """The host's topology from recorded outputs or the probe's saved report, and where it came from."""
    recorded = variables.get("gpu_topology_recorded_dir")
    if recorded:
        return build_topology_from_dir(str(recorded)), recorded_source(str(recorded))
    report = probe_dir / f"{host}.json"
    if report.is_file():
        fix = "run playbooks/probe.yml again"
        data = read_json(report, "probe report", fix)
        topology = data.get("topology") if isinstance(data, dict) else None
        if not isinstance(topology, dict):
            raise FleetInputError(f"probe report {report}: no topology object; {fix}")
        try:
            return Topology.from_dict(topology), f"probe report: {report}"
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a field of the wrong type
            raise FleetInputError(
                f"probe report {report}: not a topology ({type(exc).__name__}: {exc}); {fix}"
            ) from exc
    raise FleetInputError(
        f"{host}: no facts to plan from: set gpu_topology_recorded_dir (a folder of recorded outputs) or run "
        f"playbooks/probe.yml first (it writes {report})"
    )


def collections_paths_of(project_dir: Path) -> list[str]:
    """The collections path that holds vllm_fleet.serving for this project: a clone holds itself
    (ansible_collections/vllm_fleet/serving -> ../..), an installed collection sits three levels down in
    one (site-packages/ansible_collections/vllm_fleet/serving)."""
    candidates = [project_dir, *project_dir.parents[2:3]]
    return [str(c) for c in candidates if (c / "ansible_collections" / "vllm_fleet" / "serving").is_dir()]


def plan_inventory(
    inventory: str, *, project_dir: Path, limit: str | None = None, probe_dir: Path | None = None
) -> dict[str, HostPlan]:
    """{host: plan} for every host of the inventory (or those `limit` selects), in inventory order."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    # ansible-playbook does this in CLI.run; without it even ansible.builtin lookups are "not found". The
    # roles' defaults call the collection's own filters (vllm_fleet.serving.vllm_fleet_report_dir): find it
    # where this project is, whatever the working directory's ansible.cfg says.
    init_plugin_loader(collections_paths_of(project_dir))
    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[inventory])
    if limit:
        manager.subset(limit)
    variables_of = VariableManager(loader=loader, inventory=manager)
    hosts = manager.get_hosts()
    if not hosts:
        matching = f" match --limit {limit}" if limit else ""
        raise FleetInputError(f"--inventory {inventory}: no hosts{matching}")
    roles_dir = project_dir / "roles"
    probe_dir = probe_dir or fleet_report_dir(project_dir, Path.cwd()) / "probe"

    def template(value: Any, available: dict[str, Any]) -> Any:
        return Templar(loader=loader, variables=available).template(value)

    inputs: dict[str, _HostInputs] = {}
    for host in hosts:
        host_vars = variables_of.get_vars(host=host, include_hostvars=False)
        try:
            given, variables = role_variables(host_vars, roles_dir, template)
        except FleetInputError as exc:
            raise FleetInputError(f"--inventory {inventory}: host {host.name}: {exc}") from exc
        version = str(variables.get("vllm_install_version") or DEFAULT_VLLM_VERSION)
        own = str(host_vars.get("ansible_host") or "")
        errors = input_errors(host.name, roles_dir, given, variables, (own,))
        topology, source = (None, "") if errors else facts_topology(host.name, variables, probe_dir)
        inputs[host.name] = _HostInputs(host_vars, variables, version, own, errors, topology, source)
    # the members of an instance over several hosts see each other's GPUs, ranks and ports (plan.nodes)
    peers = {
        name: peer_of(
            name, i.variables, i.topology, vllm_version=flags.public_version(i.version), ansible_host=i.own
        )
        for name, i in inputs.items()
    }
    plans: dict[str, HostPlan] = {}
    for name, i in inputs.items():
        if i.topology is None:
            plans[name] = refused_plan(name, i.version, i.errors)
            continue
        config, config_source = model_config_from(
            i.variables.get("vllm_service_model_config"),
            None,
            base_dir=str(i.host_vars.get("inventory_dir") or "."),
            model=str(i.variables.get("vllm_service_model") or ""),
        )
        plan = build_host_plan(
            name,
            i.variables,
            i.topology,
            vllm_version=i.version,
            source=i.source,
            model_config=config,
            model_config_source=config_source,
            peers=peers,
        )
        plans[name] = with_port_errors(plan, i.variables)
    return plans


@dataclass(frozen=True)
class _HostInputs:
    """What the plan of one inventory host is made from (topology None: its variables were refused)."""

    host_vars: Mapping[str, Any]
    variables: dict[str, Any]
    version: str
    own: str  # ansible_host
    errors: list[str]
    topology: Topology | None
    source: str
