"""Every role's variables checked by kind, on the controller, before any host changes.

    variable_errors(host, variables, *, own_addresses=(), vllm_ports=None) -> [message, ...]

`variables` are the role variables the host's roles will see (their defaults under the inventory's values,
templated: `plan.inventory.role_variables`). Each is checked by the kind `validate.table.VARIABLES` declares
for it (`validate.kinds`, `validate.policy`); the host's listeners by `PORTS`; the inventory host name as the
file name of its reports. Preflight's plan task (the `vllm_fleet_plan` action plugin) and `vllm-fleet plan
--inventory` call it before the plan is built, and refuse the host with every message at once; each names
the variable, the value (masked for a secret) and the fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vllm_fleet.validate.kinds import HOST_NAME, Context
from vllm_fleet.validate.table import DEFAULT_PORTS, PORTS, VARIABLES


def host_name_errors(host: str) -> list[str]:
    if HOST_NAME.fullmatch(host) and ".." not in host:
        return []
    return [
        f"inventory host name: {host!r} cannot name its report files (reports/plan/<host>.json): it holds "
        "'/', '..', a space or a control character; rename the host in the inventory to a plain name such "
        "as gpu-01 (its address goes in ansible_host)"
    ]


def _port(value: Any) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def port_errors(variables: Mapping[str, Any], vllm_ports: Iterable[int] | None = None) -> list[str]:
    """Two listeners of one host on one port: vLLM's instances (`vllm_ports`, else its first port), the
    exporters, the gateway (`PORTS`)."""
    taken: dict[int, str] = {}
    errors: list[str] = []
    for variable in PORTS:
        value = variables.get(variable)
        value = DEFAULT_PORTS.get(variable) if value in (None, "") else value
        ports = (
            list(vllm_ports)
            if variable == "vllm_service_port" and vllm_ports is not None
            else [_port(value)]
            if value is not None
            else []
        )
        for port in ports:
            if port is None:
                continue  # not a number: its kind says so
            if port in taken and taken[port] != variable:
                other = taken[port]
                errors.append(
                    f"{variable}: {port} is also where {PORTS[other]} listens on this host ({other}: "
                    f"{variables.get(other, DEFAULT_PORTS.get(other))!r}); give {PORTS[variable]} a port "
                    "of its own"
                )
            taken.setdefault(port, variable)
    return errors


def variable_errors(
    host: str,
    variables: Mapping[str, Any],
    *,
    own_addresses: Iterable[str] = (),
    vllm_ports: Iterable[int] | None = None,
) -> list[str]:
    """Every refusal of the host's variables, in the table's order."""
    context = Context(variables, (host, *(str(a) for a in own_addresses if a)))
    errors = host_name_errors(host)
    for name, kind in VARIABLES.items():
        if name in variables:
            errors += kind.errors(variables[name], name, context)
    return errors + port_errors(variables, vllm_ports)
