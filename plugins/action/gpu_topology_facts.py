"""Action plugin: GPU/NUMA topology facts and the instance layout of one host.

Thin by design: on the host it runs only the stock `ansible.builtin.command` module, once per command of
`vllm_fleet.probe.topology.RECORDED_COMMANDS` (nvidia-smi topo -m / -p2p r / -p2p w / --query-gpu, numactl
--hardware, lscpu, sysfs numa_node) plus the host_tuning state read (hugepages per node); or, with
`recorded_dir`, it reads those files from a folder on the controller instead. Parsing and planning happen
here, on the controller, in `vllm_fleet.probe.topology`, `vllm_fleet.plan.layout` and
`vllm_fleet.probe.outputs`. Changes
nothing.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.layout import plan_layout, probe_report
from vllm_fleet.probe.hoststate import parse_host_state
from vllm_fleet.probe.outputs import CommandResult, select_outputs
from vllm_fleet.probe.topology import (
    RECORDED_COMMANDS,
    build_topology_from_texts,
    read_recorded_dir,
    recorded_source,
)

ARGUMENT_SPEC = {
    "recorded_dir": {"type": "path"},
    "tensor_parallel_size": {"type": "int"},
    "model_config": {"type": "dict", "default": {}},
    "vllm_version": {"type": "str"},
    "base_port": {"type": "int", "default": 8000},
    "host_state_cmd": {"type": "str"},
    # false: facts only (preflight's plan lays the instances out, once); true: probe.yml's own report
    "plan_layout": {"type": "bool", "default": True},
}


HOST_STATE_KEY = "host-state"  # the role's host-state command, beside the recorded commands


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def _run_commands(
        self, commands: dict[str, str], task_vars: dict
    ) -> dict[str, tuple[int | None, str, str]]:
        """Name -> (rc, stdout, stderr) of each command, all in one module call (one round trip, issue 21);
        rc None when the command does not exist on the host.

        Through /bin/sh, so that a missing binary is the status 127 (the sysfs read needs a glob anyway);
        the commands are fixed strings of vllm_fleet.probe.topology, nothing from the inventory.
        """
        res = self._execute_module(
            module_name="vllm_fleet.serving.vllm_fleet_host_state",
            module_args={"commands": commands},
            task_vars=task_vars,
        )
        ran = res.get("commands")
        if res.get("failed") or not isinstance(ran, dict):
            raise AnsibleActionFail(f"could not run the probe commands on the host: {res.get('msg')}")
        out: dict[str, tuple[int | None, str, str]] = {}
        for name in commands:
            got = ran.get(name) or {}
            rc, stderr = got.get("rc"), got.get("stderr") or ""
            out[name] = (None, "", stderr) if rc == 127 else (rc, got.get("stdout") or "", stderr)
        return out

    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        host = task_vars.get("inventory_hostname", "host")
        host_state = None
        try:
            if args.get("recorded_dir"):
                texts = read_recorded_dir(args["recorded_dir"])
                notes = [f"planned from recorded outputs in {args['recorded_dir']}, not from this host"]
                source = recorded_source(args["recorded_dir"])
            else:
                commands = dict(RECORDED_COMMANDS)
                if args.get("host_state_cmd"):
                    commands[HOST_STATE_KEY] = args["host_state_cmd"]
                ran = self._run_commands(commands, task_vars)
                results = [
                    CommandResult(name=name, rc=ran[name][0], stdout=ran[name][1], stderr=ran[name][2])
                    for name in RECORDED_COMMANDS
                ]
                inputs = select_outputs(results)
                texts, notes = inputs.texts, inputs.notes
                source = "probed live"
                if HOST_STATE_KEY in ran and ran[HOST_STATE_KEY][0] == 0:
                    host_state = parse_host_state(ran[HOST_STATE_KEY][1])
            topology = build_topology_from_texts(texts)
            config = args.get("model_config") or {}
            layout = None
            if args["plan_layout"]:
                layout = plan_layout(
                    topology,
                    args.get("tensor_parallel_size"),
                    model_config=config,
                    vllm_version=args.get("vllm_version") or None,
                    base_port=args["base_port"],
                )
        except FleetInputError as exc:
            raise AnsibleActionFail(f"gpu_topology on {host}: {exc}") from exc
        topo_dict = topology.to_dict()
        report = ""
        if layout is not None:
            report = probe_report(
                host,
                topology,
                layout,
                cpu_only=topology.cpu_only,
                source=source,
                notes=notes,
                host_state=host_state,
            )
        fact = {
            "topology": topo_dict,
            "layout": layout.to_dict() if layout is not None else None,
            "cpu_only": topology.cpu_only,
            "report": report,
            "source": source,
            "notes": notes,
            "hugepages": [
                {"node": node, "page_size_kb": size, "pages": count}
                for (node, size), count in sorted((host_state.hugepages if host_state else {}).items())
            ],
        }
        result.update(changed=False, ansible_facts={"gpu_topology": fact}, gpu_topology=fact)
        return result
