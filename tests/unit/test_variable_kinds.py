"""vllm_fleet.validate: every role variable has one kind, the roles' own defaults pass every check, and the
host-wide rules (ports, the host name, policies with their opt-ins) refuse what they should.

The bad-input matrix itself (one refusal per case, named variable, shown value, fix) is
tests/unit/test_bad_input_matrix.py with its data in tests/unit/bad_input_cases.yml."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_fleet.plan.inventory import role_variables
from vllm_fleet.validate import host_name_errors, port_errors, variable_errors
from vllm_fleet.validate.table import ACCEPTED, PORTS, SERVE, VARIABLES

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"


def spec_options() -> dict[str, str]:
    """{variable: role} over every entry point of every role's argument spec."""
    options: dict[str, str] = {}
    for spec in sorted(ROLES.glob("*/meta/argument_specs.yml")):
        role = spec.parent.parent.name
        for entry in (yaml.safe_load(spec.read_text())["argument_specs"] or {}).values():
            options.update(dict.fromkeys(entry.get("options") or {}, role))
    return options


def role_defaults() -> dict[str, Any]:
    """Every role's defaults as the roles see them (templated with ansible-core, as preflight does)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar

    init_plugin_loader([str(ROOT)])
    loader = DataLoader()

    def template(value: Any, available: dict[str, Any]) -> Any:
        return Templar(loader=loader, variables=available).template(value)

    return role_variables({}, ROLES, template)[1]


def test_every_variable_of_every_role_has_one_kind() -> None:
    options = spec_options()
    missing = sorted(set(options) - set(VARIABLES))
    assert not missing, (
        f"no kind for {missing}: declare each in src/vllm_fleet/validate/table.py (VARIABLES), by what it "
        "reaches (a path, a package, a URL, a unit...); ACCEPTED only where it reaches nothing"
    )
    stale = sorted(set(VARIABLES) - set(options))
    assert not stale, f"kinds for variables no argument spec has: {stale}"
    assert set(PORTS) <= set(VARIABLES)


def test_what_reaches_a_host_is_checked_by_a_kind_not_only_accepted() -> None:
    """ACCEPTED is for booleans, choices and the plan; a str/path/list/int/float without choices that is
    ACCEPTED must say why in the table (the few listed here)."""
    why = {"fleet_monitoring_gpu_exporter", "gpu_topology_model_config", "host_tuning_host_plan",
           "vllm_rollout_canary", "vllm_service_host_plan", "vllm_service_model_config",
           "vllm_verify_instances", "vllm_verify_prompt"}  # fmt: skip
    loose = []
    for spec in ROLES.glob("*/meta/argument_specs.yml"):
        for entry in yaml.safe_load(spec.read_text())["argument_specs"].values():
            for name, option in (entry.get("options") or {}).items():
                if option.get("type") != "bool" and not option.get("choices") and VARIABLES[name] is ACCEPTED:
                    loose.append(name)
    assert sorted(set(loose) - why) == []
    assert all(name.startswith("vllm_service_") for name, kind in VARIABLES.items() if kind is SERVE)


def test_the_roles_own_defaults_pass_every_check() -> None:
    assert variable_errors("gpu-01", role_defaults()) == []


def test_the_lab_inventorys_values_pass_every_check() -> None:
    lab = yaml.safe_load((ROOT / "inventory" / "group_vars" / "lab" / "vllm.yml").read_text())
    lab = {k: v for k, v in lab.items() if "{{" not in str(v)}
    assert variable_errors("lab-1", {**role_defaults(), **lab}) == []


@pytest.mark.parametrize("host", ["gpu-01", "10.0.0.5", "gpu-01.example.com", "h200_a", "fe80::1"])
def test_plain_host_names_name_report_files(host: str) -> None:
    assert host_name_errors(host) == []


@pytest.mark.parametrize("host", ["../../escape-host", "a/b", "..", "gpu 01", "gpu\n01", ""])
def test_host_names_that_leave_the_report_folder_are_refused(host: str) -> None:
    (message,) = host_name_errors(host)
    assert message.startswith(f"inventory host name: {host!r}") and "rename the host" in message


def test_ports_of_one_host_are_unique_across_vllm_and_the_exporters() -> None:
    assert port_errors({"vllm_service_port": None, "fleet_monitoring_node_exporter_port": 9100}) == []
    (clash,) = port_errors({"vllm_service_port": 9100, "fleet_monitoring_node_exporter_port": 9100})
    assert clash.startswith("fleet_monitoring_node_exporter_port: 9100 is also where vLLM")
    assert "vllm_service_port: 9100" in clash and "a port of its own" in clash
    # unset, vLLM listens on 8000: the exporter may not
    (clash,) = port_errors({"fleet_monitoring_gpu_exporter_port": 8000})
    assert "fleet_monitoring_gpu_exporter_port: 8000" in clash and "vllm_service_port: 8000" in clash
    # the layout's later instances (8001) count too, once the plan knows them
    (clash,) = port_errors({"fleet_monitoring_node_exporter_port": 8001}, vllm_ports=[8000, 8001])
    assert clash.startswith("fleet_monitoring_node_exporter_port: 8001")
    assert port_errors({"fleet_monitoring_node_exporter_port": 8001}) == []


def test_each_policy_is_lifted_by_its_opt_in_only() -> None:
    defaults = role_defaults()
    cases = [
        ("vllm_service_user", "root", "vllm_service_allow_root_user"),
        ("vllm_install_user", "root", "vllm_install_allow_root_user"),
        ("vllm_service_cache_dir", "/etc", "vllm_service_allow_system_paths"),
        ("vllm_install_model_path", "/usr", "vllm_install_allow_system_paths"),
        ("vllm_rollout_history_dir", "/var", "vllm_rollout_allow_system_paths"),
        ("fleet_monitoring_deb_cache", "/boot", "fleet_monitoring_allow_system_paths"),
        ("vllm_verify_address", "attacker.example.com", "vllm_verify_allow_remote_address"),
    ]
    for variable, value, opt_in in cases:
        refused = variable_errors("gpu-01", {**defaults, variable: value})
        assert len(refused) == 1 and refused[0].startswith(f"{variable}: {value!r}"), refused
        assert f"set {opt_in}: true" in refused[0]
        for yes in (True, "true", "True"):
            assert variable_errors("gpu-01", {**defaults, variable: value, opt_in: yes}) == []


def test_a_verify_address_on_the_instances_own_host_passes() -> None:
    defaults = role_defaults()
    for address in ("127.0.0.1", "::1", "localhost", "gpu-01", "10.0.0.5"):
        assert (
            variable_errors(
                "gpu-01", {**defaults, "vllm_verify_address": address}, own_addresses=["10.0.0.5"]
            )
            == []
        )
    bound = {**defaults, "vllm_service_host": "192.168.7.3", "vllm_verify_address": "192.168.7.3"}
    assert variable_errors("gpu-01", bound) == []


HOSTILE = [None, "", {}, [], True, 1e308, -1, 2**70, float("nan"), "x" * 100_000, {"a": 1}, ["\n"], "\x00",
           "\x1b]0;title\x07", [None], [{}], "../..", "/", 3.5]  # fmt: skip


def test_no_value_of_any_kind_raises_anything_but_a_refusal() -> None:
    """Each kind answers any YAML value with a list of messages (possibly empty), never an exception: a
    traceback would hide which variable was wrong."""
    defaults = role_defaults()
    for name in VARIABLES:
        for value in HOSTILE:
            errors = variable_errors("gpu-01", {**defaults, name: value})
            assert all(isinstance(e, str) and "\n" not in e for e in errors), (name, value, errors)
            assert all("\x1b" not in e and "\x00" not in e for e in errors), (name, value, errors)


def test_plan_inventory_refuses_a_host_by_its_variables_without_planning_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`vllm-fleet plan --inventory` runs the check preflight runs: a host whose name would leave the report
    folder and whose install user is root is not planned (no facts are even read), every refusal listed."""
    from vllm_fleet.cli import main as cli_main

    inventory = tmp_path / "hosts.yml"
    host = {"vllm_install_user": "root", "gpu_topology_recorded_dir": str(tmp_path / "no-such-folder")}
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"../../escape-host": host}}}))
    assert cli_main(["plan", "--inventory", str(inventory), "--json"]) == 1
    (plan,) = json.loads(capsys.readouterr().out)["hosts"].values()
    assert plan["source"] == "not planned" and plan["instances"] == [] and not plan["ok"]
    named = [e.split(":")[0] for e in plan["errors"]]
    assert named == [
        "inventory host name",
        "vllm_install_user",
        "vllm_install_group",  # both derive from vllm_install_user
        "vllm_service_user",
        "vllm_service_group",
    ]
    assert "set vllm_install_allow_root_user: true" in plan["errors"][1]


def test_a_template_that_cannot_be_rendered_is_named_not_raised(tmp_path: Path) -> None:
    from vllm_fleet.errors import FleetInputError
    from vllm_fleet.plan.inventory import plan_inventory

    inventory = tmp_path / "hosts.yml"
    missing = tmp_path / "no-such-key"
    host = {"vllm_service_api_key": f"{{{{ lookup('ansible.builtin.file', '{missing}') }}}}"}
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gpu-01": host}}}))
    refused = r": host gpu-01: vllm_service_api_key: its template cannot be rendered \("
    with pytest.raises(FleetInputError, match=refused):
        plan_inventory(str(inventory), project_dir=ROOT)
