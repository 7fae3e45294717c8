"""Filter `host_tuning_plan`: the host_tuning role's thin adapter over vllm_fleet.plan.tuning."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from vllm_fleet import hostvalues
from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.tuning import (
    TuningOptions,
    kv_tier_needs,
    limits_conf,
    parse_host_state,
    parse_page_size,
    plan_tuning,
    report_text,
    runtime_changes,
    sysctl_conf,
    sysfs_write_argv,
    tuning_unit_text,
)
from vllm_fleet.sizes import parse_size


def _kv_bytes(value: Any) -> int | dict[str, int]:
    if isinstance(value, dict):
        return {str(k): parse_size(v, f"host_tuning_cpu_kv_bytes[{k}]") for k, v in value.items()}
    return parse_size(value if value not in (None, "") else 0, "host_tuning_cpu_kv_bytes")


def _fraction(value: Any, variable: str) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    except (TypeError, ValueError):
        raise FleetInputError(f"{variable}: {value!r} is not a number; give e.g. 0.1") from None


def _word(value: Any, variable: str) -> str:
    """A plain setting ('' leaves it): never a list, a mapping or a line break."""
    if value in (None, ""):
        return ""
    if isinstance(value, (dict, list, bool)):
        raise FleetInputError(f"{variable}: {value!r} is not a plain string; give one word or ''")
    return hostvalues.no_control(value, variable, fix="give one word or ''")


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
    grub_dropin: str = "/etc/default/grub.d/90-vllm-fleet.cfg",
) -> dict[str, Any]:
    """Everything the role writes and reports, from the host's state text and the layout."""
    try:
        if not isinstance(layout, dict) or not layout.get("instances"):
            raise FleetInputError(
                f"host_tuning_layout: {layout!r} has no instances; run the gpu_topology role "
                "(playbooks/probe.yml, or playbooks/tune.yml which includes it) so gpu_topology.layout exists"
            )
        state = parse_host_state(state_text)
        hostvalues.absolute_path(
            grub_dropin, "host_tuning_grub_dropin", example="/etc/default/grub.d/90-x.cfg"
        )
        options = TuningOptions(
            page_size_kb=parse_page_size(page_size),
            margin_fraction=_fraction(margin, "host_tuning_hugepages_margin"),
            max_node_fraction=_fraction(max_node_fraction, "host_tuning_hugepages_max_node_fraction"),
            thp_enabled=_word(thp_enabled, "host_tuning_thp_enabled") or None,
            thp_defrag=_word(thp_defrag, "host_tuning_thp_defrag") or None,
            governor=_word(governor, "host_tuning_cpu_governor") or None,
            numa_balancing=_word(numa_balancing, "host_tuning_numa_balancing"),
            service_user=hostvalues.user_name(user, "host_tuning_memlock_user"),
            reserve_hugepages=bool(hugepages),
            shm_huge=_word(shm_huge, "host_tuning_shm_huge") or None,
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
        "unit_text": tuning_unit_text(plan),
        "sysfs_argv": sysfs_write_argv(plan),
        "kernel_cmdline": plan.kernel_cmdline,
        "shm": plan.to_dict()["shm"],
        "reboot_required": plan.reboot_required,
        "report": report_text(plan, changes, applied),
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"host_tuning_plan": host_tuning_plan}
