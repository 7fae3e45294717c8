"""The suite's schedule on two workers (`pytest -n 2`; pytest-xdist, `--dist loadgroup` in pyproject.toml).

On two cores one process runs the suite at about half the machine: a lab test waits on a vLLM start, a pip
install or an Ansible round trip much of the time. Two workers take units of work from one queue: the tests
that share the installed lab (tests/integration/conftest.py, `installed_lab`) are one unit, run one after the
other by one worker; every other module is a unit of its own, so that its module-scoped fixtures (a lab, a
venv, a checkout) are made once. The longest units go first, so that the workers end close together. With -n 0
it is the order of the one process.

The package caches the tests fill (uv's for the wheel venvs and the ansible-core lines, pip's for the vLLM
venvs and wheelhouses) are the project's own, under ~/.cache/vllm-fleet (`vllm_fleet.lab.leftovers`), unless
UV_CACHE_DIR / PIP_CACHE_DIR are set: `vllm-fleet lab clean --all` removes them without touching the user's.

While tests run, the process that prints the results also prints which tests are still running whenever it
printed nothing for 14 s (tests/unit/heartbeat.py): a lab test runs for minutes, and a run should never look
hung (issue 20).
"""

from __future__ import annotations

import os
from pathlib import Path

import heartbeat  # tests/unit/heartbeat.py
import pytest

from vllm_fleet.lab.leftovers import leftovers

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_CACHE = leftovers().package_cache
for variable, tool in (("UV_CACHE_DIR", "uv"), ("PIP_CACHE_DIR", "pip")):
    os.environ.setdefault(variable, str(PACKAGE_CACHE / tool))
SHARED_LAB_FIXTURE = "installed_lab"
SHARED_LAB_GROUP = "shared-lab"
# After the shared lab's group, the modules that take longest (serial minutes, from benchmarks/README.md,
# "The suite's schedule"), longest first. test_render_real_parser (8 min, pip-bound, no lab) goes before
# test_rollout_lab (10-12 min) so that the venv the shared lab saves is in the cache before the rollout lab
# starts its hosts with it. The shared lab's group must not be the long pole: test_hardening_lab (5-6 min)
# and test_plan_lab's converge test (about 10 min) have lab hosts of their own (own_installed_lab) and run
# on whichever worker is free.
LONGEST_FIRST = (
    "tests/integration/test_render_real_parser.py",
    "tests/integration/test_rollout_lab.py",
    # its own 2-host lab starts with the saved venv too (benchmarks/README.md)
    "tests/integration/test_gateway_lab.py",
    # a fresh lab host for the refusals, then its own installed one for the converge test: about 12 min
    "tests/integration/test_plan_lab.py",
    # two lab hosts with the saved venv, one PP 2 instance over them through the playbooks; about 3 min
    "tests/integration/test_multinode_playbooks_lab.py",
    "tests/integration/test_molecule.py",
    "tests/integration/test_hardening_lab.py",
    "tests/integration/test_driver_lab.py",
    "tests/integration/test_install_lab.py",
    "tests/integration/test_lab.py",
    "tests/test_ansible_versions.py",
    "tests/test_static.py",
)


def _shares_the_lab(item: pytest.Item) -> bool:
    return SHARED_LAB_FIXTURE in item.fixturenames


def _module(item: pytest.Item) -> str:
    return item.path.relative_to(ROOT).as_posix()


def _rank(item: pytest.Item) -> int:
    if _shares_the_lab(item):
        return -1
    module = _module(item)
    return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist turns each item's xdist_group into its unit of work
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each item's unit of work (its xdist_group), then the units in the order the workers take them; a stable
    sort keeps the order within a module and of the modules not named."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(SHARED_LAB_GROUP if _shares_the_lab(item) else _module(item)))
    items.sort(key=_rank)


@pytest.hookimpl(trylast=True)  # after the terminal reporter is registered
def pytest_configure(config: pytest.Config) -> None:
    heartbeat.start(config)
