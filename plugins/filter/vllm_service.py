"""Filters of the vllm_service role: thin adapters over vllm_fleet.deploy.service (the decisions)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from vllm_fleet.deploy.service import (
    InstanceFiles,
    ServiceOptions,
    instance_files,
    parse_markers,
    restart_list,
    shm_shortfall,
    stale_instances,
    with_drifted,
)
from vllm_fleet.errors import FleetInputError
from vllm_fleet.flags import public_version
from vllm_fleet.plan.host import HostPlan


def vllm_service_files(
    host_plan: dict[str, Any],
    *,
    options: dict[str, Any],
    secret_env: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Unit, EnvironmentFile, plan and digest of every instance of the host's plan (in plan order)."""
    try:
        opts = ServiceOptions(
            **{
                **options,
                "read_write_paths": tuple(options.get("read_write_paths") or ()),
                "after": tuple(options.get("after") or ServiceOptions.after),
            }
        )
        plan = HostPlan.from_dict(host_plan, where="vllm_service_host_plan")
        return [
            instance_files(instance, options=opts, secret_env=secret_env or {}).to_dict()
            for instance in plan.instances
        ]
    except (FleetInputError, TypeError) as exc:
        raise AnsibleFilterError(f"vllm_service: {exc}") from exc


def vllm_service_restart_list(
    files: list[dict[str, Any]], applied: dict[str, str], active: dict[str, str]
) -> list[dict[str, str]]:
    # the looped-over copies carry no env_text (secrets stay out of loop results)
    return restart_list([InstanceFiles(**{"env_text": "", **f}) for f in files], applied or {}, active or {})


def vllm_service_shm_shortfall(findmnt_size: str, host_plan: dict[str, Any]) -> str:
    """`findmnt -bn -o SIZE --mountpoint /dev/shm` (the top mount last) -> '' or why the tiers do not fit."""
    try:
        plan = HostPlan.from_dict(host_plan, where="vllm_service_host_plan")
        sizes = [line.strip() for line in (findmnt_size or "").splitlines() if line.strip().isdigit()]
        return shm_shortfall(plan.needs.shm_bytes, int(sizes[-1]) if sizes else None, plan.vllm_version)
    except FleetInputError as exc:
        raise AnsibleFilterError(f"vllm_service: {exc}") from exc


def vllm_service_same_release(installed: str, planned: str) -> bool:
    """Whether the installed vLLM (0.32.0+cpu) is the planned release (0.32.0): public parts compared."""
    return bool(installed) and public_version(installed) == public_version(planned)


def vllm_service_with_drifted(
    todo: list[dict[str, str]], unit_writes: list[dict[str, Any]]
) -> list[dict[str, str]]:
    """The restart list plus the instances whose unit file the write changed (`register` of the copy loop)."""
    drifted = [(r["item"]["name"], r["item"]["unit_name"]) for r in unit_writes or [] if r.get("changed")]
    return with_drifted(list(todo or []), drifted)


def vllm_service_stale(markers_text: str, wanted: list[str]) -> list[str]:
    return stale_instances(parse_markers(markers_text or ""), list(wanted or []))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "vllm_service_files": vllm_service_files,
            "vllm_service_restart_list": vllm_service_restart_list,
            "vllm_service_stale": vllm_service_stale,
            "vllm_service_same_release": vllm_service_same_release,
            "vllm_service_with_drifted": vllm_service_with_drifted,
            "vllm_service_shm_shortfall": vllm_service_shm_shortfall,
        }
