"""What one read of an instance on its host (the module vllm_fleet_instance_read) asks and what it tells.

The readiness wait polls with that read; once /health answers 200 the same read also carries the journal of
the current start, /v1/models and /metrics. An instance that was not restarted is then checked from the
wait's first poll: one host round trip instead of a `du`, a `systemctl show`, three GETs and a journalctl
(issue 21). The host runs no vllm_fleet code: it hands raw text back, and these functions read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_fleet.verify.logcheck import parse_log
from vllm_fleet.verify.report import (
    JOURNAL_ARGV,
    SYSTEMCTL_PROPERTIES,
    ApiTarget,
    UnitState,
    journal_text,
    parse_systemctl_show,
)

READ_MODULE = "vllm_fleet.serving.vllm_fleet_instance_read"


def read_args(
    target: ApiTarget,
    *,
    checks: bool,
    api_key: str = "",
    request_timeout: int = 5,
    checks_timeout: int = 120,
    hold: float = 0,
    interval: float = 2,
) -> dict[str, Any]:
    """The module's arguments for one poll of `target` (`checks`: also read what verify checks, once ready).

    Args:
        target: the instance's API target (`api_target(plan)`).
        checks: read the journal, /v1/models and /metrics in the same call when /health answers 200.
        api_key: the Bearer token /v1/models needs when the instance runs with one ("" for none).
        request_timeout: seconds the /health request may take.
        checks_timeout: seconds the /v1/models and /metrics requests may take.
        hold: seconds a read that finds the instance loading may go on reading on the host (0: one read).
        interval: seconds between those reads.

    Returns:
        The argument dict for `vllm_fleet_instance_read`.
    """
    return {
        "unit": target.unit,
        "properties": list(SYSTEMCTL_PROPERTIES),
        "base_url": "" if target.headless else target.base_url,  # "": no API to ask (a headless rank)
        "checks": checks,
        "journal_argv": list(JOURNAL_ARGV),
        "api_key": api_key,
        "request_timeout": request_timeout,
        "checks_timeout": checks_timeout,
        "hold": hold,
        "interval": interval,
    }


def health_status(read: Mapping[str, Any]) -> int | None:
    """The HTTP status /health answered with, None without an answer (connection refused, timeout)."""
    status = (read.get("health") or {}).get("status")
    return status if isinstance(status, int) and status > 0 else None


def poll_of(read: Mapping[str, Any], unit: str) -> tuple[UnitState, int | None]:
    """The unit's state and /health's status of one read (FleetInputError: systemd has no such unit)."""
    return parse_systemctl_show(str(read.get("unit_show") or ""), unit), health_status(read)


def headless_joined(read: Mapping[str, Any]) -> bool:
    """Whether the journal of a headless rank's current start shows one of its workers in the world (vLLM's
    `rank R in world size N is assigned as ...` line, logged once the rendezvous with rank 0 is done)."""
    journal = read.get("journal") or {}
    if journal.get("rc") != 0:
        return False
    return bool(parse_log(journal_text(str(journal.get("stdout") or ""))).worker_ranks)


def check_reads(read: Mapping[str, Any], *, headless: bool = False) -> dict[str, Any] | None:
    """What verify checks, from a read taken when the instance was ready: the journal text of the current
    start and the /health, /v1/models and /metrics answers (in ansible.builtin.uri's shape). None when the
    read does not hold them all (taken before /health answered 200): then nothing is checked from it. A
    headless rank has the journal only."""
    journal = read.get("journal") or {}
    models, metrics = read.get("models") or {}, read.get("metrics") or {}
    if not journal or (not headless and (not models or not metrics)):
        return None
    return {
        "journal": str(journal.get("stdout") or "") if journal.get("rc") == 0 else "",
        "health": dict(read.get("health") or {}),
        "models": dict(models),
        "metrics": dict(metrics),
    }
