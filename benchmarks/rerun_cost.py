#!/usr/bin/env python3
"""What an idempotent re-run of site.yml costs on a converged fleet of 1, 2 and 4 lab hosts, against
`ansible -m ansible.builtin.setup` on the same hosts in the same run (issue 21; not a timed test).

    sudo .venv/bin/python benchmarks/rerun_cost.py [--hosts 1,2,4] [--rounds 3] [--name rerun-bench] [--keep]

One lab of max(--hosts) hosts (systemd-nspawn, real systemd, the real vLLM CPU build) is brought up and
converged once with site.yml (not timed), then re-run once to settle (the first re-run after a converge is the
first light verify). Then for each N, on the first N hosts (`-e vllm_fleet_hosts=...`, the host pattern every
playbook uses; `ansible` gets the same pattern), `--rounds` times each, interleaved: `ansible -m setup` on the
N hosts, and site.yml, which must report changed=0 on every host
(else the benchmark fails: it measures re-checks, not changes). Prints the best of the rounds (the least
disturbed by other work on the machine) for setup and re-run, re-run/setup per N, re-run(N)/re-run(1), and the
per-role seconds of that best re-run (the vllm_fleet_timing callback's table), the tasks per host, the CPU
of the controller and of the rest of the machine (the lab hosts share its cores), and what one remote module
run costs (a row of `ansible.builtin.ping` tasks on one host).
With --reuse, a lab of that name that is already up and converged is used as it is and left up.
With --compare-preload, each round also re-runs site.yml without the vllm_fleet_preload callback (only the
timing callback enabled), so the two are measured side by side on the same machine state.
It says what it is doing at every step and every 10 s while one runs (issue 32: 175 s without a line), and
removes its work folder (inventory, reports) at the end; with --keep it leaves both the lab and the folder.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vllm_fleet.lab import run as lab_run
from vllm_fleet.lab import spec as lab

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CLI = str(BIN / "vllm-fleet")
ROLE_LINE = re.compile(r"^\s+(.+?) \((\d+) tasks?\)\s+([\d.]+) s$")


# ansible.cfg's callbacks without vllm_fleet_preload (the environment overrides the file)
WITHOUT_PRELOAD = {"ANSIBLE_CALLBACKS_ENABLED": "vllm_fleet.serving.vllm_fleet_timing"}


HEARTBEAT_S = 10.0


@contextmanager
def saying(what: str) -> Iterator[None]:
    """Print what the benchmark starts, then every HEARTBEAT_S how long it has been at it: a step takes
    minutes (a lab up, a converge) and its output is captured for the figures."""
    started = time.monotonic()
    print(f"rerun_cost: {what} ...", flush=True)
    done = threading.Event()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            print(f"rerun_cost: {what}: {time.monotonic() - started:.0f} s", flush=True)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def run(
    argv: list[str], timeout: float, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "ANSIBLE_NOCOLOR": "1",
        **(extra_env or {}),
    }
    return subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


def machine_busy_seconds() -> float:
    """CPU seconds every core of this machine spent busy since boot (/proc/stat: all but idle and iowait): the
    lab hosts' sshd and module runs, and the idle vLLM servers, share these cores with the controller."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]
    return busy / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """User and system CPU seconds of the finished child processes (ansible-playbook and its ssh clients)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def recap_changed(stdout: str) -> dict[str, int]:
    recap = stdout.split("PLAY RECAP")[-1]
    return {host: int(n) for host, n in re.findall(r"^(\S+)\s*: ok=\d+\s+changed=(\d+)", recap, re.M)}


def recap_tasks(stdout: str, hosts: list[str]) -> int:
    """Tasks the run took on a host (ok + skipped: a converged re-run has no other), the most of any host."""
    recap = stdout.split("PLAY RECAP")[-1]
    counts = {
        host: int(ok) + int(skipped)
        for host, ok, skipped in re.findall(r"^(\S+)\s*: ok=(\d+).*?skipped=(\d+)", recap, re.M)
    }
    return max(counts.get(host, 0) for host in hosts)


def role_table(stdout: str) -> dict[str, float]:
    """Seconds per role from the timing callback's "role timings" table."""
    table = stdout.split("role timings (wall clock, slowest first):")[-1].split("slowest ")[0]
    return {m[1]: float(m[3]) for line in table.splitlines() if (m := ROLE_LINE.match(line))}


def site(
    inventory: Path, reports: Path, hosts: list[str], extra_env: dict[str, str] | None = None
) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    proc = run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(inventory),
            "site.yml",
            "-e",
            f"vllm_fleet_hosts={':'.join(hosts)}",
            "-e",
            f"vllm_fleet_report_dir={reports}",
            "-e",
            f"vllm_verify_report_dir={reports}/verify",
        ],
        timeout=3600,
        extra_env=extra_env,
    )
    return time.monotonic() - started, proc


def setup(inventory: Path, hosts: list[str]) -> float:
    started = time.monotonic()
    proc = run(
        [str(BIN / "ansible"), "-i", str(inventory), ":".join(hosts), "-m", "ansible.builtin.setup"], 600
    )
    if proc.returncode != 0:
        raise SystemExit(f"ansible -m setup failed:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return time.monotonic() - started


def rerun(
    inventory: Path, reports: Path, hosts: list[str], extra_env: dict[str, str] | None = None
) -> tuple[float, dict[str, float], tuple[float, float], int]:
    """Wall seconds, seconds per role, (controller CPU seconds, machine CPU seconds) and the tasks per host
    of one re-run."""
    controller, machine = children_cpu_seconds(), machine_busy_seconds()
    wall, proc = site(inventory, reports, hosts, extra_env)
    cpu = (children_cpu_seconds() - controller, machine_busy_seconds() - machine)
    changed = recap_changed(proc.stdout)
    if proc.returncode != 0 or not set(hosts) <= set(changed) or any(changed.values()):
        raise SystemExit(f"the re-run was not a converged no-op ({changed}):\n{proc.stdout[-5000:]}")
    return wall, role_table(proc.stdout), cpu, recap_tasks(proc.stdout, hosts)


MODULE_RUNS = 20


def module_run_cost(inventory: Path, work: Path, host: str) -> tuple[float, float, float]:
    """What one remote module run costs, from MODULE_RUNS `ansible.builtin.ping` tasks in a row on one host:
    (wall seconds, controller CPU seconds, CPU seconds outside the controller: the lab host's sshd and the
    module's Python) per run. ansible-core's AnsiballZ wrapper imports module_utils from a zip, compiled from
    source on every run."""
    playbook = work / "ping.yml"
    tasks = "".join(f"    - name: Ping {i}\n      ansible.builtin.ping:\n" for i in range(MODULE_RUNS))
    playbook.write_text(f"- name: Ping\n  hosts: {host}\n  gather_facts: false\n  tasks:\n{tasks}")
    controller, machine, started = children_cpu_seconds(), machine_busy_seconds(), time.monotonic()
    proc = run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook)], 600)
    wall = time.monotonic() - started
    controller, machine = children_cpu_seconds() - controller, machine_busy_seconds() - machine
    if proc.returncode != 0:
        raise SystemExit(f"the ping playbook failed:\n{proc.stdout[-3000:]}")
    return wall / MODULE_RUNS, controller / MODULE_RUNS, (machine - controller) / MODULE_RUNS


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", default="1,2,4", help="fleet sizes, comma-separated (default 1,2,4)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--name", default="rerun-bench", help="the lab's name")
    parser.add_argument("--reuse", action="store_true", help="use a lab of --name that is up and converged")
    parser.add_argument("--keep", action="store_true", help="leave the lab up")
    parser.add_argument(
        "--compare-preload", action="store_true", help="also re-run without the vllm_fleet_preload callback"
    )
    args = parser.parse_args()
    sizes = sorted({int(n) for n in args.hosts.split(",")})
    names = [f"{args.name}-{i}" for i in range(1, max(sizes) + 1)]
    if args.reuse and lab_run.status(args.name)["status"] != "up":
        # site.yml would bring it up and install vLLM on it: minutes that are not what --reuse asked for
        print(f"rerun_cost: --reuse: lab {args.name} is not up; run without --reuse to bring it up")
        return 2
    # a SIGTERM (timeout, CI) ends the run through the finally below: the lab down, the work folder removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="rerun-bench-"))
    kept = " (kept: --keep)" if args.keep else " (removed at the end)"
    print(f"rerun_cost: lab {args.name}, {max(sizes)} host(s); work folder {work}{kept}", flush=True)
    try:
        return _measure(args, sizes, names, work)
    finally:
        if not (args.keep or args.reuse):
            with saying(f"taking lab {args.name} down"):
                run([CLI, "lab", "down", "--name", args.name], 600)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _measure(args: argparse.Namespace, sizes: list[int], names: list[str], work: Path) -> int:
    inventory = work / "inventory"
    (inventory / "group_vars" / "lab").mkdir(parents=True)
    shutil.copy(ROOT / "inventory" / "group_vars" / "lab" / "vllm.yml", inventory / "group_vars" / "lab")
    # the converge is not measured: the hosts start with a saved vLLM venv when there is one (no pip)
    lab_up = [CLI, "lab", "up", "--name", args.name, "--hosts", str(max(sizes)), "--preinstalled-vllm"]
    if args.reuse:
        lab_run.write_inventory(lab.plan_lab(args.name, names, lab.lab_root()), inventory / "hosts.yml", True)
    else:
        with saying(f"bringing lab {args.name} up (the first `lab up` also builds the lab caches: minutes)"):
            up = run([*lab_up, "--inventory", str(inventory / "hosts.yml")], 3600)
        if up.returncode != 0:
            print(up.stdout[-2000:], up.stderr[-2000:])
            return 1
    reports = work / "reports"
    if not args.reuse:
        with saying(f"converging {max(sizes)} host(s) with site.yml (not timed)"):
            wall, proc = site(inventory, reports, names)
        if proc.returncode != 0:
            print(f"converging {max(sizes)} hosts failed:\n{proc.stdout[-5000:]}")
            return 1
        print(f"converge {max(sizes)} hosts: {wall:.0f} s (not part of the figures)")
    with saying("settling re-run (the first light verify after a converge, not timed)"):
        rerun(inventory, reports, names)
    setups: dict[int, list[float]] = {n: [] for n in sizes}
    reruns: dict[int, list[tuple[float, dict[str, float], tuple[float, float], int]]] = {n: [] for n in sizes}
    unloaded: dict[int, list[float]] = {n: [] for n in sizes}
    for round_ in range(1, args.rounds + 1):
        for n in sizes:
            with saying(f"round {round_} of {args.rounds}, {n} host(s): ansible -m setup, then the re-run"):
                setups[n].append(setup(inventory, names[:n]))
                reruns[n].append(rerun(inventory, reports, names[:n]))
                wall = reruns[n][-1][0]
                line = f"round {round_}, {n} host(s): setup {setups[n][-1]:5.1f} s, re-run {wall:5.1f} s"
                if args.compare_preload:
                    unloaded[n].append(rerun(inventory, reports, names[:n], WITHOUT_PRELOAD)[0])
                    line += f", without preload {unloaded[n][-1]:5.1f} s"
            print(line, flush=True)
    with saying(f"{MODULE_RUNS} x ansible.builtin.ping on {names[0]}"):
        module_cost = module_run_cost(inventory, work, names[0])
    load = os.getloadavg()
    print(f"\n{os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end")
    best = {n: min(reruns[n], key=lambda item: item[0]) for n in sizes}
    one = best[sizes[0]][0]
    versus_one = f"re-run/re-run({sizes[0]})"
    print(
        f"{'hosts':>5}  {'tasks/host':>10}  {'setup s':>8}  {'re-run s':>8}  {'re-run/setup':>12}"
        f"  {versus_one:>16}  {'controller CPU s':>16}  {'hosts CPU s':>11}  {'CPU floor s':>11}"
    )
    cores = os.cpu_count() or 1
    for n in sizes:
        s = min(setups[n])
        wall, _, (controller, machine), tasks = best[n]
        print(
            f"{n:>5}  {tasks:10d}  {s:8.1f}  {wall:8.1f}  {wall / s:12.1f}  {wall / one:16.2f}"
            f"  {controller:16.1f}  {machine - controller:11.1f}  {machine / cores:11.1f}"
        )
    print(
        "(hosts CPU: the machine's busy CPU seconds less the controller's: the lab hosts' sshd and module"
        f" runs, the idle vLLM servers; CPU floor: all busy CPU seconds over the {cores} cores, the shortest"
        " wall time this machine allows that run)"
    )
    base_wall, _, (_, base_machine), _ = best[sizes[0]]
    for n in sizes[1:]:
        wall, _, (_, machine), _ = best[n]
        print(
            f"{n} hosts against {sizes[0]}: {wall - base_wall:.1f} s more wall time for"
            f" {machine - base_machine:.1f} CPU seconds more work ({(machine - base_machine) / cores:.1f} s"
            f" on {cores} cores)"
        )
    per_wall, per_controller, per_host = module_cost
    print(
        f"one remote module run ({MODULE_RUNS} x ansible.builtin.ping on {names[0]}): {per_wall:.2f} s wall,"
        f" controller CPU {per_controller:.3f} s, CPU outside the controller {per_host:.3f} s"
    )
    if args.compare_preload:
        print(f"\n{'hosts':>5}  {'re-run s':>8}  {'without preload s':>17}  {'ratio':>5}")
        for n in sizes:
            print(
                f"{n:>5}  {best[n][0]:8.1f}  {min(unloaded[n]):17.1f}  {min(unloaded[n]) / best[n][0]:5.2f}"
            )
    roles = sorted(
        {role for _, table, _, _ in best.values() for role in table},
        key=lambda r: -best[sizes[-1]][1].get(r, 0),
    )
    print("\nper role, seconds of the best re-run:")
    print(f"  {'role':24}" + "".join(f"{str(n) + ' host(s)':>12}" for n in sizes))
    for role in roles:
        print(f"  {role:24}" + "".join(f"{best[n][1].get(role, 0.0):12.1f}" for n in sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
