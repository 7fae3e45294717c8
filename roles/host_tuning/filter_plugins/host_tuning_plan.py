"""Filter `host_tuning_plan`: the host_tuning role's thin adapter over vllm_fleet.plan.tuning."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.host import HostPlan
from vllm_fleet.plan.tuning import (
    TuningOptions,
    boot_commands,
    limits_conf,
    parse_page_size,
    plan_kv_tier_needs,
    plan_tuning,
    report_text,
    runtime_changes,
    sysctl_conf,
    unit_exec_starts,
)
from vllm_fleet.probe.hoststate import parse_host_state


def host_tuning_plan(state_text: str, host_plan: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """Everything the role writes and reports, from the host's state text, its plan and the role's options."""
    try:
        if not isinstance(host_plan, dict) or not host_plan:
            raise FleetInputError(
                "host_tuning_host_plan: no plan for this host; run playbooks/preflight.yml first "
                "(playbooks/tune.yml imports it) so vllm_fleet_plan exists"
            )
        plan_of_host = HostPlan.from_dict(host_plan, where="host_tuning_host_plan")
        state = parse_host_state(state_text)
        tuning_options = TuningOptions(
            page_size_kb=parse_page_size(options["page_size"]),
            margin_fraction=float(options["margin"]),
            max_node_fraction=float(options["max_node_fraction"]),
            thp_enabled=options["thp_enabled"] or None,
            thp_defrag=options["thp_defrag"] or None,
            governor=options["governor"] or None,
            numa_balancing=str(options["numa_balancing"]),
            service_user=options["user"],
            reserve_hugepages=bool(options["hugepages"]),
            shm_huge=options["shm_huge"] or None,
        )
        plan = plan_tuning(state, plan_kv_tier_needs(plan_of_host), tuning_options)
        changes = runtime_changes(plan, state)
        applied = bool(options["applied"])
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc
    return {
        "plan": plan.to_dict(),
        "changes": changes,
        "sysctl_conf": sysctl_conf(plan),
        "limits_conf": limits_conf(plan),
        "exec_starts": unit_exec_starts(plan),
        "boot_commands": boot_commands(plan),
        "kernel_cmdline": plan.kernel_cmdline,
        "shm": plan.to_dict()["shm"],
        "reboot_required": plan.reboot_required,
        "report": report_text(plan, changes, applied),
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"host_tuning_plan": host_tuning_plan}
