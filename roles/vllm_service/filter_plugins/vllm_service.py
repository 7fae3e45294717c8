"""Filters of the vllm_service role: thin adapters over vllm_fleet.deploy.service (where the decisions
are)."""

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
)
from vllm_fleet.errors import FleetInputError
from vllm_fleet.sizes import parse_size


def vllm_service_files(
    rendered: list[dict[str, Any]],
    layout: dict[str, Any],
    *,
    options: dict[str, Any],
    extra_env: dict[str, Any] | None = None,
    secret_env: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Unit, EnvironmentFile, plan and digest of every rendered instance (in layout order)."""
    try:
        opts = ServiceOptions(
            **{
                **options,
                "read_write_paths": tuple(options.get("read_write_paths") or ()),
                "after": tuple(options.get("after") or ServiceOptions.after),
            }
        )
        by_name = {str(i.get("name")): i for i in (layout or {}).get("instances") or []}
        out = []
        for r in rendered:
            name = str(r.get("name"))
            if name not in by_name:
                raise FleetInputError(
                    f"rendered instance {name} is not in the layout {sorted(by_name)}; re-run the probe"
                )
            files = instance_files(
                r, by_name[name], options=opts, extra_env=extra_env or {}, secret_env=secret_env or {}
            )
            out.append(files.to_dict())
        return out
    except (FleetInputError, TypeError) as exc:
        raise AnsibleFilterError(f"vllm_service: {exc}") from exc


def vllm_service_restart_list(
    files: list[dict[str, Any]], applied: dict[str, str], active: dict[str, str]
) -> list[dict[str, str]]:
    # the looped-over copies carry no env_text (secrets stay out of loop results)
    return restart_list([InstanceFiles(**{"env_text": "", **f}) for f in files], applied or {}, active or {})


def vllm_service_shm_shortfall(findmnt_size: str, tier: Any, instances: int, vllm_version: str) -> str:
    """`findmnt -bn -o SIZE --mountpoint /dev/shm` (the top mount last) -> '' or why the tiers do not fit."""
    try:
        sizes = [line.strip() for line in (findmnt_size or "").splitlines() if line.strip().isdigit()]
        tier_bytes = parse_size(tier, "vllm_service_kv_offload_cpu_bytes") if tier not in (None, "") else 0
        return shm_shortfall(tier_bytes, int(instances), int(sizes[-1]) if sizes else None, str(vllm_version))
    except FleetInputError as exc:
        raise AnsibleFilterError(f"vllm_service: {exc}") from exc


def vllm_service_stale(markers_text: str, wanted: list[str]) -> list[str]:
    return stale_instances(parse_markers(markers_text or ""), list(wanted or []))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "vllm_service_files": vllm_service_files,
            "vllm_service_restart_list": vllm_service_restart_list,
            "vllm_service_stale": vllm_service_stale,
            "vllm_service_shm_shortfall": vllm_service_shm_shortfall,
        }
