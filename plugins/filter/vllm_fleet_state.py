"""Filters over one read of the host (the module vllm_fleet_host_state): thin adapters over
`vllm_fleet.deploy.filestate`."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from vllm_fleet.deploy import filestate
from vllm_fleet.errors import FleetInputError


def vllm_fleet_drifted(
    items: list[dict[str, Any]], host_state: dict[str, Any], path_key: str = "path"
) -> list[dict[str, Any]]:
    """The items whose file or directory on the host differs from the plan (empty when converged)."""
    try:
        return filestate.drifted(items, host_state.get("files", {}), path_key=path_key)
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def vllm_fleet_file_writes(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The files of `items` as the module vllm_fleet_files writes them (path, content, mode, owner, group)."""
    try:
        return filestate.file_writes(items)
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_drifted": vllm_fleet_drifted, "vllm_fleet_file_writes": vllm_fleet_file_writes}
