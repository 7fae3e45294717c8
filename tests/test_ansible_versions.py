"""The supported ansible-core lines other than the default venv's: the tests that load ansible-core, on each.

pyproject.toml admits ansible-core 2.19, 2.20 and 2.21; the default .venv (Debian 12's Python 3.11) gets 2.19,
the whole suite runs there. This runs `scripts/test-ansible-versions --quick` for 2.20 and 2.21 (Python >=
3.12, a venv each, made by uv in seconds from its cache): the plugin, filter, argument-spec, templating,
ansible-doc and syntax-check tests, about a minute a line. The whole suite on one line:
`scripts/test-ansible-versions 2.21`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.parametrize("line", ["2.20", "2.21"])
def test_ansible_core_line_passes_the_ansible_facing_tests(line: str) -> None:
    result = subprocess.run(
        [str(ROOT / "scripts/test-ansible-versions"), "--quick", line],
        cwd=ROOT,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    # the line really ran: the venv's ansible-core is of that line, and tests passed on it
    assert f"test-ansible-versions: ansible-core {line}." in output, output[-2000:]
    assert " passed" in output and " failed" not in output, output[-4000:]
