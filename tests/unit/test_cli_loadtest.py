"""`vllm-fleet loadtest --show / --compare` and the load-test part of `vllm-fleet report`, over reports built
from real runs (tests/fixtures/loadtest: a real CPU vLLM under `vllm bench serve`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_loadtest_report import report_of

from vllm_fleet.cli import main
from vllm_fleet.loadtest.report import Slo, save_report


@pytest.fixture
def reports(tmp_path: Path) -> Path:
    folder = tmp_path / "loadtest"
    save_report(folder, report_of("healthy", name="tier-off"))
    save_report(folder, report_of("ngram", Slo(ttft_p99_max_ms=1000), name="tier-on"))
    return folder


def test_show_prints_the_table_and_strict_fails_on_a_missed_slo(reports: Path, capsys) -> None:
    assert main(["loadtest", "--show", str(reports)]) == 0
    out = capsys.readouterr().out
    assert "tier-off" in out and "tier-on" in out and out.rstrip().endswith("1/2 load tests met their SLOs")
    assert main(["loadtest", "--show", str(reports), "--strict"]) == 1
    capsys.readouterr()
    assert main(["loadtest", "--show", str(reports), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["result"] for r in rows] == ["OK", "FAIL"] and rows[1]["missed SLOs"] == "ttft_p99"


def test_compare_prints_the_p99_difference(reports: Path, capsys) -> None:
    assert main(["loadtest", "--compare", str(reports / "tier-off.json"), str(reports / "tier-on.json")]) == 0
    out = capsys.readouterr().out
    assert "P99 TTFT: A 264.6 ms, B 3232.8 ms, B - A +2968.2 ms" in out
    assert "tier-on does not improve P99 TTFT under the same load" in out


def test_compare_refuses_other_workloads_and_other_files(reports: Path, tmp_path: Path, capsys) -> None:
    save_report(reports, report_of("too_long"))
    assert (
        main(["loadtest", "--compare", str(reports / "tier-off.json"), str(reports / "too_long.json")]) == 2
    )
    assert "ran different workloads" in capsys.readouterr().err
    stray = tmp_path / "verify.json"
    stray.write_text('{"host": "h", "checks": []}')
    assert main(["loadtest", "--compare", str(stray), str(reports / "tier-on.json")]) == 2
    assert "is not a load-test report" in capsys.readouterr().err


def test_the_fleet_report_appends_the_load_tests_beside_it(reports: Path, capsys) -> None:
    verify = reports.parent / "verify"
    verify.mkdir()
    assert main(["report", str(verify)]) == 0
    out = capsys.readouterr().out
    assert "0/0 instances passed" in out and "1/2 load tests met their SLOs" in out
    assert main(["report", str(verify), "--strict"]) == 1
    capsys.readouterr()
    assert main(["report", str(verify), "--json"]) == 0
    assert [r["load test"] for r in json.loads(capsys.readouterr().out)["loadtests"]] == [
        "tier-off",
        "tier-on",
    ]
