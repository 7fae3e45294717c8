"""Filters for the fleet_loadtest role: thin adapters over `vllm_fleet.loadtest`."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

from vllm_fleet.errors import FleetInputError
from vllm_fleet.loadtest import report as loadtest_report
from vllm_fleet.loadtest import run as loadtest_run
from vllm_fleet.loadtest.benchresult import parse_bench_result
from vllm_fleet.loadtest.workload import workload_from_vars


def fleet_loadtest_endpoints(
    globbed: Mapping[str, Any], host: str, address: str, config_dir: str
) -> list[dict]:
    """The instances of one host (its plans, as vllm_fleet_host_state's `globbed` returns them) as the load
    test reaches them."""
    plans = [json.loads(text) for files in (globbed or {}).values() for _, text in sorted(files.items())]
    try:
        return loadtest_run.host_endpoints(plans, address or host, config_dir)
    except FleetInputError as exc:
        raise AnsibleFilterError(f"fleet_loadtest_endpoints: {host}: {exc}") from exc


def fleet_loadtest_run(
    endpoints: Sequence[Mapping[str, Any]], client: str, settings: Mapping[str, Any], workdir: str
) -> dict[str, Any]:
    """The run (`vllm_fleet.loadtest.run.plan_run`) from every play host's endpoints, flattened."""
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for endpoint in endpoints:
        by_host.setdefault(str(endpoint["host"]), []).append(dict(endpoint))
    try:
        return loadtest_run.plan_run(by_host, client, settings, workdir)
    except FleetInputError as exc:
        raise AnsibleFilterError(f"fleet_loadtest: {exc}") from exc


def _scrapes(results: Sequence[Mapping[str, Any]], when: str) -> dict[str, str]:
    """`{instance key: /metrics text}` from the uri results of a loop over the run's `metrics` items."""
    texts = {}
    for result in results:
        item = result.get("item") or {}
        if result.get("status") != 200:
            raise AnsibleFilterError(
                f"fleet_loadtest: GET {item.get('value')} {when} the run answered {result.get('status')} "
                f"({result.get('msg', '')}); the instance {item.get('key')} must serve /metrics"
            )
        texts[str(item["key"])] = str(result.get("content", ""))
    return texts


def fleet_loadtest_report(
    run: Mapping[str, Any],
    bench: Mapping[str, Any],
    metrics_before: Sequence[Mapping[str, Any]],
    metrics_after: Sequence[Mapping[str, Any]],
    settings: Mapping[str, Any],
    started: str = "",
) -> dict[str, Any]:
    """The run's report (docs/interfaces.md) from the slurped bench.json and the uri results of the /metrics
    scrapes before and after, judged against the SLOs of `settings`."""
    try:
        data = json.loads(base64.b64decode(bench["content"]).decode("utf-8"))
        report = loadtest_report.build_report(
            name=str(run["name"]),
            target_url=str(run["url"]),
            bench=parse_bench_result(data, f"{run['workdir']}/bench.json on {run['client']}"),
            workload=workload_from_vars(settings),
            metrics_before=_scrapes(metrics_before, "before"),
            metrics_after=_scrapes(metrics_after, "after"),
            slo=loadtest_run.slo_from_vars(settings),
            started=started,
        )
    except (FleetInputError, ValueError, KeyError) as exc:
        raise AnsibleFilterError(f"fleet_loadtest_report: {exc}") from exc
    return report


def fleet_loadtest_table(report_dir: str) -> list[str]:
    """The load-test table of the saved reports of a folder, one line per list item."""
    try:
        return loadtest_report.loadtest_table(loadtest_report.load_reports(report_dir)).splitlines()
    except FleetInputError as exc:
        raise AnsibleFilterError(f"fleet_loadtest_table: {exc}") from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "fleet_loadtest_endpoints": fleet_loadtest_endpoints,
            "fleet_loadtest_run": fleet_loadtest_run,
            "fleet_loadtest_report": fleet_loadtest_report,
            "fleet_loadtest_table": fleet_loadtest_table,
        }
