"""The fleet_loadtest role's filters over what the role's tasks register: vllm_fleet_host_state's `globbed`
(the real plan tests/fixtures/loadtest/plan-i0.json), slurp's base64 of a real bench.json, the uri results of
the /metrics loops (the real scrapes of tests/fixtures/loadtest/healthy)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from pluginload import load_plugin

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "loadtest"
plugin = load_plugin(REPO / "plugins" / "filter" / "fleet_loadtest.py", "fleet_loadtest_under_test")
SETTINGS = {
    **json.loads((FIX / "healthy" / "variables.json").read_text()),
    "fleet_loadtest_name": "filters",
    "fleet_loadtest_slo_ttft_p99_max_ms": 200,
}


def endpoints() -> list[dict]:
    globbed = {"/etc/vllm-fleet/*.json": {"/etc/vllm-fleet/i0.json": (FIX / "plan-i0.json").read_text()}}
    return plugin.fleet_loadtest_endpoints(globbed, "load-1", "10.203.60.10", "/etc/vllm-fleet")


def uri_results(run: dict, which: str, status: int = 200) -> list[dict]:
    text = (FIX / "healthy" / f"metrics-{which}.txt").read_text()
    return [
        {"item": {"key": k, "value": v}, "status": status, "content": text} for k, v in run["metrics"].items()
    ]


def test_the_role_chain_gives_the_report() -> None:
    run = plugin.fleet_loadtest_run(endpoints(), "load-1", SETTINGS, "/var/tmp/vllm-fleet-loadtest")
    assert run["workdir"] == "/var/tmp/vllm-fleet-loadtest/filters"
    slurped = {"content": base64.b64encode((FIX / "healthy" / "bench.json").read_bytes()).decode()}
    report = plugin.fleet_loadtest_report(
        run, slurped, uri_results(run, "before"), uri_results(run, "after"), SETTINGS, "2026-12-03T18:13:37Z"
    )
    assert report["name"] == "filters" and report["target"] == "http://10.203.60.10:8000"
    assert report["figures"]["prefix_cache_hit_rate"]["value"] == pytest.approx(768 / 3040)
    assert not report["ok"] and "ttft_p99: 264.6, the SLO is <= 200 ms" in report["verdict"]


def test_a_scrape_that_failed_is_named() -> None:
    run = plugin.fleet_loadtest_run(endpoints(), "load-1", SETTINGS, "/tmp")
    slurped = {"content": base64.b64encode((FIX / "healthy" / "bench.json").read_bytes()).decode()}
    with pytest.raises(
        AnsibleFilterError, match=r"GET http://10.203.60.10:8000/metrics after the run answered 503"
    ):
        plugin.fleet_loadtest_report(
            run, slurped, uri_results(run, "before"), uri_results(run, "after", 503), SETTINGS
        )


def test_bad_variables_surface_as_filter_errors() -> None:
    with pytest.raises(AnsibleFilterError, match="fleet_loadtest: fleet_loadtest_num_requests is 0"):
        plugin.fleet_loadtest_run(
            endpoints(), "load-1", {**SETTINGS, "fleet_loadtest_num_requests": 0}, "/tmp"
        )


def test_the_table_of_a_missing_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(AnsibleFilterError, match=r"does not exist; run playbooks/loadtest\.yml first"):
        plugin.fleet_loadtest_table(str(tmp_path / "none"))
