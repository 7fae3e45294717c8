"""Filters of the vllm_service role: thin adapters over vllm_fleet.deploy.service (the decisions)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from vllm_fleet.deploy import argvcheck, filestate
from vllm_fleet.deploy.service import (
    ServiceOptions,
    decide,
    digest_items,
    drained_restarts,
    env_items,
    env_sha256,
    group_restarts,
    instance_files,
    managed_items,
    restarting_peers,
    shm_shortfall,
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


def vllm_service_group_restart(
    todo: dict[str, Any], files: list[dict[str, Any]], hostvars: Any, batch: list[str]
) -> dict[str, Any]:
    """`todo` (vllm_service_decide's) with every rank of a multi-host instance restarting when another of
    its ranks does (each peer's own decision, read from `hostvars`); only the peers in `batch`
    (`ansible_play_batch`) count: a peer outside it, or its decision from an earlier play, is left out."""
    peers = {peer for f in files for peer in ((f["plan"].get("node") or {}).get("nodes") or [])}
    todos = {peer: hostvars[peer].get("__vllm_service_todo") for peer in peers if peer in hostvars}
    restarting = restarting_peers(files, todos, batch)
    return {**todo, "restart": group_restarts(list(todo["restart"]), files, restarting)}


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


def vllm_service_managed(
    files: list[dict[str, Any]], *, dirs: list[dict[str, Any]], home_root: str, user: str, group: str
) -> list[dict[str, Any]]:
    """The directories, plans and units the role keeps (no environment file), as vllm_fleet_drifted items."""
    try:
        return managed_items(
            list(files or []), dirs=list(dirs or []), home_root=home_root, user=user, group=group
        )
    except KeyError as exc:
        raise AnsibleFilterError(
            f"vllm_service_managed: an instance has no {exc} (vllm_service_files)"
        ) from exc


def vllm_service_env_sha256(files: list[dict[str, Any]]) -> dict[str, str]:
    """EnvironmentFile path -> sha256 of its text, for vllm_fleet_host_state's compare_sha256 (no_log)."""
    return env_sha256(list(files or []))


def vllm_service_env_drifted(files: list[dict[str, Any]], host_state: dict[str, Any]) -> list[dict[str, Any]]:
    """The environment files (with their secrets: loop over this with no_log) that differ on the host."""
    try:
        return filestate.drifted(env_items(list(files or [])), (host_state or {}).get("files") or {})
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def vllm_service_digests(files: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    """The applied digests of the instances `names` (just restarted) as items to write (root, 0600)."""
    return digest_items(list(files or []), list(names or []))


def vllm_service_decide(
    files: list[dict[str, Any]],
    host_state: dict[str, Any],
    *,
    items: list[dict[str, Any]],
    unit_glob: str = "",
) -> dict[str, Any]:
    """One read of the host -> writes, restart, stale, enable, reload (vllm_fleet.deploy.service.decide)."""
    try:
        return decide(list(files or []), host_state or {}, items=list(items or []), unit_glob=unit_glob)
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc
    except KeyError as exc:
        raise AnsibleFilterError(
            f"vllm_service_decide: an instance has no {exc} (vllm_service_files)"
        ) from exc


def vllm_service_restart_paths(
    todo: dict[str, Any], files: list[dict[str, Any]], drained: bool
) -> dict[str, list[dict[str, Any]]]:
    """`todo`'s (re)starts split into those that leave the gateway first (`drained`) and the rest (`now`)."""
    return drained_restarts(todo.get("restart") or [], files, drained)


def vllm_service_argv_checks(todo: dict[str, Any], files: list[dict[str, Any]]) -> dict[str, Any]:
    """The argv check's input: every instance that (re)starts, checked in one run (one import of vLLM)."""
    try:
        return argvcheck.check_input(list(files or []), list(todo.get("restart") or []))
    except KeyError as exc:
        raise AnsibleFilterError(f"vllm_service_argv_checks: an instance has no {exc}") from exc


def vllm_service_argv_rejected(result: dict[str, Any], check_mode: bool) -> list[str]:
    """Each serve command the check task's result says vLLM rejected, as "name: vLLM's message"."""
    return argvcheck.rejections(result or {}, bool(check_mode))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "vllm_service_files": vllm_service_files,
            "vllm_service_same_release": vllm_service_same_release,
            "vllm_service_shm_shortfall": vllm_service_shm_shortfall,
            "vllm_service_managed": vllm_service_managed,
            "vllm_service_env_sha256": vllm_service_env_sha256,
            "vllm_service_env_drifted": vllm_service_env_drifted,
            "vllm_service_decide": vllm_service_decide,
            "vllm_service_digests": vllm_service_digests,
            "vllm_service_group_restart": vllm_service_group_restart,
            "vllm_service_restart_paths": vllm_service_restart_paths,
            "vllm_service_argv_checks": vllm_service_argv_checks,
            "vllm_service_argv_rejected": vllm_service_argv_rejected,
        }
