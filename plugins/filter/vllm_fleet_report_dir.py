"""The controller folder for reports (`vllm_fleet_report_dir`): a thin adapter over `vllm_fleet.reportdir`."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from vllm_fleet import reportdir
from vllm_fleet.errors import FleetInputError


def vllm_fleet_report_dir(value: Any, sub: str = "") -> str:
    """`<vllm_fleet_report_dir>/<sub>` as an absolute path; unset or empty: `./reports/<sub>` of the
    controller's working directory."""
    try:
        return reportdir.report_dir(value, sub)
    except FleetInputError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vllm_fleet_report_dir": vllm_fleet_report_dir}
