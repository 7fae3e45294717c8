"""Instance sets from the hosts' plans, and which set a request goes to by its size.

An instance belongs to the set its host's inventory variable `vllm_service_instance_set` names (`long`,
`short` or any name of the user's). The gateway sends a request to the smallest set whose planned
`max_model_len` it fits, judged by the request body's size in bytes: HAProxy sees bytes, never tokens. The
largest set takes everything else, so a fleet of one set routes nothing.

Bytes and tokens: a byte-level BPE token covers 1 byte of UTF-8 text at least and about 4 of English prose;
the JSON request adds quoting, escapes (`\\n` is 2 bytes, `\\u00e9` 6) and the other fields, which only make a
body larger than its prompt. The threshold is `max_model_len x bytes_per_token x (1 - margin)`: the margin
keeps room for the output tokens (they share max_model_len with the prompt) and for text denser than
`bytes_per_token` (code, digits, CJK at 1.5-3 bytes a token). `bytes_per_token: 1` makes the short set
safe for any text, at the price of sending most prompts to the long set.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_fleet.errors import FleetInputError
from vllm_fleet.hostvalues import is_loopback
from vllm_fleet.monitoring.targets import scrape_address
from vllm_fleet.plan.host import HostPlan, InstancePlan

SET_VARIABLE = "vllm_service_instance_set"
DEFAULT_SET = "long"
_SET_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
BYTES_PER_TOKEN = 4.0
MARGIN = 0.5


@dataclass(frozen=True)
class Server:
    """One instance as the gateway dials it."""

    name: str  # <host>-<instance>: HAProxy's server name, what the runtime API drains
    host: str
    instance: str
    address: str  # host:port
    unit: str
    max_model_len: int | None
    model: str  # the served model name


@dataclass(frozen=True)
class InstanceSet:
    name: str
    servers: tuple[Server, ...]
    max_model_len: int | None  # the smallest planned max_model_len of its instances (None: not planned)
    threshold_bytes: int | None  # bodies up to this size go here; None: the last set, which takes the rest

    @property
    def backend(self) -> str:
        return f"set_{self.name}"


def check_set_name(value: object, host: str) -> str:
    if not isinstance(value, str) or not _SET_NAME.fullmatch(value):
        raise FleetInputError(
            f"{SET_VARIABLE}: {value!r} on host {host} is not a set name; give 1-32 characters a-z, 0-9, '_' "
            "or '-' starting with a letter, e.g. long or short"
        )
    return value


def threshold_bytes(max_model_len: int, bytes_per_token: float, margin: float) -> int:
    """The largest body (bytes) sent to a set whose instances take `max_model_len` tokens."""
    return int(max_model_len * bytes_per_token * (1.0 - margin))


def server_name(host: str, instance: str) -> str:
    return f"{host}-{instance}"


def server_of(plan: InstancePlan, host_address: str, gateway_host: str | None) -> Server:
    """The instance as the gateway reaches it: its --host, or its host's address on a wildcard bind."""
    if is_loopback(plan.address) and gateway_host not in (None, plan.host):
        raise FleetInputError(
            f"vllm_service_host: {plan.address!r} on host {plan.host}: instance {plan.name} listens on "
            "loopback, "
            f"which the gateway on {gateway_host} cannot reach; bind it to the host's address (with "
            "vllm_service_api_key) or run the gateway on that host"
        )
    return Server(
        name=server_name(plan.host, plan.name),
        host=plan.host,
        instance=plan.name,
        address=scrape_address(plan, host_address),
        unit=plan.unit,
        max_model_len=plan.max_model_len,
        model=plan.served_model_name,
    )


def instance_sets(
    plans: Mapping[str, HostPlan],
    set_of_host: Mapping[str, str],
    addresses: Mapping[str, str],
    *,
    gateway_host: str | None = None,
    bytes_per_token: float = BYTES_PER_TOKEN,
    margin: float = MARGIN,
) -> list[InstanceSet]:
    """The sets, smallest planned max_model_len first; every set but the last has its threshold."""
    # inf would pass `> 0` and make every threshold int(inf): an OverflowError, not a message
    if not (math.isfinite(bytes_per_token) and bytes_per_token > 0):
        raise FleetInputError(
            f"fleet_gateway_bytes_per_token: {bytes_per_token!r}; give a finite number above 0, e.g. 4"
        )
    if not 0 <= margin < 1:
        raise FleetInputError(
            f"fleet_gateway_margin: {margin!r}; give a fraction from 0 to below 1, e.g. 0.5"
        )
    members: dict[str, list[Server]] = {}
    for host, plan in plans.items():
        name = check_set_name(set_of_host.get(host, DEFAULT_SET), host)
        # rank 0 of a multi-host instance serves its clients; a host of headless ranks only joins no set
        served = [
            server_of(i, addresses.get(host, host), gateway_host) for i in plan.instances if not i.headless
        ]
        if served:
            members.setdefault(name, []).extend(served)
    servers = [s for group in members.values() for s in group]
    if not servers:
        raise FleetInputError(
            "the gateway has no instance to send requests to: no host's plan has an instance"
        )
    _check_one_model(servers)
    sized = sorted(members.items(), key=lambda item: (_set_len(item[1]) is None, _set_len(item[1]) or 0))
    sets = []
    for index, (name, group) in enumerate(sized):
        length = _set_len(group)
        last = index == len(sized) - 1
        if not last and length is None:
            raise FleetInputError(
                f"vllm_service_max_model_len: not planned for set {name} (hosts "
                f"{', '.join(sorted({s.host for s in group}))}); the gateway sends a set the requests "
                "that fit "
                "its max_model_len: set vllm_service_max_model_len for those hosts"
            )
        threshold = None if last or length is None else threshold_bytes(length, bytes_per_token, margin)
        sets.append(InstanceSet(name, tuple(group), length, threshold))
    return sets


def _set_len(group: list[Server]) -> int | None:
    lengths = [s.max_model_len for s in group]
    return None if None in lengths else min(lengths)  # type: ignore[type-var]


def _check_one_model(servers: list[Server]) -> None:
    """One API behind one address: a request for a model must reach an instance that serves it."""
    models = sorted({s.model for s in servers})
    if len(models) > 1:
        by_model = {m: sorted(s.name for s in servers if s.model == m) for m in models}
        raise FleetInputError(
            f"vllm_service_served_model_name: the gateway's instances serve different models ({by_model}); a "
            "gateway routes by size, not by model: give every instance behind it the same first served name"
        )
