"""`vllm-fleet render`: inventory variables -> the exact `vllm serve` argv and ExecStart line for a release.

    vllm-fleet render --vars group_vars/all/vllm_service.yml --vllm-version 0.33.0 \
        [--instance-json layout.json [--instance i1]] [--model-config config.json] [--topology-json t.json] \
        [--shell | --unit] [--json]

`--unit` prints the whole systemd unit vllm_service would write for that instance (the vllm_service_* unit
variables of --vars apply: user, directories, prefix, limits); `--json` always carries it as `unit_text`.

Exit status: 0 when the command is valid for that release, 1 when the validator found errors (they are in the
output), 2 when an input is unusable (message on stderr naming it).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import yaml

from vllm_fleet.cli import emit, read_input_file, read_json_input
from vllm_fleet.cli.plan import load_model_config
from vllm_fleet.deploy.service import ServiceOptions, instance_files
from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.build import instance_plan
from vllm_fleet.plan.layout import Instance
from vllm_fleet.render.schema import PREFIX, ServeSpec
from vllm_fleet.render.serve import Rendered, render_instance


def load_vars(path: str) -> dict[str, Any]:
    """A YAML (or JSON) mapping of vllm_service_* variables, e.g. a group_vars file."""
    text = read_input_file(path, "--vars")
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        where = f" at line {exc.problem_mark.line + 1}" if exc.problem_mark else ""
        raise FleetInputError(f"--vars: {path!r} is not YAML ({exc.problem}{where})") from exc
    except (yaml.YAMLError, RecursionError, ValueError) as exc:  # ValueError: an int of over 4,300 digits
        raise FleetInputError(
            f"--vars: {path!r} is not YAML a vars file holds ({type(exc).__name__})"
        ) from exc
    if not isinstance(data, dict):
        raise FleetInputError(f"--vars: {path!r} must hold a mapping of vllm_service_* variables")
    templated = sorted(k for k, v in data.items() if isinstance(v, str) and "{{" in v)
    if templated:
        raise FleetInputError(
            f"--vars: {', '.join(templated)} in {path!r} hold Jinja templates, which only Ansible resolves; "
            "give plain values here (or render through the preflight playbook)"
        )
    return data


def load_instance(path: str | None, name: str | None, spec: ServeSpec) -> dict[str, Any]:
    """One layout instance: from a layout / gpu_topology fact / instance JSON, or a plain GPU instance."""
    if path is None:
        return {
            "name": name or "i0",
            "device": "cuda",
            "tensor_parallel_size": spec.tensor_parallel_size or 1,
            "port": spec.port or 8000,
            "numa_binding": {"mode": "none", "nodes": []},
        }
    data = read_json_input(
        path,
        "--instance-json",
        "give a layout (vllm-fleet topology --json), the gpu_topology fact or one instance",
    )
    if isinstance(data, dict) and "layout" in data:  # the gpu_topology fact
        data = data["layout"]
    instances = data.get("instances") if isinstance(data, dict) else data
    if isinstance(data, dict) and "instances" not in data:
        instances = [data]
    if not isinstance(instances, list) or not instances or not all(isinstance(i, dict) for i in instances):
        raise FleetInputError(
            f"--instance-json: {path!r} holds no layout instance; give a layout (vllm-fleet topology "
            "--json), the gpu_topology fact or one instance object"
        )
    if name is None:
        return instances[0]
    for instance in instances:
        if instance.get("name") == name:
            return instance
    names = ", ".join(str(i.get("name")) for i in instances)
    raise FleetInputError(f"--instance: {name!r} is not in {path!r} (it has {names})")


# The role's own variables for the unit (roles/vllm_service/vars/main.yml __vllm_service_options); the state
# directory, python and ordering are the role's constants.
UNIT_OPTIONS = tuple(
    f.name for f in dataclasses.fields(ServiceOptions) if f.name not in ("state_dir", "python", "after")
)


def service_options(variables: dict[str, Any]) -> ServiceOptions:
    """ServiceOptions from the vllm_service_* unit variables of a vars file (defaults where absent)."""
    given: dict[str, Any] = {}
    for name in UNIT_OPTIONS:
        value = variables.get(PREFIX + name)
        if value is None:
            continue
        given[name] = tuple(value) if name == "read_write_paths" else value
    return ServiceOptions(**given)


def unit_text_for(
    spec: ServeSpec, rendered: Rendered, instance: dict[str, Any], variables: dict[str, Any]
) -> str:
    """The unit file vllm_service would write (secrets stay in the EnvironmentFile, never in the unit)."""
    options = service_options(variables)
    secrets = dict(spec.secret_env)
    if spec.api_key:
        secrets["VLLM_API_KEY"] = spec.api_key
    plan = instance_plan(
        "render",
        spec,
        Instance.from_dict(instance),
        rendered,
        env=spec.extra_env,
        unit_prefix=options.unit_prefix,
    )
    return instance_files(plan, options=options, secret_env=secrets).unit_text


def _handle(args: argparse.Namespace) -> int:
    variables = load_vars(args.vars)
    spec = ServeSpec.from_vars(variables)
    instance = load_instance(args.instance_json, args.instance, spec)
    model_config = load_model_config(args.model_config) if args.model_config else {}
    topology: dict[str, Any] = {}
    if args.topology_json:
        topology = read_json_input(args.topology_json, "--topology-json", "give `vllm-fleet topology --json`")
        if not isinstance(topology, dict):
            raise FleetInputError(
                f"--topology-json: {args.topology_json!r} holds a JSON {type(topology).__name__}, not an "
                "object; give `vllm-fleet topology --json`"
            )
        topology = topology.get("topology", topology)
    rendered = render_instance(
        spec, instance, args.vllm_version, model_config=model_config, topology=topology
    )
    result = rendered.to_dict()
    unit = unit_text_for(spec, rendered, instance, variables)
    result["unit_text"] = unit
    command = rendered.shell if args.shell else rendered.exec_start
    lines = [unit if args.unit else command, ""]
    lines += [f"error: {e}" for e in rendered.errors]
    lines += [f"warning: {w}" for w in rendered.warnings]
    emit(result, args.json, "\n".join(lines))
    return 1 if rendered.errors else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "render",
        help="render and validate the vllm serve command of one instance for a vLLM release",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "--vars", required=True, help="YAML file of vllm_service_* variables (e.g. group_vars)"
    )
    parser.add_argument("--vllm-version", required=True, help="target vLLM release, e.g. 0.33.0")
    parser.add_argument(
        "--instance-json", help="layout / gpu_topology fact / instance JSON (default: one GPU instance)"
    )
    parser.add_argument("--instance", help="instance name within --instance-json (default: the first)")
    parser.add_argument("--model-config", help="the model's config.json (enables the capacity checks)")
    parser.add_argument("--topology-json", help="topology JSON (P2P matrix, NUMA memory) for the host checks")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--shell", action="store_true", help="print the command quoted for a POSIX shell")
    shown.add_argument(
        "--unit", action="store_true", help="print the whole systemd unit that would be written"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_handle)
