"""`vllm-fleet rollout`'s hand-over to ansible-playbook, through a real ansible-runner run on localhost.

The rollout playbook here is a stand-in (a project folder with playbooks/rollout.yml of two tagged debug
tasks) so that the test sees what ansible-playbook received: the arguments after `--`, `-e` read the way
ansible-playbook reads it, and the user's ansible.cfg (its `forks`) kept.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from vllm_fleet.cli.rollout import (
    default_report_dir,
    parse_extra_vars,
    playbook_cmdline,
)
from vllm_fleet.project import fleet_report_dir

BIN = Path(sys.executable).parent

PLAYBOOK = """\
- name: What the playbook was given
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Report
      ansible.builtin.debug:
        msg: "check={{ ansible_check_mode }} a={{ a }} b={{ b }} forks={{ forks }} reports={{ reports }}"
      vars:
        forks: "{{ lookup('ansible.builtin.config', 'DEFAULT_FORKS') }}"
        reports: "{{ vllm_fleet_report_dir }}"
      tags: [picked]
    - name: Left out by --tags
      ansible.builtin.fail:
        msg: the --tags given after -- did not reach ansible-playbook
      tags: [other]
"""


def test_run_folders_sit_in_the_reports_folder_of_a_clone_or_of_the_working_directory(tmp_path: Path) -> None:
    clone, installed, cwd = tmp_path / "clone", tmp_path / "site-packages" / "serving", tmp_path / "work"
    clone.mkdir()
    (clone / "pyproject.toml").write_text("")
    assert default_report_dir(clone, cwd) == fleet_report_dir(clone, cwd) / "rollouts"
    assert default_report_dir(clone, cwd) == clone / "reports" / "rollouts"
    assert default_report_dir(installed, cwd) == cwd / "reports" / "rollouts"  # never into site-packages


def test_extra_vars_are_read_as_ansible_playbook_reads_them() -> None:
    assert parse_extra_vars(["a=1 b='two words'"]) == {"a": "1", "b": "two words"}
    assert parse_extra_vars(['{"serial": [1, "25%"]}']) == {"serial": [1, "25%"]}


def test_arguments_after_the_separator_are_quoted_for_runner() -> None:
    assert playbook_cmdline(["--", "--limit", "web 1", "--check"]) == "--limit 'web 1' --check"
    assert playbook_cmdline([]) is None


def test_rollout_passes_arguments_through_and_keeps_the_users_ansible_cfg(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "playbooks").mkdir(parents=True)
    (project / "playbooks" / "rollout.yml").write_text(PLAYBOOK, encoding="utf-8")
    user = tmp_path / "user"
    user.mkdir()
    (user / "ansible.cfg").write_text("[defaults]\nforks = 7\n", encoding="utf-8")
    (user / "hosts.ini").write_text("localhost ansible_connection=local\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "ANSIBLE_CONFIG"}
    result = subprocess.run(
        [
            str(BIN / "vllm-fleet"), "rollout", "-i", "hosts.ini", "--project-dir", str(project),
            "--report-dir", str(tmp_path / "runs"), "--run-id", "r1", "--json", "-e", "a=1 b=2",
            "--", "--check", "--tags", "picked",
        ],
        cwd=user, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    log = (tmp_path / "runs" / "r1" / "ansible.log").read_text(encoding="utf-8")
    # reports under the user's directory, not the project (ansible-runner's cwd: site-packages when installed)
    expected = f"check=True a=1 b=2 forks=7 reports={user / 'reports'}"
    assert expected in log, log[-3000:] + result.stderr[-3000:]
    assert "Left out by --tags" not in log
    summary = json.loads(result.stdout)
    assert summary["ansible"]["rc"] == 0, summary
    # runner's artifacts stay in the run folder; its env/ (extra vars as a file) does not
    runner = tmp_path / "runs" / "r1" / "ansible-runner"
    assert list((runner / "artifacts").glob("*/job_events/*.json"))
    assert not (runner / "env").exists()
