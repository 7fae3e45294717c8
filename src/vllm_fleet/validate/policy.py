"""Policies a careful operator expects by default, each lifted only by an explicit opt-in variable.

- a service or install user (or group) `root`: the unit's sandbox and the install task's account changes
  would apply to root itself (`<role>_allow_root_user: true`);
- a write path or cache directory that is a system directory as a whole (`/`, `/etc`, `/usr`, `/boot`...):
  `kinds.path(..., opt_in=<role>_allow_system_paths)`;
- a verify address that is not the instance's own host: verify sends the API key there
  (`vllm_verify_allow_remote_address: true`).

Each is a check of `validate.kinds` (same signature), so the table declares it as a variable's kind.
"""

from __future__ import annotations

from typing import Any

from vllm_fleet import hostvalues
from vllm_fleet.errors import FleetInputError
from vllm_fleet.validate import kinds
from vllm_fleet.validate.kinds import Check, Context


def opted_in(context: Context, opt_in: str) -> bool:
    value = context.variables.get(opt_in, False)
    return value is True or str(value).lower() in ("true", "yes", "1")


def not_root(opt_in: str) -> Check:
    """A POSIX user or group name that is not root unless `opt_in` is true."""

    def check(value: Any, variable: str, context: Context) -> None:
        kinds.user(value, variable, context)
        if value == "root" and not opted_in(context, opt_in):
            raise FleetInputError(
                f"{variable}: 'root' would give vLLM root's rights (the unit's sandbox undone) and let "
                "the install rewrite root's account (home, shell); give an unprivileged name such as vllm, "
                f"or set {opt_in}: true if you mean it"
            )

    return check


# The service address of an instance as verify sees it: its --host, unless that binds every interface.
WILDCARDS = ("", "0.0.0.0", "::", "[::]")


def own_address(opt_in: str) -> Check:
    """An address on the instance's own host: loopback, the inventory name or ansible_host, or the
    vllm_service_host it binds to. Verify sends the API key to it."""

    def check(value: Any, variable: str, context: Context) -> None:
        kinds.address(value, variable, context)
        bound = str(context.variables.get("vllm_service_host") or "")
        own = {a.lower() for a in context.own_addresses if a}
        if bound not in WILDCARDS:
            own.add(bound.lower())
        text = str(value).lower()
        if hostvalues.is_loopback(text) or text in own or opted_in(context, opt_in):
            return
        raise FleetInputError(
            f"{variable}: {value!r} is not this instance's own host ({', '.join(sorted(own)) or 'loopback'}) "
            "and verify would send the API key there; leave it empty (the instance's own address), give "
            f"the host's own address, or set {opt_in}: true if that host is yours"
        )

    return check
