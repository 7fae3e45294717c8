"""Filters for the vllm_verify role: thin adapters over `vllm_fleet.verify.report`."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from vllm_fleet.errors import FleetInputError
from vllm_fleet.terminal import terminal_safe
from vllm_fleet.verify import report


def vllm_verify_stats(results: list[dict[str, Any]] | None, host: str, report_dir: str) -> dict[str, Any]:
    """This host's verdict for `set_stats` (see `report.verify_stats`)."""
    return report.verify_stats(host, results, report_dir)


def vllm_verify_table(report_dir: str, hosts: list[str] | None = None) -> list[str]:
    """The fleet table of the saved reports of `hosts` (all when empty), one line per list item: what
    `vllm-fleet report DIR --hosts ...` prints, read in the controller's own process (issue 21: no
    interpreter start and import per run)."""
    try:
        reports = report.load_reports(report_dir)
    except FleetInputError as exc:
        raise AnsibleFilterError(f"vllm_verify_table: {exc}") from exc
    wanted = {str(h) for h in hosts or []}
    if wanted:
        reports = [r for r in reports if str(r.get("host")) in wanted]
    return terminal_safe(report.fleet_table(reports)).splitlines()


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "vllm_verify_stats": vllm_verify_stats,
            "vllm_verify_table": vllm_verify_table,
        }
