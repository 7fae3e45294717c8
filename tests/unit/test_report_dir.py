"""One folder for every report, `vllm_fleet_report_dir`: by default the controller's current directory's
reports/ (never playbook_dir, which is site-packages for a collection playbook); and the verify verdict
handed back with set_stats the way AWX reads it. The Ansible half runs real ansible-playbook through
ansible-runner (as AWX and `vllm-fleet rollout` do), against localhost, with the role's own task file and
defaults (about 10 s)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.reportdir import report_dir

REPO = Path(__file__).resolve().parents[2]


def test_unset_is_the_current_directorys_reports(tmp_path: Path) -> None:
    assert report_dir(None, "verify", cwd=tmp_path) == str(tmp_path / "reports" / "verify")
    assert report_dir("", "", cwd=tmp_path) == str(tmp_path / "reports")


def test_a_relative_folder_is_taken_from_the_current_directory(tmp_path: Path) -> None:
    assert report_dir("out/r", "plan", cwd=tmp_path) == str(tmp_path / "out" / "r" / "plan")
    assert report_dir("/srv/fleet/", "probe", cwd=tmp_path) == "/srv/fleet/probe"
    assert report_dir("~/r", "", cwd=tmp_path) == os.path.expanduser("~/r")


@pytest.mark.parametrize("value", [["a"], 3, {"a": 1}, "   ", "a\0b"])
def test_anything_but_a_path_names_the_variable(value: object) -> None:
    with pytest.raises(FleetInputError, match="vllm_fleet_report_dir"):
        report_dir(value, "verify")


@pytest.mark.parametrize("sub", ["/etc", "../up"])
def test_the_subfolder_stays_inside(sub: str) -> None:
    with pytest.raises(FleetInputError, match="vllm_fleet_report_dir"):
        report_dir("/r", sub)


PLAY = """\
- name: Verify's closing task and the report folders, as a collection user's playbook sees them
  hosts: all
  gather_facts: false
  tasks:
    - name: The verdict
      ansible.builtin.include_role:
        name: vllm_fleet.serving.vllm_verify
        tasks_from: stats
        public: true  # its defaults, for the next task
    - name: Record the folders
      ansible.builtin.copy:
        content: "{{ {'verify': vllm_verify_report_dir} | to_json }}"
        dest: "{{ playbook_dir }}/{{ inventory_hostname }}.dirs.json"
        mode: "0644"
"""
INVENTORY = """\
good ansible_connection=local ansible_python_interpreter={python}
bad ansible_connection=local ansible_python_interpreter={python}
"""
RESULTS = {
    "good": [{"instance": "i0", "ok": True, "msg": "", "report_path": "/r/good--i0.json"}],
    "bad": [
        {"instance": "i0", "ok": True, "msg": "", "report_path": "/r/bad--i0.json"},
        {"instance": "i1", "ok": False, "msg": "i1: /health 503", "report_path": "/r/bad--i1.json"},
    ],
}


def _run(tmp_path: Path, extravars: dict | None = None):
    ansible_runner = pytest.importorskip("ansible_runner")
    project = tmp_path / "project"
    project.mkdir(parents=True, exist_ok=True)
    (tmp_path / "runner").mkdir(exist_ok=True)
    # the playbook elsewhere: the reports follow the working directory, not playbook_dir
    book = tmp_path / "book"
    book.mkdir(exist_ok=True)
    (book / "play.yml").write_text(PLAY)
    inventory = tmp_path / "inventory"
    inventory.mkdir(exist_ok=True)
    (inventory / "hosts").write_text(INVENTORY.format(python=sys.executable))
    (inventory / "host_vars").mkdir(exist_ok=True)
    for host, results in RESULTS.items():
        (inventory / "host_vars" / f"{host}.json").write_text(json.dumps({"vllm_verify_results": results}))
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\n")
    env = {
        "ANSIBLE_COLLECTIONS_PATH": str(REPO),  # the clone's ansible_collections/vllm_fleet/serving
        "ANSIBLE_CONFIG": str(cfg),  # none of the clone's settings
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    events: list[dict] = []
    run = ansible_runner.run(
        private_data_dir=str(tmp_path / "runner"),
        project_dir=str(project),  # ansible-runner's working directory, as in AWX
        playbook=str(book / "play.yml"),
        inventory=str(inventory),
        extravars=extravars or {},
        envvars=env,
        event_handler=lambda e: events.append(e) or True,
        quiet=True,
    )
    stdout = run.stdout.read() if hasattr(run.stdout, "read") else ""
    return run, events, project, book, stdout


def test_verify_returns_every_hosts_verdict_with_set_stats(tmp_path: Path) -> None:
    run, events, project, book, stdout = _run(tmp_path)
    assert run.rc == 0, stdout
    stats = next(e for e in events if e.get("event") == "playbook_on_stats")
    # what AWX stores as the job's artifacts
    reports = str(project / "reports" / "verify")
    assert stats["event_data"]["artifact_data"] == {
        "vllm_verify": {
            "good": {"verdict": "passed", "instances": RESULTS["good"], "report_dir": reports},
            "bad": {"verdict": "failed", "instances": RESULTS["bad"], "report_dir": reports},
        }
    }
    assert json.loads((book / "good.dirs.json").read_text()) == {"verify": reports}


def test_one_variable_moves_the_reports_and_a_bad_one_is_named(tmp_path: Path) -> None:
    run, _, project, book, stdout = _run(tmp_path, {"vllm_fleet_report_dir": "elsewhere"})
    assert run.rc == 0, stdout
    dirs = json.loads((book / "bad.dirs.json").read_text())
    assert dirs == {"verify": str(project / "elsewhere" / "verify")}
    run, _, _, _, stdout = _run(tmp_path / "again", {"vllm_fleet_report_dir": ["not", "a", "path"]})
    assert run.rc != 0
    assert "vllm_fleet_report_dir must be a folder path" in stdout, stdout
