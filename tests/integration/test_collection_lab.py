"""The collection as a user outside the clone gets it: a fresh venv holding only the wheel (`pip wheel`
of this clone, installed with uv), a playbook and an inventory in a temporary folder, run from that folder
with the venv's own ansible-playbook and an ansible.cfg that names no collections path (the settings
docs/installing.md recommends, the collection's callbacks among them), so vllm_fleet.serving can only come
from the venv's site-packages. The playbook imports `vllm_fleet.serving.site` (preflight, install, tune,
deploy, verify) and then plays the role `vllm_fleet.serving.vllm_verify` on its own, against the session's
shared installed lab host (tests/integration/conftest.py: no new lab, no new vLLM install).

The user's inventory pins vLLM by its minor release (`vllm_install_version: "0.32"`, the lab installed
0.32.0). It passes when the run converges and verifies the host (rc 0, every verify report ok, the verdict in
the custom stats) and every report lands in <that folder>/reports (vllm_fleet_report_dir's default: the
current directory's reports/), none in site-packages and none in the clone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from wheelvenv import build_wheel_venv

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
COLLECTION = ("ansible_collections", "vllm_fleet", "serving")

PLAYBOOK = """\
---
- name: The whole pipeline, from the installed collection
  ansible.builtin.import_playbook: vllm_fleet.serving.site

- name: One of the collection's roles on its own, as a user's play calls it
  hosts: lab
  gather_facts: false
  roles:
    - role: vllm_fleet.serving.vllm_verify
"""

# a user's own ansible.cfg as docs/installing.md recommends it: the collection's callbacks (they too must come
# from the venv's site-packages), facts only in ansible_facts, the inventory's variables read once
USER_CFG = """\
[defaults]
retry_files_enabled = False
callbacks_enabled = vllm_fleet.serving.vllm_fleet_timing, vllm_fleet.serving.vllm_fleet_preload
inject_facts_as_vars = False
run_vars_plugins = start
"""


def _files(folder: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()} if folder.is_dir() else {}


def _of(hosts: set[str], files: dict[Path, int]) -> dict[Path, int]:
    """The reports of these hosts (the other worker's labs may write theirs into the clone meanwhile)."""
    return {p: t for p, t in files.items() if p.stem.split("--")[0] in hosts}


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with only the wheel built from this clone (uv installs it from its cache in seconds)."""
    _wheel, venv = build_wheel_venv(tmp_path_factory.mktemp("collection-wheel"))
    return venv


def test_a_playbook_outside_the_clone_converges_and_verifies_the_lab_host(
    installed_lab, wheel_venv: Path, tmp_path: Path
) -> None:
    user = tmp_path / "user"
    # the lab's inventory (hosts, connection, the lab's variables), copied: nothing is read from the clone
    shutil.copytree(installed_lab.inventory, user / "inventory", ignore=shutil.ignore_patterns("examples"))
    # a user pins the minor release (issue 15's "0.11" pin): PEP 440 makes it the installed 0.32.0, so the run
    # installs nothing and plans what the exact pin plans (a manual lab run also installed from it)
    lab_vars = user / "inventory" / "group_vars" / "lab" / "vllm.yml"
    exact = 'vllm_install_version: "0.32.0"'
    assert exact in lab_vars.read_text(encoding="utf-8")
    lab_vars.write_text(lab_vars.read_text(encoding="utf-8").replace(exact, 'vllm_install_version: "0.32"'))
    (user / "site.yml").write_text(PLAYBOOK, encoding="utf-8")
    (user / "ansible.cfg").write_text(USER_CFG, encoding="utf-8")
    bindir = wheel_venv / "bin"
    site_packages = next((wheel_venv / "lib").glob("python3*/site-packages"))
    installed = site_packages.joinpath(*COLLECTION)
    assert (installed / "galaxy.yml").is_file(), "the wheel did not install the collection"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")},
        "PATH": f"{bindir}:/usr/sbin:/usr/bin:/sbin:/bin",
        "ANSIBLE_CONFIG": str(user / "ansible.cfg"),
        # no collections path holds vllm_fleet.serving (not ~/.ansible/collections where molecule leaves one)
        "ANSIBLE_COLLECTIONS_PATH": str(user / "no-collections"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_SHOW_CUSTOM_STATS": "1",
    }
    clone_reports = _files(ROOT / "reports")
    run = subprocess.run(
        [str(bindir / "ansible-playbook"), "-i", "inventory/", "site.yml"],
        cwd=user, env=env, capture_output=True, text=True, timeout=2700, check=False,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    # the roles and plugins came from the venv's site-packages, the callbacks too (the timing table)
    assert "vllm_fleet.serving" in out and "stage timings (wall clock):" in out
    reports = user / "reports"
    verify = sorted((reports / "verify").glob("*.json"))
    assert verify, f"no verify report under {reports}: {sorted(map(str, reports.rglob('*')))}"
    for path in verify:
        data = json.loads(path.read_text(encoding="utf-8"))
        assert data["ok"] is True, (path, [c for c in data["checks"] if not c.get("ok", True)])
    hosts = {json.loads(p.read_text())["host"] for p in verify}
    assert {p.stem for p in (reports / "plan").glob("*.json")} == hosts
    assert {p.stem for p in (reports / "probe").glob("*.json")} == hosts
    # set_stats: what AWX keeps as the job's artifacts; the default callback prints it as one JSON line
    (line,) = [s for s in out[out.rindex("CUSTOM STATS") :].splitlines() if s.strip().startswith("RUN:")]
    verdicts = json.loads(line.split("RUN:", 1)[1])["vllm_verify"]
    assert {h: v["verdict"] for h, v in verdicts.items()} == dict.fromkeys(hosts, "passed"), line
    assert {v["report_dir"] for v in verdicts.values()} == {str(reports / "verify")}, line
    assert not (installed / "reports").exists(), "reports written into site-packages"
    written = _of(hosts, _files(ROOT / "reports"))
    assert written == _of(hosts, clone_reports), "reports written into the clone"
