"""`vllm-fleet logcheck`, run as the installed console script over real logs (DESIGN §4)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-logs"
CLI = Path(sys.executable).with_name("vllm-fleet")


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    assert CLI.is_file(), f"console script missing: {CLI} (pip install -e .)"
    return subprocess.run(
        [str(CLI), "logcheck", *args], capture_output=True, text=True, timeout=60, check=False, input=stdin
    )


def test_json_fields_of_design_on_a_real_log() -> None:
    done = run(str(LOGS / "log-v0.20.1-qwen3.6-27b-int4-tp2-2x3090-mtp-club3090-91.txt"), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    for key in (
        "version", "kv_cache_tokens", "max_concurrency", "concurrency_max_model_len", "gpu_blocks",
        "kv_cache_dtype",
        "attention_backend", "custom_all_reduce_disabled_reason", "ready", "spec_decode", "errors", "checks",
    ):  # fmt: skip
        assert key in report, key
    assert report["version"] == "0.20.1"
    assert report["kv_cache_tokens"] == 619_479
    assert report["kv_cache_dtype"] == "fp8_e5m2"
    assert report["checks"] == []


def test_expectations_pass_exit_0_and_fail_exit_1() -> None:
    log = str(LOGS / "log-v0.20.1-qwen3.6-27b-int4-tp2-2x3090-mtp-club3090-91.txt")
    good = run(log, "--expect-kv-tokens", "619479", "--expect-kv-dtype", "fp8_e5m2", "--json")
    assert good.returncode == 0, good.stdout
    assert [c["ok"] for c in json.loads(good.stdout)["checks"]] == [True, True]
    bad = run(log, "--expect-kv-tokens", "700000", "--expect-kv-dtype", "fp8")
    assert bad.returncode == 1
    assert "FAIL kv_cache_tokens" in bad.stdout and "FAIL kv_cache_dtype" in bad.stdout
    within = run(log, "--expect-kv-tokens", "700000", "--tolerance", "0.2")
    assert within.returncode == 0


def test_fatal_errors_are_listed_with_their_line() -> None:
    done = run(str(LOGS / "err-v0.15.2rc1-maxseqlen-kv-pp2-5070ti-5090d-vllm-34076.txt"), "--json")
    errors = json.loads(done.stdout)["errors"]
    assert [e["kind"] for e in errors] == ["max_model_len_exceeds_kv_cache"]
    assert "To serve at least one request" in errors[0]["line"]
    human = run(
        str(LOGS / "err-v0.15.2rc1-maxseqlen-kv-pp2-5070ti-5090d-vllm-34076.txt"), "--expect-no-errors"
    )
    assert human.returncode == 1
    assert "ERROR max_model_len_exceeds_kv_cache" in human.stdout


def test_standard_input_backend_and_ready() -> None:
    text = (LOGS / "misc-2026-07-attn-backend-out-of-potential-backends-v2-runner-pr45288.txt").read_text()
    done = run("-", "--expect-backend", "FLASH_ATTN", "--expect-ready", stdin=text)
    assert done.returncode == 1  # the excerpt ends before the server is ready
    assert "PASS attention_backend" in done.stdout and "FAIL ready" in done.stdout


def test_bad_input_exit_2() -> None:
    missing = run(str(LOGS / "no-such-log.txt"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    bad = run(str(LOGS / "log-v0.10.1ish-enginecore0-112gib-kv-pr20707.txt"), "--tolerance", "lots")
    assert bad.returncode == 2 and "--tolerance" in bad.stderr
