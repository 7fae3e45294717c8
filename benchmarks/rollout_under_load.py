#!/usr/bin/env python3
"""A rolling change of every lab instance while 8 concurrent streams run through the gateway, with the drain
and without it (the negative control), counting failed and truncated requests and P99 TTFT before, during and
after the rollout (issue 30; the lab test tests/integration/test_gateway_lab.py runs it too).

    sudo .venv/bin/python benchmarks/rollout_under_load.py [--name gw-bench] [--keep] [--json] [--out DIR]
    sudo .venv/bin/python benchmarks/rollout_under_load.py --inventory DIR   # a lab as lab_inventory makes

The lab: 2 hosts (systemd-nspawn, real systemd, the real vLLM CPU build serving the tiny model, its worker in
the engine core's process, as inventory/group_vars/lab/vllm.yml runs it), host 1 in set
`long` and also the gateway (Debian's haproxy from the lab cache's .debs, installed by playbooks/gateway.yml),
host 2 in set `short` with a shorter max_model_len (SHORT_MAX_MODEL_LEN against LONG_MAX_MODEL_LEN). The load
is `vllm bench serve` from the lab's own vLLM on host 1 against the gateway: random prompts that fit the short
set, `--ignore-eos` with a fixed output length (so a stream cut short shows as fewer tokens),
`--max-concurrency` streams, `--requests` of them (and a timeout), `--save-result --save-detailed`
(per-request start, TTFT, output length, error). A load that ends before the loaded host has been back
`--after` seconds is continued by another run of `--more-requests` (keep_loading), so that a slow rollout
on a busy machine is still covered to its end. The API key reaches it as OPENAI_API_KEY
from the instance's 0600 EnvironmentFile, never on a command line.

The lab's instances start with vllm_service_shutdown_timeout 0: vLLM aborts what is in flight on SIGTERM, so
nothing but the gateway's drain keeps a request whole. Each run: playbooks/rollout.yml (serial 1: host by
host) starts; at the loaded host's turn, before anything changes there, a pre-change hook
(vllm_rollout_pre_host_hooks, load_hook below) has the benchmark start the load and waits until it flows;
`--steady` seconds of it pass (the phase "before"), then the turn changes the serve command, and the load
finishes. Requests are put in a phase by their start (vllm_fleet.gateway.underload): before the turn went on,
during the rest of the rollout, after it.

The negative control runs first and rolls the loaded host alone (the other carries none of this load) with
vllm_service_drain=false, changing `--max-num-seqs` only: the process it stops aborts (the lab's 0), and the
unit's stop timeout stays the abort's (deploy.service.STOP_TIMEOUT, 60 s). The streams in flight end with
HTTP 500, and the gateway sends requests to the stopped server until its check fails (503). (The abort may
also leave the open streams waiting, "Waiting for connections to close", until systemd kills the process
after its stop timeout: always with vLLM's worker in a process of its own, in some runs with it in-process:
docs/interfaces.md.) Before, the control ran after the drained run and stopped a process
started with that run's --shutdown-timeout, which finished its requests itself (CI, stop 36: none lost); a
control that changes --shutdown-timeout itself stops the old process under the new unit's TimeoutStopSec
(docs/interfaces.md, "Files on a target host": seen hanging 10 min, until HAProxy's `timeout server`).

The drained run keeps the default drain (the gateway's `state drain`, the wait for no session and vLLM's
running + waiting at 0, then restart, verify, `state ready`) and changes every instance's
vllm_service_shutdown_timeout to a value no earlier run left. Afterwards deploy.yml puts the lab's values
back (both hosts, one at a time behind the gateway), unless --no-restore.
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
VENV = "/opt/vllm-fleet/venv"
MODEL = "/srv/vllm-fleet-lab/models/tiny"
RESULT = "/tmp/vllm-fleet-rollout-under-load-{chunk}.json"  # each `vllm bench serve` run of the load


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
    """The lab's inventory, its first host the gateway and the long set, the second the short set."""
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
    for host, instance_set, max_model_len in (
        (hosts[0], "long", LONG_MAX_MODEL_LEN),
        (hosts[1], "short", SHORT_MAX_MODEL_LEN),
    ):
        host_vars = {
            "vllm_service_instance_set": instance_set,
            "vllm_service_max_model_len": max_model_len,
            # vLLM's abort on SIGTERM: only the gateway's drain keeps requests whole (the control's premise)
            "vllm_service_shutdown_timeout": 0,
        }
        (folder / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(host_vars))
    (folder / "group_vars" / "gateway" / "gateway.yml").write_text(yaml.safe_dump(gateway_group_vars()))
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


def bench_command(address: str, args: argparse.Namespace, chunk: int, requests: int) -> str:
    """`vllm bench serve` at the gateway; the key from the instance's EnvironmentFile (0600), never argv."""
    result = RESULT.format(chunk=chunk)
    return (
        "set -a; . /etc/vllm-fleet/i0.env; set +a; export OPENAI_API_KEY=$VLLM_API_KEY; cd /tmp; "
        f"rm -f {result}; timeout {args.timeout} {VENV}/bin/vllm bench serve --backend openai "
        f"--base-url http://{address}:{args.port} --endpoint /v1/completions --model tiny "
        f"--tokenizer {MODEL} "
        f"--dataset-name random --random-input-len {args.input_len} --random-output-len {args.output_len} "
        f"--ignore-eos --num-prompts {requests} --max-concurrency {args.concurrency} --seed {1 + chunk} "
        f"--save-result --save-detailed --result-filename {result} > /tmp/vllm-fleet-bench.log 2>&1; "
        f"rc=$?; tail -3 /tmp/vllm-fleet-bench.log; exit $rc"
    )


def start_load(
    inv: Path, gateway: str, address: str, args: argparse.Namespace, chunk: int
) -> subprocess.Popen[str]:
    """One run of the load (`vllm bench serve` on the gateway host): `--requests` for the first, then
    `--more-requests` for each that continues it."""
    requests = args.requests if chunk == 0 else args.more_requests
    return subprocess.Popen(
        [str(BIN / "ansible"), "-i", str(inv), gateway, "-m", "ansible.builtin.shell", "-a",
         bench_command(address, args, chunk, requests)],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def the_change(drained: bool) -> dict[str, int]:
    """What the run changes: the drained run every instance's --shutdown-timeout, the control the loaded
    host's --max-num-seqs (so that its stop keeps the abort's stop timeout); a value the lab's own values do
    not have, varied by the clock so that a kept lab rolled again with --no-restore changes too."""
    fresh = int(time.time())
    if drained:
        return {"vllm_service_shutdown_timeout": 600 + fresh % 1800}
    return {"vllm_service_max_num_seqs": 16 + fresh % 48}


def mark_task(folder: Path, mark: str, loaded_host: str, name: str) -> dict[str, Any]:
    """A hook's task that leaves the file `folder/mark` for the benchmark, at the loaded host's turn only."""
    return {
        "name": name,
        "ansible.builtin.copy": {"dest": str(folder / mark), "content": f"{mark}\n", "mode": "0644"},
        "delegate_to": "localhost",
        "when": f"inventory_hostname == {loaded_host!r}",
    }


def load_hook(folder: Path, loaded_host: str) -> Path:
    """A pre-change hook for the rollout (vllm_rollout_pre_host_hooks, the role's kubespray-style hook): at
    the loaded host's turn, before anything changes there, it tells the benchmark to start the load and waits
    until the load flows. The load then covers that host's drain, stop and start, and not the preflight and
    the turn's first steps, which it slowed (the control's preflight took 26.0 s under it, 2.2 s without)
    and which needed a longer load (issue 32)."""
    hook = folder / "load_hook.yml"
    tasks = [
        mark_task(folder, "go", loaded_host, "Tell rollout_under_load.py that the loaded host's turn begins"),
        {
            "name": "Wait until its load flows through the gateway",
            "ansible.builtin.wait_for": {"path": str(folder / "flowing"), "timeout": 600},
            "delegate_to": "localhost",
            "when": f"inventory_hostname == {loaded_host!r}",
        },
    ]
    hook.write_text(yaml.safe_dump(tasks, sort_keys=False))
    return hook


def back_hook(folder: Path, loaded_host: str) -> Path:
    """A post-verification hook (vllm_rollout_post_host_hooks): the loaded host's turn is over (restarted,
    verified and, in the drained run, back in the gateway). The benchmark notes when, so that a run can show
    the load still flowed after it: a load that ended earlier never sent a request to the returned host."""
    hook = folder / "back_hook.yml"
    tasks = [
        mark_task(
            folder, "back", loaded_host, "Tell rollout_under_load.py that the loaded host's turn is over"
        )
    ]
    hook.write_text(yaml.safe_dump(tasks, sort_keys=False))
    return hook


@dataclass(frozen=True)
class Loading:
    """What keep_loading saw: when the loaded host's turn was over (None: never), when the rollout ended,
    the output of each run of the load, in order, and the last run's exit status."""

    back_at: float | None
    end: float
    outputs: list[str]
    last_rc: int | None


def keep_loading(
    folder: Path,
    rollout: subprocess.Popen[str],
    load: subprocess.Popen[str],
    more: Callable[[int], subprocess.Popen[str]],
    after_s: float,
    timeout: float = 1200,
) -> Loading:
    """Waits for the rollout and the load to end. A load that ends before the loaded host's turn has been
    over for `after_s` seconds is continued by another run (`more(chunk)`): a rollout slowed by a busy
    machine must not outlast a load sized for a quiet one (a drained run's 3000 requests ended before the
    loaded host was back once, with another lab module beside it). Between two runs the load pauses while
    the next `vllm bench serve` starts (a few seconds); the drain, early in the turn, falls in the first.
    No run is started once the rollout ended without that turn being over (a failed run). A run it started
    and that is still going when it fails (its timeout) is killed here."""
    deadline = time.monotonic() + timeout
    back_at: float | None = None
    end: float | None = None
    outputs: list[str] = []
    current: subprocess.Popen[str] | None = load
    last_rc: int | None = None
    try:
        while current is not None or end is None:
            now = time.monotonic()
            if back_at is None and (folder / "back").exists():
                back_at = now
            if end is None and rollout.poll() is not None:
                end = now
            if current is not None and current.poll() is not None:
                outputs.append(current.communicate()[0])
                last_rc = current.returncode
                covered = back_at is not None and now - back_at >= after_s
                failed_turn = end is not None and back_at is None
                current = None if covered or failed_turn else more(len(outputs))
            if now > deadline:
                raise subprocess.TimeoutExpired(rollout.args, timeout)
            time.sleep(0.5)
    finally:
        if current is not None and current is not load and current.poll() is None:
            current.kill()
    return Loading(back_at, end, outputs, last_rc)


def wait_for_turn(folder: Path, rollout: subprocess.Popen[str], log: Path, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while not (folder / "go").exists():
        if rollout.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the rollout ended before the loaded host's turn:\n{log.read_text()[-3000:]}")
        time.sleep(1)


def one_run(inv: Path, args: argparse.Namespace, drained: bool, folder: Path) -> dict[str, Any]:
    """One rollout under load; its playbook log and the benchmark's result land in `folder`. The rollout
    starts first and waits in load_hook at the loaded host's turn; the load starts then, runs `--steady`
    seconds (the phase "before"), and the turn goes on."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("go", "flowing", "back"):
        (folder / name).unlink(missing_ok=True)
    hosts, gateway, address = hosts_of(inv)
    # the short set's host first: it carries the load, so the rollout starts where requests are in flight
    change = the_change(drained)
    extra = {
        "vllm_rollout_serial": [1],
        "vllm_rollout_canary": [hosts[1]],
        "vllm_rollout_pre_host_hooks": [str(load_hook(folder, hosts[1]))],
        "vllm_rollout_post_host_hooks": [str(back_hook(folder, hosts[1]))],
        **change,
    }
    if not drained:
        # the loaded host alone: its restart without the drain is what loses requests; the other host
        # carries none of this load, so its turn would only lengthen the run
        extra["vllm_service_drain"] = False
        extra["vllm_fleet_hosts"] = hosts[1]
    log = folder / "rollout.log"
    bench = None
    began = time.monotonic()
    with log.open("w") as output:
        rollout = subprocess.Popen(
            [str(BIN / "ansible-playbook"), "-i", str(inv), "playbooks/rollout.yml", "-v", "-e",
             json.dumps(extra)],
            cwd=ROOT, env=env(), stdout=output, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            wait_for_turn(folder, rollout, log)
            base = frontend_requests(gateway_stat(inv, gateway))
            bench = start_load(inv, gateway, address, args, 0)
            # the benchmark's own start (imports, tokenizer) takes a while: the steady phase begins with the
            # load
            deadline = time.monotonic() + 180
            while frontend_requests(gateway_stat(inv, gateway)) < base + 3 * args.concurrency:
                if bench.poll() is not None or time.monotonic() > deadline:
                    said = bench.stdout.read()[-2000:] if bench.stdout else ""
                    raise SystemExit(f"the load did not start: {said}")
                time.sleep(1)
            time.sleep(args.steady)
            start = time.monotonic()
            (folder / "flowing").write_text("flowing\n")
            loading = keep_loading(
                folder,
                rollout,
                bench,
                lambda chunk: start_load(inv, gateway, address, args, chunk),
                args.after,
            )
        finally:
            for process in (rollout, bench):
                if process is not None and process.poll() is None:
                    process.kill()
    rollout_ok = rollout.returncode == 0
    rollout_out = log.read_text()
    requests, load_s = [], 0.0
    for chunk in range(len(loading.outputs)):
        fetched = folder / f"result-{chunk}.json"
        must(
            run([str(BIN / "ansible"), "-i", str(inv), gateway, "-m", "ansible.builtin.fetch", "-a",
                 f"src={RESULT.format(chunk=chunk)} dest={fetched} flat=true"]),
            "fetch the benchmark's result",
        )  # fmt: skip
        result = json.loads(fetched.read_text())
        requests += bench_requests(result)
        load_s += float(result.get("duration") or 0)
    end, back_at = loading.end, loading.back_at
    phases = phase_figures(requests, start, end, args.output_len)
    after_back = None if back_at is None else sum(r.start > back_at for r in requests)
    return {
        "drained": drained,
        "change": change,
        "rollout_ok": rollout_ok,
        "rollout_s": round(end - began, 1),
        "rollout_tail": "" if rollout_ok else rollout_out[-3000:],
        "rollout_log": str(log),
        "drains": drain_results(rollout_out),
        "bench_rc": loading.last_rc,
        # the load's runs (a first of --requests, then --more-requests each until the loaded host had been
        # back --after seconds) and their time together
        "load_runs": len(loading.outputs),
        "load_s": round(load_s, 1),
        # the loaded host's turn ended this long after the rollout went on, and so many requests started
        # after it (None: its turn never ended)
        "loaded_host_back_s": None if back_at is None else round(back_at - start, 1),
        "requests_after_loaded_host_back": after_back,
        "bench_tail": loading.outputs[-1][-600:] if loading.outputs else "",
        "hosts": hosts,
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
        f"{'run':<22} {'phase':<7} {'requests':>8} {'failed':>6} {'truncated':>9} {'P99 TTFT ms':>11}",
    ]
    for r in runs:
        label = "drained" if r["drained"] else "no drain (control)"
        for phase, f in r["phases"].items():
            p99 = "-" if f["p99_ttft_ms"] is None else f"{f['p99_ttft_ms']:.0f}"
            lines.append(
                f"{label:<22} {phase:<7} {f['requests']:>8} {f['failed']:>6} {f['truncated']:>9} {p99:>11}"
            )
        lines.append(f"{'':<22} rollout {r['rollout_s']} s, {'ok' if r['rollout_ok'] else 'FAILED'}")
        if r["loaded_host_back_s"] is not None:
            lines.append(
                f"{'':<22} the loaded host's turn ended {r['loaded_host_back_s']} s in; the load sent "
                f"{r['requests_after_loaded_host_back']} requests after it (load {r['load_s']} s in "
                f"{r['load_runs']} run(s))"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="gw-bench", help="lab name (a lab of 2 hosts is brought up)")
    parser.add_argument("--inventory", help="a lab inventory folder made as lab_inventory() makes it")
    parser.add_argument("--keep", action="store_true", help="leave the lab up")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2000, help="requests of the load's first run")
    parser.add_argument(
        "--more-requests",
        type=int,
        default=500,
        help="requests of each run that continues a load which ended too soon (see --after)",
    )
    parser.add_argument(
        "--after",
        type=float,
        default=10,
        help="seconds the load must run past the loaded host's return: a load that ends sooner is continued",
    )
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--steady", type=int, default=20, help="seconds of load before the rollout")
    parser.add_argument("--timeout", type=int, default=900, help="seconds the load may take at most")
    parser.add_argument("--port", type=int, default=4000, help="the gateway's port (fleet_gateway_port)")
    parser.add_argument("--only", choices=["drained", "control"], help="run one of the two")
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
        # the control first: it must stop a process that aborts (the lab's shutdown timeout 0)
        if args.only != "drained":
            runs.append(one_run(inv, args, drained=False, folder=work / "control"))
        if args.only != "control":
            runs.append(one_run(inv, args, drained=True, folder=work / "drained"))
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
