#!/usr/bin/env python3
"""An idempotent re-run of site.yml on one lab host, before and after a change, in the same sitting.

    sudo .venv/bin/python benchmarks/plan_rerun.py --before 5623628 [--after HEAD] [--rounds 3] [--keep]

For each revision (a scratch `git worktree` of it; its own vllm_fleet comes first on PYTHONPATH): site.yml
converges the lab host once (not timed: the plan files of two revisions differ, so the first run of each
restarts), then `--rounds` re-runs are timed, each of which must report changed=0. The revisions run one
after the other (interleaving would restart every run); run it on a quiet machine. Prints each run and the
ratio of the medians.
Written for issue 13 ("no slower" after one plan per host).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LAB = "bench-plan"


def run(argv: list[str], cwd: Path, timeout: float, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "ANSIBLE_NOCOLOR": "1",
    }
    environment.update(env)
    return subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False, env=environment
    )


def changed(stdout: str) -> int:
    recap = stdout.split("PLAY RECAP")[-1]
    return sum(int(n) for n in re.findall(r"changed=(\d+)", recap))


def site(tree: Path, inventory: Path, reports: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    proc = run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(inventory),
            "site.yml",
            "-e",
            f"vllm_fleet_report_dir={reports}",
            "-e",
            f"vllm_verify_report_dir={reports}/verify",
        ],
        cwd=tree,
        timeout=3600,
        PYTHONPATH=str(tree / "src"),
        ANSIBLE_CONFIG=str(tree / "ansible.cfg"),
    )
    return time.monotonic() - started, proc


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", required=True, help="git revision before the change")
    parser.add_argument("--after", default="HEAD", help="git revision after it (default HEAD)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the lab up")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-plan-"))
    trees = {}
    for label in ("before", "after"):
        rev = getattr(args, label)
        trees[label] = work / label
        subprocess.run(
            ["git", "worktree", "add", "-q", "--detach", str(trees[label]), rev], cwd=ROOT, check=True
        )
    inventory = work / "inventory.yml"
    (work / "group_vars" / "lab").mkdir(parents=True)
    shutil.copy(
        ROOT / "inventory" / "group_vars" / "lab" / "vllm.yml", work / "group_vars" / "lab" / "vllm.yml"
    )
    up = run(
        [str(BIN / "vllm-fleet"), "lab", "up", "--name", LAB, "--hosts", "1", "--inventory", str(inventory)],
        cwd=ROOT,
        timeout=3600,
    )
    if up.returncode != 0:
        print(up.stdout[-2000:], up.stderr[-2000:])
        return 1
    times: dict[str, list[float]] = {"before": [], "after": []}
    try:
        for label, tree in trees.items():
            for round_ in range(args.rounds + 1):
                wall, proc = site(tree, inventory, work / f"reports-{label}")
                if proc.returncode != 0:
                    print(f"{label} ({getattr(args, label)}): site.yml failed\n{proc.stdout[-4000:]}")
                    return 1
                if round_ == 0:
                    print(f"{label:6}  converge    {wall:6.1f} s  changed={changed(proc.stdout)}")
                    continue
                if changed(proc.stdout):
                    print(f"{label}: re-run reported changed={changed(proc.stdout)}\n{proc.stdout[-4000:]}")
                    return 1
                times[label].append(wall)
                print(f"{label:6}  re-run {round_}    {wall:6.1f} s  changed=0")
    finally:
        if not args.keep:
            run([str(BIN / "vllm-fleet"), "lab", "down", "--name", LAB], cwd=ROOT, timeout=600)
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
        shutil.rmtree(work, ignore_errors=True)
    before, after = statistics.median(times["before"]), statistics.median(times["after"])
    print(
        f"median re-run: before {before:.1f} s ({args.before}), after {after:.1f} s ({args.after}); "
        f"after/before = {after / before:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
