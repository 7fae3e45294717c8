"""The gpu_topology_facts action plugin, driven with command outputs recorded on real hardware.

No GPU exists on the test machine, so the plugin's one call to the host (`_execute_module` running the
collection's vllm_fleet_host_state module with every probe command) is replaced by a lookup in recorded
outputs: `tests/fixtures/topology/recorded/h200x2/` was captured on a real 2 x H200 host by running exactly
`vllm_fleet.probe.topology.RECORDED_COMMANDS`, and `tests/fixtures/probe/host-state-h200x2-vm.txt` by running
the role's host-state command there. The live run
of `playbooks/probe.yml` on that machine (tests/fixtures/probe/h200x2-live/) must give the same plan.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from ansible.errors import AnsibleActionFail
from ansible.parsing.dataloader import DataLoader
from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task
from ansible.template import Templar

from vllm_fleet.probe.topology import RECORDED_COMMANDS, STAND_IN_FILE, recorded_source

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "topology" / "recorded"
PROBE = ROOT / "tests" / "fixtures" / "probe"
HOST_STATE_CMD = "read host state"

_spec = importlib.util.spec_from_file_location("gpu_facts", ROOT / "plugins/action/gpu_topology_facts.py")
assert _spec and _spec.loader
plugin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plugin)


def make_action(args: dict[str, Any], outputs: dict[str, tuple[int, str, str]] | None) -> Any:
    task = Task()
    task.args = args
    loader = DataLoader()
    action = plugin.ActionModule(task, mock.MagicMock(), PlayContext(), loader, Templar(loader=loader), None)
    calls: list[str] = []
    executions: list[int] = []

    def execute_module(module_name: str, module_args: dict[str, Any], task_vars: dict, **_: Any) -> dict:
        # every command in one call of the host-state module (one round trip)
        assert module_name == "vllm_fleet.serving.vllm_fleet_host_state"
        assert set(module_args) == {"commands"}
        ran = {}
        for name, cmd in module_args["commands"].items():
            calls.append(cmd)
            if outputs is None:
                raise AssertionError(f"the host was asked to run {cmd!r}")
            rc, out, err = outputs[cmd]
            ran[name] = {"rc": rc, "stdout": out, "stderr": err}
        executions.append(len(ran))
        return {"changed": False, "commands": ran}

    action._execute_module = execute_module
    action.calls = calls
    action.executions = executions
    return action


def recorded_outputs(folder: str) -> dict[str, tuple[int, str, str]]:
    outputs = {}
    for name, cmd in RECORDED_COMMANDS.items():
        path = RECORDED / folder / name
        outputs[cmd] = (0, path.read_text(), "") if path.exists() else (127, "", f"sh: 1: {cmd}: not found")
    outputs[HOST_STATE_CMD] = (0, (PROBE / "host-state-h200x2-vm.txt").read_text(), "")
    return outputs


def run(action: Any) -> dict[str, Any]:
    return action.run(task_vars={"inventory_hostname": "gpu-host"})


def test_live_probe_of_the_recorded_h200x2_host() -> None:
    action = make_action({"host_state_cmd": HOST_STATE_CMD}, recorded_outputs("h200x2"))
    result = run(action)
    fact = result["ansible_facts"]["gpu_topology"]
    assert result["changed"] is False
    assert action.calls == [*RECORDED_COMMANDS.values(), HOST_STATE_CMD]
    assert action.executions == [len(RECORDED_COMMANDS) + 1]  # one round trip for the whole probe
    topo, layout = fact["topology"], fact["layout"]
    assert fact["cpu_only"] is False and fact["source"] == "probed live"
    assert [g["name"] for g in topo["gpus"]] == ["NVIDIA H200", "NVIDIA H200"]
    assert topo["links"] == [["X", "NV18"], ["NV18", "X"]]
    assert topo["p2p"] == [["X", "OK"], ["OK", "X"]]
    assert topo["numa_known"] is False  # sysfs numa_node is -1 inside this VM
    [inst] = layout["instances"]
    assert inst["gpus"] == [0, 1] and inst["tensor_parallel_size"] == 2
    assert inst["numa_binding"]["mode"] == "none"
    assert inst["disable_custom_all_reduce"] is False
    assert fact["hugepages"] == [
        {"node": 0, "page_size_kb": 2048, "pages": 0},
        {"node": 0, "page_size_kb": 1048576, "pages": 0},
    ]
    report = fact["report"]
    assert report.startswith("== gpu-host (probed live)")
    assert "NV18 = a bonded set of 18 NVLinks" in report
    assert "node 0: 0 x 2 MiB" in report


def test_the_live_run_on_the_real_h200_machine_planned_the_same() -> None:
    live = json.loads((PROBE / "h200x2-live" / "probe-report.json").read_text())
    fact = run(make_action({"host_state_cmd": HOST_STATE_CMD}, recorded_outputs("h200x2")))["gpu_topology"]
    assert live["cpu_only"] is False and live["source"] == "probed live"
    assert live["topology"]["links"] == fact["topology"]["links"]
    assert live["topology"]["p2p"] == fact["topology"]["p2p"]
    assert live["topology"]["numa_known"] is False

    # the plan itself, not its prose (the planner's wording may improve after the capture)
    def plan(instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in i.items() if k not in ("reasons", "warnings")} for i in instances]

    assert plan(live["layout"]["instances"]) == plan(fact["layout"]["instances"])


def test_host_without_nvidia_smi_is_a_cpu_only_host() -> None:
    outputs = recorded_outputs("h200x2")
    for cmd in RECORDED_COMMANDS.values():
        if cmd.startswith("nvidia-smi"):
            outputs[cmd] = (127, "", "/bin/sh: 1: nvidia-smi: not found")
    fact = run(make_action({}, outputs))["gpu_topology"]
    assert fact["cpu_only"] is True
    [inst] = fact["layout"]["instances"]
    assert inst["gpus"] == [] and inst["device"] == "cpu"
    assert "nvidia-smi is not installed" in fact["report"]
    assert "CPU-only host" in fact["report"].splitlines()[0]


def test_nvidia_smi_that_fails_is_refused_not_planned_as_cpu() -> None:
    outputs = recorded_outputs("h200x2")
    failing = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    outputs[RECORDED_COMMANDS["topo-m.txt"]] = (9, failing, "")
    with pytest.raises(AnsibleActionFail, match=r"driver is installed but not working.*install\.yml"):
        run(make_action({}, outputs))


def test_a_stand_in_recording_says_so_first(tmp_path: Path) -> None:
    stand_in = tmp_path / "recorded"
    shutil.copytree(RECORDED / "8x4090-dual-socket", stand_in)
    why = "an 8 x 4090 box stands in for a 4 x 4090 one"
    (stand_in / STAND_IN_FILE).write_text(f"\n{why}\n# how to replace it\n")
    fact = run(make_action({"recorded_dir": str(stand_in)}, None))["gpu_topology"]
    assert fact["source"] == f"STAND-IN, not this host's hardware: {why}; recorded: {stand_in}"
    assert recorded_source(RECORDED / "h200x2") == f"recorded: {RECORDED / 'h200x2'}"


def test_a_failing_optional_command_is_left_out_with_a_note() -> None:
    outputs = recorded_outputs("h200x2")
    outputs[RECORDED_COMMANDS["numactl-H.txt"]] = (127, "", "/bin/sh: 1: numactl: not found")
    fact = run(make_action({}, outputs))["gpu_topology"]
    assert "numactl --hardware: not installed here" in fact["notes"]
    assert fact["cpu_only"] is False


def test_recorded_dir_plans_without_touching_the_host() -> None:
    action = make_action({"recorded_dir": str(RECORDED / "8x4090-dual-socket")}, None)
    fact = run(action)["gpu_topology"]
    assert action.calls == []
    assert fact["source"] == f"recorded: {RECORDED / '8x4090-dual-socket'}"  # a capture of that very host
    instances = fact["layout"]["instances"]
    plan = [(i["gpus"], i["numa_binding"]["mode"], i["numa_binding"]["nodes"]) for i in instances]
    assert plan == [([0, 1, 2, 3], "numactl", [0]), ([4, 5, 6, 7], "numactl", [1])]


def test_missing_recorded_dir_names_the_folder() -> None:
    with pytest.raises(AnsibleActionFail, match="recorded-hardware folder '/nonexistent/x' does not exist"):
        run(make_action({"recorded_dir": "/nonexistent/x"}, None))


def test_module_documentation_is_valid_yaml_for_ansible_doc() -> None:
    import ast

    import yaml

    tree = ast.parse((ROOT / "plugins" / "modules" / "gpu_topology_facts.py").read_text())
    docs = {n.targets[0].id: n.value.value for n in tree.body if isinstance(n, ast.Assign)}
    assert set(docs) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}
    parsed = {k: yaml.safe_load(v) for k, v in docs.items()}
    assert set(parsed["DOCUMENTATION"]["options"]) == set(plugin.ARGUMENT_SPEC)
    assert set(parsed["RETURN"]["gpu_topology"]["contains"]) >= {"topology", "layout", "cpu_only", "report"}
