#!/usr/bin/env python3
"""A rolling change of both lab instances under load through the gateway: one host drained, the other not
(the negative control), counting failed and truncated requests and P99 TTFT before, during and after each
host's turn (issue 30; the lab test tests/integration/test_gateway_lab.py runs it too).

    sudo .venv/bin/python benchmarks/rollout_under_load.py [--name gw-bench] [--keep] [--json] [--out DIR]
    sudo .venv/bin/python benchmarks/rollout_under_load.py --inventory DIR   # a lab as lab_inventory makes

The lab: 2 hosts (systemd-nspawn, real systemd, the real vLLM CPU build serving the tiny model, its worker in
the engine core's process, as inventory/group_vars/lab/vllm.yml runs it), host 1 in set `long` and also the
gateway (Debian's haproxy from the lab cache's .debs, installed by playbooks/gateway.yml), host 2 in set
`short` with a shorter max_model_len (SHORT_MAX_MODEL_LEN against LONG_MAX_MODEL_LEN). Host 1's variables
turn the drain off (vllm_service_drain false): its restart is the negative control. The instances start with
vllm_service_shutdown_timeout 0: vLLM aborts what is in flight on SIGTERM, so nothing but the gateway's drain
keeps a request whole.

One rollout (playbooks/rollout.yml, serial 1) changes `--max-num-seqs` on both hosts, host 2 first (the
canary). Each host's turn has a load of its own, `vllm bench serve` from the lab's own vLLM on host 1 against
the gateway: random prompts sized for the host's set (`--input-len` tokens for the short set,
`--long-input-len` for the long one, whose bodies are over the short set's share), `--ignore-eos` with a fixed
output length (so a stream cut short shows as fewer tokens), its streams (`--concurrency`,
`--long-concurrency`), its pace (`--request-rate`, by default as fast as the streams go;
`--long-request-rate`, 5 a second: the control needs requests coming, not a full machine), its first run's
requests (`--requests`, `--long-requests`; and a timeout), `--save-result --save-detailed` (per-request
start, TTFT, output length, error). At each turn, before anything changes there, a pre-change hook
(vllm_rollout_pre_host_hooks, load_hook below) has the benchmark start that host's load and waits until it
flows; `--steady` seconds of it pass (the phase "before"), then the turn changes the serve command. A load
that ends before its host has been back `--after` seconds is continued by another run (`--more-requests`,
`--long-more-requests`: keep_loading), so that a slow turn on a busy machine is still covered to its end; the
next host's load starts once it is over. Requests are put in a phase by their start
(vllm_fleet.gateway.underload): before the turn went on, during the turn, after the host was back (a
post-verification hook, back_hook, says when). The API key reaches the load as OPENAI_API_KEY from the
instance's 0600 EnvironmentFile, never on a command line.

Host 2's turn keeps the default drain (the gateway's `state drain`, the wait for no session and vLLM's running
+ waiting at 0, then restart, verify, `state ready`): its short prompts go to the long set meanwhile, and none
may fail or be cut short. Host 1's turn restarts it in place: the process it stops aborts (the lab's 0; the
unit's stop timeout stays the abort's, deploy.service.STOP_TIMEOUT, 60 s, as `--max-num-seqs` is what
changes). Its streams in flight end with HTTP 500, and the gateway sends requests to the stopped server
until its check fails (503): the long load must lose some, or the measurement could not see a loss. (The
abort may also leave the open streams waiting, "Waiting for connections to close", always with vLLM's worker
in a process of its own, in some runs with it in-process (docs/interfaces.md): the lab's gateway closes them
after ABORTED_STREAM_TIMEOUT_S without a byte, where the role's 600 s left them to systemd's stop timeout.)
The two turns used to be two rollouts, the control rolling host 2 alone first; one rollout saves a rollout
and its load (issue 32). Afterwards deploy.yml puts the lab's values back
(both hosts, one at a time behind the gateway), unless --no-restore.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vllm_fleet.gateway.drain import parse_read, read_argv
from vllm_fleet.gateway.haproxy import RUNTIME_SOCKET
from vllm_fleet.gateway.underload import bench_requests, phase_figures
from vllm_fleet.lab.debs import gateway_group_vars

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CLI = str(BIN / "vllm-fleet")
LAB_VARS = ROOT / "inventory" / "group_vars" / "lab" / "vllm.yml"
# The sets' max_model_len (the tiny model takes 2048). The gateway's defaults (4 bytes a token, half kept
# free) send bodies up to 512 bytes to the short set: the benchmark's requests (16 random tokens and the JSON
# around them, about 250 bytes) go there, a 600-byte prompt to the long set. The tiny model's tokenizer spends
# about 1.7 bytes a token (a 400-byte prompt was 241 tokens), so the long set gets room for what is sent to
# it.
LONG_MAX_MODEL_LEN = 1024
SHORT_MAX_MODEL_LEN = 256
# HAProxy's `timeout server` on the lab's gateway: how long a stream may go without a byte from vLLM. The
# undrained host's abort kills its engine but leaves the streams in flight open ("Waiting for connections to
# close"), and vLLM exits only once they close: under the role's 600 s that was systemd's stop timeout (60 s)
# each rollout, under this one HAProxy closes them (a failed request either way, the control's point). The
# lab's longest silence is a first token under load, under 2 s in CI (P99 TTFT, benchmarks/README.md).
ABORTED_STREAM_TIMEOUT_S = 15
VENV = "/opt/vllm-fleet/venv"
MODEL = "/srv/vllm-fleet-lab/models/tiny"
RESULT = "/tmp/vllm-fleet-rollout-under-load-{load}-{chunk}.json"  # each `vllm bench serve` run


def env() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    }


def run(argv: list[str], timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def must(done: subprocess.CompletedProcess[str], what: str) -> str:
    if done.returncode != 0:
        tail = f"{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
        raise SystemExit(f"{what} failed (rc {done.returncode}):\n{tail}")
    return done.stdout


def playbook(inv: Path, book: str, *extra: str, timeout: int = 1200) -> subprocess.CompletedProcess[str]:
    return run([str(BIN / "ansible-playbook"), "-i", str(inv), book, *extra], timeout=timeout)


def lab_inventory(folder: Path, lab_inventory_file: Path) -> Path:
    """The lab's inventory, its first host the gateway and the long set (restarted without the drain), the
    second the short set."""
    inv = yaml.safe_load(lab_inventory_file.read_text())
    hosts = list(inv["all"]["children"]["lab"]["hosts"])
    inv["all"]["children"]["gateway"] = {"hosts": {hosts[0]: None}}
    (folder / "group_vars" / "lab").mkdir(parents=True, exist_ok=True)
    (folder / "group_vars" / "gateway").mkdir(parents=True, exist_ok=True)
    (folder / "host_vars").mkdir(parents=True, exist_ok=True)
    (folder / "hosts.yml").write_text(yaml.safe_dump(inv, sort_keys=False))
    # the lab's variables run each instance's worker in its engine core's process: under the load an `mp`
    # instance's worker and engine core busy-poll their queue, two cores of this machine's two
    shutil.copy(LAB_VARS, folder / "group_vars" / "lab" / "vllm.yml")
    for host, instance_set, max_model_len, drain in (
        (hosts[0], "long", LONG_MAX_MODEL_LEN, False),
        (hosts[1], "short", SHORT_MAX_MODEL_LEN, True),
    ):
        host_vars = {
            "vllm_service_instance_set": instance_set,
            "vllm_service_max_model_len": max_model_len,
            # vLLM's abort on SIGTERM: only the gateway's drain keeps requests whole (the control's premise)
            "vllm_service_shutdown_timeout": 0,
            # the long set's host restarts without leaving the gateway: the negative control
            "vllm_service_drain": drain,
        }
        (folder / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(host_vars))
    gateway_vars = gateway_group_vars() | {"fleet_gateway_server_timeout": ABORTED_STREAM_TIMEOUT_S}
    (folder / "group_vars" / "gateway" / "gateway.yml").write_text(yaml.safe_dump(gateway_vars))
    # every report of the lab's runs (plans, verify, rollouts) beside its inventory, not in the clone's
    # reports/, where another test's rollout counts and removes the run folders it finds new (test_readme)
    (folder / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    reports = {"vllm_fleet_report_dir": str(folder.parent / "reports")}
    (folder / "group_vars" / "all" / "reports.yml").write_text(yaml.safe_dump(reports))
    return folder


def up(name: str, work: Path) -> Path:
    """A 2-host lab with vLLM installed, deployed and verified, and the gateway on host 1."""
    lab_file = work / "lab.yml"
    must(
        run([CLI, "lab", "up", "--name", name, "--hosts", "2", "--inventory", str(lab_file),
             "--preinstalled-vllm"]),
        "lab up",
    )  # fmt: skip
    inv = lab_inventory(work / "inventory", lab_file)
    # verify waits for the instances: deploy.yml starts new ones without waiting (they serve nobody yet)
    for book in ("install", "deploy", "verify", "gateway"):
        must(playbook(inv, f"playbooks/{book}.yml"), f"playbooks/{book}.yml")
    return inv


def hosts_of(inv: Path) -> tuple[list[str], str, str]:
    """(the lab hosts, the gateway host, the gateway's address)."""
    data = yaml.safe_load((inv / "hosts.yml").read_text())
    lab = data["all"]["children"]["lab"]["hosts"]
    gateway = next(iter(data["all"]["children"]["gateway"]["hosts"]))
    return list(lab), gateway, lab[gateway]["ansible_host"]


def on_host(inv: Path, host: str, argv: list[str], timeout: int = 120) -> str:
    """The stdout of one command on a lab host (Ansible's command module, the words as a list: no shell)."""
    done = run(
        [str(BIN / "ansible"), "-i", str(inv), host, "-m", "ansible.builtin.command", "-a",
         json.dumps({"argv": argv})],
        timeout,
    )  # fmt: skip
    out = must(done, f"{host}: {shlex.join(argv)[:60]}")
    return out.split(">>\n", 1)[1] if ">>\n" in out else out


def gateway_stat(inv: Path, gateway: str) -> str:
    """`show stat` from HAProxy's runtime socket on the gateway host (root only), read by the script the
    role's drain module runs there (vllm_fleet.gateway.drain.read_argv)."""
    argv = read_argv("/usr/bin/python3", RUNTIME_SOCKET, ["show stat"])
    (show_stat,) = parse_read(on_host(inv, gateway, argv)).replies
    return show_stat


def frontend_requests(stat: str) -> int:
    """Requests the gateway's frontend took (req_tot: the benchmark keeps its connections alive, so
    sessions stay at the number of streams)."""
    text = stat.lstrip().removeprefix("# ")
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("svname") == "FRONTEND":
            return int(row.get("req_tot") or 0)
    raise SystemExit(f"no FRONTEND row in the gateway's show stat: {stat[:300]!r}")


@dataclass(frozen=True)
class Load:
    """One of the rollout's two loads: `vllm bench serve` prompts sized for one set, following the turn of
    that set's one host, which leaves the gateway first (`drained`) or restarts under its requests."""

    name: str
    host: str
    drained: bool
    input_len: int
    concurrency: int
    rate: float  # requests a second (Poisson arrivals; inf: as fast as the streams go)
    requests: int  # of its first run
    more_requests: int  # of each run that continues it


def loads(args: argparse.Namespace, hosts: list[str]) -> tuple[Load, Load]:
    """The short set's load (host 2, drained: rolled first, the canary) and the long set's (host 1, the
    negative control: its host_vars turn the drain off, lab_inventory)."""
    return (
        Load(
            "short", hosts[1], True, args.input_len, args.concurrency, args.request_rate, args.requests,
            args.more_requests,
        ),
        Load(
            "long", hosts[0], False, args.long_input_len, args.long_concurrency, args.long_request_rate,
            args.long_requests, args.long_more_requests,
        ),
    )  # fmt: skip


def bench_command(address: str, args: argparse.Namespace, load: Load, chunk: int) -> str:
    """`vllm bench serve` at the gateway; the key from the instance's EnvironmentFile (0600), never argv."""
    result = RESULT.format(load=load.name, chunk=chunk)
    requests = load.requests if chunk == 0 else load.more_requests
    said = f"/tmp/vllm-fleet-bench-{load.name}.log"
    return (
        "set -a; . /etc/vllm-fleet/i0.env; set +a; export OPENAI_API_KEY=$VLLM_API_KEY; cd /tmp; "
        f"rm -f {result}; timeout {args.timeout} {VENV}/bin/vllm bench serve --backend openai "
        f"--base-url http://{address}:{args.port} --endpoint /v1/completions --model tiny "
        f"--tokenizer {MODEL} "
        f"--dataset-name random --random-input-len {load.input_len} --random-output-len {args.output_len} "
        f"--ignore-eos --num-prompts {requests} --max-concurrency {load.concurrency} "
        f"--request-rate {load.rate} "
        f"--seed {1 + chunk + (1000 if load.drained else 0)} "
        f"--save-result --save-detailed --result-filename {result} > {said} 2>&1; "
        f"rc=$?; tail -3 {said}; exit $rc"
    )


def start_load(
    inv: Path, gateway: str, address: str, args: argparse.Namespace, load: Load, chunk: int
) -> subprocess.Popen[str]:
    """One run of a load (`vllm bench serve` on the gateway host)."""
    return subprocess.Popen(
        [str(BIN / "ansible"), "-i", str(inv), gateway, "-m", "ansible.builtin.shell", "-a",
         bench_command(address, args, load, chunk)],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def the_change() -> dict[str, int]:
    """What the rollout changes on both hosts: --max-num-seqs, so that the undrained host's old process is
    stopped with the abort's stop timeout (its new unit's: deploy.service.STOP_TIMEOUT; a changed
    --shutdown-timeout would stop it under the new value's, seen hanging 10 min, docs/interfaces.md), to a
    value the lab's own values do not have, varied by the clock so that a kept lab rolled again with
    --no-restore changes too."""
    return {"vllm_service_max_num_seqs": 16 + int(time.time()) % 48}


def mark_task(folder: Path, mark: str, name: str) -> dict[str, Any]:
    """A hook's task that leaves the file `folder/mark-HOST` for the benchmark, HOST the host whose turn
    it is."""
    return {
        "name": name,
        "ansible.builtin.copy": {
            "dest": f"{folder}/{mark}-{{{{ inventory_hostname }}}}",
            "content": f"{mark}\n",
            "mode": "0644",
        },
        "delegate_to": "localhost",
    }


def load_hook(folder: Path) -> Path:
    """A pre-change hook for the rollout (vllm_rollout_pre_host_hooks, the role's kubespray-style hook): at
    each host's turn, before anything changes there, it tells the benchmark to start that host's load and
    waits until the load flows. The load then covers that host's drain (or not), stop and start, and not the
    preflight and the turn's first steps, which it slowed (the control's preflight took 26.0 s under it, 2.2
    s without) and which needed a longer load (issue 32)."""
    hook = folder / "load_hook.yml"
    tasks = [
        mark_task(folder, "go", "Tell rollout_under_load.py that this host's turn begins"),
        {
            "name": "Wait until its load flows through the gateway",
            "ansible.builtin.wait_for": {
                "path": f"{folder}/flowing-{{{{ inventory_hostname }}}}",
                "timeout": 600,
            },
            "delegate_to": "localhost",
        },
    ]
    hook.write_text(yaml.safe_dump(tasks, sort_keys=False))
    return hook


def back_hook(folder: Path) -> Path:
    """A post-verification hook (vllm_rollout_post_host_hooks): the host's turn is over (restarted, verified
    and, drained, back in the gateway). The benchmark notes when, so that a load can show it still flowed
    after it: a load that ended earlier never sent a request to the returned host."""
    hook = folder / "back_hook.yml"
    tasks = [mark_task(folder, "back", "Tell rollout_under_load.py that this host's turn is over")]
    hook.write_text(yaml.safe_dump(tasks, sort_keys=False))
    return hook


@dataclass(frozen=True)
class Loading:
    """What keep_loading saw: when the host's turn was over (None: never), the output of each run of the
    load, in order, and the last run's exit status."""

    back_at: float | None
    outputs: list[str]
    last_rc: int | None


def keep_loading(
    back: Path,
    rollout: subprocess.Popen[str],
    load: subprocess.Popen[str],
    more: Callable[[int], subprocess.Popen[str]],
    after_s: float,
    timeout: float = 1200,
) -> Loading:
    """Waits for the load to end. A load that ends before its host's turn has been over (the file `back`)
    for `after_s` seconds is continued by another run (`more(chunk)`): a rollout slowed by a busy machine must
    not outlast a load sized for a quiet one (a drained run's 3000 requests ended before the loaded host was
    back once, with another lab module beside it). Between two runs the load pauses while the next `vllm
    bench serve` starts (a few seconds); the drain, early in the turn, falls in the first. No run is started
    once the rollout ended without that turn being over (a failed run). A run it started and that is still
    going when it fails (its timeout) is killed here."""
    deadline = time.monotonic() + timeout
    back_at: float | None = None
    outputs: list[str] = []
    current: subprocess.Popen[str] | None = load
    last_rc: int | None = None
    try:
        while current is not None:
            now = time.monotonic()
            ended = current.poll() is not None
            rollout_over = rollout.poll() is not None
            if back_at is None and back.exists():
                back_at = now
            if ended:
                outputs.append(current.communicate()[0])
                last_rc = current.returncode
                covered = back_at is not None and now - back_at >= after_s
                failed_turn = back_at is None and rollout_over
                current = None if covered or failed_turn else more(len(outputs))
            if now > deadline:
                raise subprocess.TimeoutExpired(rollout.args, timeout)
            time.sleep(0.5)
    finally:
        if current is not None and current is not load and current.poll() is None:
            current.kill()
    return Loading(back_at, outputs, last_rc)


def wait_for_mark(mark: Path, rollout: subprocess.Popen[str], log: Path, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while not mark.exists():
        if rollout.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the rollout ended before {mark.name}:\n{log.read_text()[-3000:]}")
        time.sleep(1)


@dataclass(frozen=True)
class Followed:
    """A load that followed its host's turn: when the turn went on (after --steady seconds of load), and
    keep_loading's record."""

    load: Load
    start: float
    loading: Loading


def follow(
    inv: Path,
    gateway: str,
    address: str,
    args: argparse.Namespace,
    folder: Path,
    rollout: subprocess.Popen[str],
    load: Load,
    running: list[subprocess.Popen[str]],
) -> Followed:
    """At `load.host`'s turn (the pre-change hook's mark): the load's first run, `--steady` seconds of it
    once it flows (the phase "before"), the hook let go, and the load kept up until the host's return.
    `gateway`, `address`: the gateway host and its address (hosts_of)."""
    wait_for_mark(folder / f"go-{load.host}", rollout, folder / "rollout.log")
    base = frontend_requests(gateway_stat(inv, gateway))
    first = start_load(inv, gateway, address, args, load, 0)
    running.append(first)
    # the benchmark's own start (imports, tokenizer) takes a while: the steady phase begins with the load
    deadline = time.monotonic() + 180
    while frontend_requests(gateway_stat(inv, gateway)) < base + 3 * load.concurrency:
        if first.poll() is not None or time.monotonic() > deadline:
            said = first.stdout.read()[-2000:] if first.stdout else ""
            raise SystemExit(f"the {load.name} load did not start: {said}")
        time.sleep(1)
    time.sleep(args.steady)
    start = time.monotonic()
    (folder / f"flowing-{load.host}").write_text("flowing\n")
    loading = keep_loading(
        folder / f"back-{load.host}",
        rollout,
        first,
        lambda chunk: start_load(inv, gateway, address, args, load, chunk),
        args.after,
    )
    return Followed(load, start, loading)


def one_rollout(inv: Path, args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    """One rollout of both hosts (serial 1) under two loads, one after the other: the short set's host first
    (the canary, drained) under the short prompts, then the long set's (its drain off: the negative control)
    under the long ones. Its playbook log and the loads' results land in `folder`; one record per load."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in (*folder.glob("go-*"), *folder.glob("flowing-*"), *folder.glob("back-*")):
        stale.unlink()
    hosts, gateway, address = hosts_of(inv)
    short, long = loads(args, hosts)
    change = the_change()
    extra = {
        "vllm_rollout_serial": [1],
        "vllm_rollout_canary": [short.host],
        "vllm_rollout_pre_host_hooks": [str(load_hook(folder))],
        "vllm_rollout_post_host_hooks": [str(back_hook(folder))],
        **change,
    }
    log = folder / "rollout.log"
    running: list[subprocess.Popen[str]] = []
    began = time.monotonic()
    with log.open("w") as output:
        rollout = subprocess.Popen(
            [str(BIN / "ansible-playbook"), "-i", str(inv), "playbooks/rollout.yml", "-v", "-e",
             json.dumps(extra)],
            cwd=ROOT, env=env(), stdout=output, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            running.append(rollout)
            followed = [
                follow(inv, gateway, address, args, folder, rollout, load, running) for load in (short, long)
            ]
            rollout.wait(timeout=1200)
        finally:
            for process in running:
                if process.poll() is None:
                    process.kill()
    rollout_s = round(time.monotonic() - began, 1)
    rollout_ok = rollout.returncode == 0
    rollout_out = log.read_text()
    shared = {
        "change": change,
        "rollout_ok": rollout_ok,
        "rollout_s": rollout_s,
        "rollout_tail": "" if rollout_ok else rollout_out[-3000:],
        "rollout_log": str(log),
        "hosts": hosts,
    }
    drains = drain_results(rollout_out)
    return [load_record(inv, gateway, args, folder, one, drains) | shared for one in followed]


def load_record(
    inv: Path,
    gateway: str,
    args: argparse.Namespace,
    folder: Path,
    followed: Followed,
    drains: list[dict[str, Any]],
) -> dict[str, Any]:
    """One load's figures: its requests by phase (before its host's turn went on, during it, after the host
    was back), fetched from each of its runs' results on the gateway host."""
    load, loading = followed.load, followed.loading
    requests, load_s = [], 0.0
    for chunk in range(len(loading.outputs)):
        fetched = folder / f"result-{load.name}-{chunk}.json"
        must(
            run([str(BIN / "ansible"), "-i", str(inv), gateway, "-m", "ansible.builtin.fetch", "-a",
                 f"src={RESULT.format(load=load.name, chunk=chunk)} dest={fetched} flat=true"]),
            "fetch the benchmark's result",
        )  # fmt: skip
        result = json.loads(fetched.read_text())
        requests += bench_requests(result)
        load_s += float(result.get("duration") or 0)
    back_at = loading.back_at
    end = back_at if back_at is not None else time.monotonic()
    phases = phase_figures(requests, followed.start, end, args.output_len)
    return {
        "load": load.name,
        "host": load.host,
        "drained": load.drained,
        "drains": [d for d in drains if str(d["server"]).startswith(f"{load.host}-")],
        "bench_rc": loading.last_rc,
        # the load's runs (a first of its --requests, then --more-requests each until its host had been
        # back --after seconds) and their time together
        "load_runs": len(loading.outputs),
        "load_s": round(load_s, 1),
        # the host's turn ended this long after it went on, and so many requests started after it (None: its
        # turn never ended)
        "loaded_host_back_s": None if back_at is None else round(back_at - followed.start, 1),
        "requests_after_loaded_host_back": None if back_at is None else phases["after"].requests,
        "bench_tail": loading.outputs[-1][-600:] if loading.outputs else "",
        "phases": {p: f.to_dict() for p, f in phases.items()},
    }


def drain_results(output: str) -> list[dict[str, Any]]:
    """What each drain reported (the action's result as `-v` prints it): server, verdict, seconds waited."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := output.find("=> {", at)) != -1:
        try:
            result, _ = decoder.raw_decode(output, at + 3)
        except ValueError:
            result = {}
        at += 3
        if isinstance(result, dict) and "verdict" in result and "server" in result:
            found.append({k: result.get(k) for k in ("server", "verdict", "reason", "waited_s")})
    return found


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        f"{'load':<26} {'phase':<7} {'requests':>8} {'failed':>6} {'truncated':>9} {'P99 TTFT ms':>11}",
    ]
    for r in runs:
        label = f"{r['load']}, " + ("drained" if r["drained"] else "no drain (control)")
        for phase, f in r["phases"].items():
            p99 = "-" if f["p99_ttft_ms"] is None else f"{f['p99_ttft_ms']:.0f}"
            lines.append(
                f"{label:<26} {phase:<7} {f['requests']:>8} {f['failed']:>6} {f['truncated']:>9} {p99:>11}"
            )
        if r["loaded_host_back_s"] is not None:
            lines.append(
                f"{'':<26} {r['host']}'s turn ended {r['loaded_host_back_s']} s in; the load sent "
                f"{r['requests_after_loaded_host_back']} requests after it (load {r['load_s']} s in "
                f"{r['load_runs']} run(s))"
            )
    if runs:
        lines.append(f"rollout {runs[0]['rollout_s']} s, {'ok' if runs[0]['rollout_ok'] else 'FAILED'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="gw-bench", help="lab name (a lab of 2 hosts is brought up)")
    parser.add_argument("--inventory", help="a lab inventory folder made as lab_inventory() makes it")
    parser.add_argument("--keep", action="store_true", help="leave the lab up")
    parser.add_argument("--concurrency", type=int, default=8, help="streams of the short set's load")
    parser.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="requests a second of the short load (default: as fast as its streams go)",
    )
    parser.add_argument("--requests", type=int, default=2000, help="requests of the short load's first run")
    parser.add_argument(
        "--more-requests",
        type=int,
        default=500,
        help="requests of each run that continues the short load when it ended too soon (see --after)",
    )
    parser.add_argument("--long-concurrency", type=int, default=4, help="streams of the long set's load")
    parser.add_argument(
        "--long-request-rate",
        type=float,
        default=5,
        help="requests a second of the long load: the control needs requests coming, not a full machine",
    )
    parser.add_argument(
        "--long-requests", type=int, default=400, help="requests of the long load's first run"
    )
    parser.add_argument(
        "--long-more-requests", type=int, default=50, help="requests of each run that continues the long load"
    )
    parser.add_argument(
        "--after",
        type=float,
        default=10,
        help="seconds the load must run past the loaded host's return: a load that ends sooner is continued",
    )
    parser.add_argument("--input-len", type=int, default=16, help="prompt tokens of the short load")
    parser.add_argument(
        "--long-input-len",
        type=int,
        default=400,
        help="prompt tokens of the long load (above the short set's share: its bodies go to the long set)",
    )
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--steady", type=int, default=20, help="seconds of load before the rollout")
    parser.add_argument("--timeout", type=int, default=900, help="seconds the load may take at most")
    parser.add_argument("--port", type=int, default=4000, help="the gateway's port (fleet_gateway_port)")
    parser.add_argument(
        "--no-restore",
        action="store_true",
        help="leave the runs' values on the lab instead of deploying the lab's own again (a restart of each"
        " rolled host, one at a time): for a lab that is taken down or rolled again next",
    )
    parser.add_argument("--out", help="where each run's rollout log and result go (default: a /tmp folder)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="rollout-under-load-"))
    inv = Path(args.inventory) if args.inventory else up(args.name, work)
    runs = []
    try:
        runs = one_rollout(inv, args, work / "rollout")
        if not args.no_restore:
            # the rolled hosts differ from the lab's values now: deploy.yml restarts them behind the
            # gateway, one host at a time (its second play); side by side, the second waited for the
            # first to serve again until its drain timeout (CI)
            must(playbook(inv, "playbooks/deploy.yml"), "deploy with the lab's values again")
    finally:
        if not args.inventory and not args.keep:
            run([CLI, "lab", "down", "--name", args.name])
    print(json.dumps({"runs": runs}, indent=2) if args.json else table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
