"""Filter `host_tuning_plan`: the host_tuning role's thin adapter over vllm_fleet.plan.tuning."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from vllm_fleet import hostvalues
from vllm_fleet.deploy import tuning_state
from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.host import HostPlan
from vllm_fleet.plan.tuning import (
    TuningOptions,
    check_options,
    limits_conf,
    parse_page_size,
    plan_kv_tier_needs,
    plan_tuning,
    report_text,
    runtime_changes,
    sysctl_conf,
    sysfs_write_argv,
    tuning_unit_text,
)
from vllm_fleet.probe.hoststate import parse_host_state


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


def tuning_options(options: dict[str, Any]) -> TuningOptions:
    """The role's options (vars/main.yml __host_tuning_options), each checked and named by its variable."""
    grub = options.get("grub_dropin")
    if grub is not None:
        hostvalues.absolute_path(grub, "host_tuning_grub_dropin", example="/etc/default/grub.d/90-x.cfg")
    checked = TuningOptions(
        page_size_kb=parse_page_size(options["page_size"]),
        margin_fraction=_fraction(options["margin"], "host_tuning_hugepages_margin"),
        max_node_fraction=_fraction(options["max_node_fraction"], "host_tuning_hugepages_max_node_fraction"),
        thp_enabled=_word(options["thp_enabled"], "host_tuning_thp_enabled") or None,
        thp_defrag=_word(options["thp_defrag"], "host_tuning_thp_defrag") or None,
        governor=_word(options["governor"], "host_tuning_cpu_governor") or None,
        numa_balancing=_word(options["numa_balancing"], "host_tuning_numa_balancing"),
        service_user=hostvalues.user_name(options["user"], "host_tuning_memlock_user"),
        reserve_hugepages=bool(options["hugepages"]),
        shm_huge=_word(options["shm_huge"], "host_tuning_shm_huge") or None,
    )
    check_options(checked)
    return checked


def host_tuning_plan(state_text: str, host_plan: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """Everything the role writes and reports, from the host's state text, its plan and the role's options."""
    try:
        checked = tuning_options(options)  # the role's own variables first: they need no plan
        if not isinstance(host_plan, dict) or not host_plan:
            raise FleetInputError(
                "host_tuning_host_plan: no plan for this host; run playbooks/preflight.yml first "
                "(playbooks/tune.yml imports it) so vllm_fleet_plan exists"
            )
        plan_of_host = HostPlan.from_dict(host_plan, where="host_tuning_host_plan")
        state = parse_host_state(state_text)
        plan = plan_tuning(state, plan_kv_tier_needs(plan_of_host), checked)
        changes = runtime_changes(plan, state)
        applied = bool(options["applied"])
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


def host_tuning_decide(
    tuning: dict[str, Any],
    managed: list[dict[str, Any]],
    state: dict[str, Any],
    grub_dropin: str,
    grub_text: str,
    apply_runtime: bool,
) -> dict[str, Any]:
    """What the role changes on the host, from one read of it; every item empty or false when converged."""
    try:
        return tuning_state.decide_host(
            tuning, managed, state, grub_dropin=grub_dropin, grub_text=grub_text, apply_runtime=apply_runtime
        )
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"host_tuning_plan": host_tuning_plan, "host_tuning_decide": host_tuning_decide}
