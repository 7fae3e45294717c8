"""The gateway's key file: a thin adapter over `vllm_fleet.deploy.service.env_file_text`."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from vllm_fleet.deploy.service import env_file_text
from vllm_fleet.errors import FleetInputError
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


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"fleet_gateway_env": fleet_gateway_env}
