"""The gateway's key file and its readiness: thin adapters over `vllm_fleet.deploy.service.env_file_text` and
`vllm_fleet.gateway.drain`."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from vllm_fleet.deploy.service import env_file_text
from vllm_fleet.errors import FleetInputError
from vllm_fleet.gateway.drain import read_argv, servers_not_up
from vllm_fleet.gateway.haproxy import KEY_ENV


def fleet_gateway_env(key: Any) -> str:
    """The EnvironmentFile haproxy's unit reads: VLLM_FLEET_GATEWAY_KEY, quoted for systemd, never shown in a
    message; an empty key gives a file without it (a gateway on loopback)."""
    try:
        return env_file_text(
            {KEY_ENV: str(key)} if key else {}, what="fleet_gateway_api_key", secret=frozenset({KEY_ENV})
        )
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def fleet_gateway_stat_argv(socket_path: str, python: str = "/usr/bin/python3") -> list[str]:
    """The command that reads `show stat` on the gateway host, with the host's own python3."""
    return read_argv(python, str(socket_path), ["show stat"])


def fleet_gateway_servers_not_up(read: dict[str, Any]) -> list[str]:
    """ "backend/server STATUS" of each server not UP, from the registered result of the read command (an
    empty list: the gateway serves on every server). A read that failed (HAProxy restarting) is one entry."""
    if read.get("rc", 1) != 0:
        said = (read.get("stderr") or read.get("msg") or "").strip().splitlines()
        return [f"the runtime API did not answer ({said[-1][:300] if said else 'no output'})"]
    try:
        return servers_not_up(read.get("stdout") or "")
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "fleet_gateway_env": fleet_gateway_env,
            "fleet_gateway_stat_argv": fleet_gateway_stat_argv,
            "fleet_gateway_servers_not_up": fleet_gateway_servers_not_up,
        }
