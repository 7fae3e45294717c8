"""Filter `host_tuning_plan`: the host_tuning role's thin adapter over vllm_fleet.plan.tuning."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.tuning import (
    TuningOptions,
    boot_commands,
    kv_tier_needs,
    limits_conf,
    parse_host_state,
    parse_page_size,
    plan_tuning,
    report_text,
    runtime_changes,
    sysctl_conf,
    unit_exec_starts,
)
from vllm_fleet.sizes import parse_size


def _kv_bytes(value: Any) -> int | dict[str, int]:
    if isinstance(value, dict):
        return {str(k): parse_size(v, f"host_tuning_cpu_kv_bytes[{k}]") for k, v in value.items()}
    return parse_size(value if value not in (None, "") else 0, "host_tuning_cpu_kv_bytes")


def host_tuning_plan(
    state_text: str,
    layout: dict[str, Any],
    *,
    cpu_kv_bytes: Any = 0,
    hugepages: bool = False,
    page_size: str = "2M",
    margin: float = 0.10,
    max_node_fraction: float = 0.90,
    thp_enabled: str = "",
    thp_defrag: str = "",
    governor: str = "",
    shm_huge: str = "",
    numa_balancing: str = "auto",
    user: str = "vllm",
    applied: bool = True,
) -> dict[str, Any]:
    """Everything the role writes and reports, from the host's state text and the layout."""
    try:
        if not isinstance(layout, dict) or not layout.get("instances"):
            raise FleetInputError(
                f"host_tuning_layout: {layout!r} has no instances; run the gpu_topology role "
                "(playbooks/probe.yml, or playbooks/tune.yml which includes it) so gpu_topology.layout exists"
            )
        state = parse_host_state(state_text)
        options = TuningOptions(
            page_size_kb=parse_page_size(page_size),
            margin_fraction=float(margin),
            max_node_fraction=float(max_node_fraction),
            thp_enabled=thp_enabled or None,
            thp_defrag=thp_defrag or None,
            governor=governor or None,
            numa_balancing=str(numa_balancing),
            service_user=user,
            reserve_hugepages=bool(hugepages),
            shm_huge=shm_huge or None,
        )
        needs = kv_tier_needs(layout, _kv_bytes(cpu_kv_bytes))
        plan = plan_tuning(state, needs, options)
        changes = runtime_changes(plan, state)
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
