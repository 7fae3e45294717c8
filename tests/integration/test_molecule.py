"""Every molecule scenario under molecule/, run in full (`molecule test -s NAME`), so that its result lands in
pytest's summary. The scenarios run against real lab hosts (`vllm-fleet lab`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SCENARIOS = sorted(p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml"))
TIMEOUT_S = 3600


def test_there_are_scenarios():
    assert "default" in SCENARIOS


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(scenario, saved_venv_when_ready):
    # both scenarios' hosts start with the shared lab's saved venv when there is one (their inventories set
    # vllm_fleet_lab_preinstalled_vllm), so this waits for the other worker to have saved it
    # molecule runs ansible-config & co. by name: the venv's bin must come first on PATH
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "NO_COLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "PY_COLORS": "0",
    }
    proc = subprocess.run(
        [str(BIN / "molecule"), "test", "-s", scenario],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    output = proc.stdout + proc.stderr
    print(output[-6000:])
    assert proc.returncode == 0, f"molecule test -s {scenario} exited {proc.returncode}:\n{output[-12000:]}"
