"""Static checks that gate every change: ruff, ansible-lint (production profile), playbook syntax."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PLAYBOOKS = sorted([ROOT / "site.yml", *(ROOT / "playbooks").glob("*.yml")])


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_ruff_is_clean() -> None:
    result = run([str(BIN / "ruff"), "check", "."])
    assert result.returncode == 0, result.stdout + result.stderr


def test_ansible_lint_production_profile_is_clean() -> None:
    result = run([str(BIN / "ansible-lint"), "--profile", "production", "--offline", "--nocolor"])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]


@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=lambda p: p.name)
def test_playbook_syntax(playbook: Path) -> None:
    result = run([str(BIN / "ansible-playbook"), "--syntax-check", "-i", "inventory/", str(playbook)])
    assert result.returncode == 0, result.stdout + result.stderr
