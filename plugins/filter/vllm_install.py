"""Filters for the vllm_install role: thin adapters over `vllm_fleet.deploy.vllm_install`."""

from __future__ import annotations

import base64
from typing import Any

from ansible.errors import AnsibleFilterError

from vllm_fleet.deploy import vllm_install
from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.model_config import parse_model_config


def vllm_install_plan(
    package: str,
    version: Any,
    python: str,
    index_url: str = "",
    extra_index_urls: list[str] | None = None,
    wheelhouse: str = "",
    lock_b64: str | None = None,
    alias: str = "auto",
) -> dict[str, Any]:
    """The pip argv and alias for the pin; `lock_b64` is the slurped requirements.lock (None: no lock)."""
    try:
        lock_text = base64.b64decode(lock_b64).decode() if lock_b64 else None
        return vllm_install.plan_install(
            python=python,
            package=package,
            version=version,
            index_url=index_url,
            extra_index_urls=list(extra_index_urls or []),
            wheelhouse=wheelhouse,
            lock_text=lock_text,
            alias=alias,
        ).to_dict()
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def vllm_install_installed(pip_list_json: str, package: str) -> str | None:
    return vllm_install.installed_version(pip_list_json, package)


def vllm_install_decide(installed: str | None, wanted: str) -> str:
    return vllm_install.decide(installed or None, str(wanted))


def vllm_install_model_plan(
    source: str, path: str, hub_repo: str, revision: str, copy: bool
) -> dict[str, Any]:
    try:
        return vllm_install.plan_model(
            source=source, path=path, hub_repo=hub_repo, revision=revision, copy=bool(copy)
        ).to_dict()
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def vllm_install_model_config(content_b64: str, where: str) -> dict[str, Any]:
    try:
        return parse_model_config(base64.b64decode(content_b64).decode(), where)
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def vllm_install_host_read(
    model: dict[str, Any],
    venv: str,
    home: str,
    wheelhouse: str = "",
    package: str = "vllm",
    alias: str = "auto",
) -> dict[str, Any]:
    """The options of the role's one vllm_fleet_host_state call (users and groups are added by the task)."""
    return vllm_install.host_read(
        model, venv=venv, home=home, wheelhouse=wheelhouse, package=package, alias=alias
    )


def vllm_install_host_decide(
    plan: dict[str, Any],
    model: dict[str, Any],
    state: dict[str, Any],
    user: str,
    group: str,
    home: str,
    venv: str,
) -> dict[str, Any]:
    """What the role does on the host, from one read of it; empty on a converged host."""
    try:
        return vllm_install.decide_host(plan, model, state, user=user, group=group, home=home, venv=venv)
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "vllm_install_plan": vllm_install_plan,
            "vllm_install_installed": vllm_install_installed,
            "vllm_install_decide": vllm_install_decide,
            "vllm_install_model_plan": vllm_install_model_plan,
            "vllm_install_model_config": vllm_install_model_config,
            "vllm_install_host_read": vllm_install_host_read,
            "vllm_install_host_decide": vllm_install_host_decide,
        }
