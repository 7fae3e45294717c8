"""The module vllm_fleet_rollout_config (vllm_rollout's read of a host's configuration and its snapshot, one
call each, issue 32) on real files: it lists what the role's `ansible.builtin.find` tasks listed (the same
paths and sha1 checksums, so the same fingerprints and snapshot names), and keeps a snapshot as the `file` and
`copy` tasks did (folders 0700, modes kept), writing nothing the second time."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pluginload import load_plugin

REPO = Path(__file__).resolve().parents[2]
MODULE = load_plugin(
    REPO / "plugins" / "modules" / "vllm_fleet_rollout_config.py", "rollout_config_under_test"
)
BIN = Path(sys.executable).parent
# the marker line vllm_service writes in each instance's unit (deploy.service), beside its other lines
UNIT = "[Unit]\nDescription=vLLM instance {name} (vllm-fleet)\nX-VllmFleet-Instance={name}\n[Service]\n"


@pytest.fixture
def host(tmp_path: Path) -> dict[str, str]:
    """A host's configuration as vllm_service writes it: two instance units, host_tuning's unit (same prefix,
    no marker), each instance's env file (0600) and plan, the applied digests, and files that are none."""
    dirs = {name: tmp_path / name for name in ("units", "config", "state")}
    for folder in dirs.values():
        folder.mkdir()
    for name in ("i0", "i1"):
        (dirs["units"] / f"vllm-fleet-{name}.service").write_text(UNIT.format(name=name))
        (dirs["config"] / f"{name}.env").write_text(f'VLLM_API_KEY="secret-{name}"\n')
        (dirs["config"] / f"{name}.env").chmod(0o600)
        (dirs["config"] / f"{name}.json").write_text(json.dumps({"instance": name}))
        (dirs["state"] / name).write_text(hashlib.sha256(name.encode()).hexdigest())
    (dirs["units"] / "vllm-fleet-tuning.service").write_text("[Unit]\nDescription=tuning\n")
    (dirs["units"] / "other.service").write_text(UNIT.format(name="x"))
    (dirs["config"] / "README").write_text("not a plan\n")
    return {
        "unit_dir": str(dirs["units"]),
        "unit_prefix": "vllm-fleet-",
        "unit_marker": "^X-VllmFleet-Instance=",
        "config_dir": str(dirs["config"]),
        "state_dir": str(dirs["state"]),
    }


def find(**args: object) -> list[dict[str, str]]:
    """What the role's find task listed: ansible.builtin.find run for real on this machine."""
    done = subprocess.run(
        [str(BIN / "ansible"), "localhost", "-c", "local", "-o", "-m", "ansible.builtin.find", "-a",
         json.dumps({**args, "get_checksum": True})],
        capture_output=True, text=True, timeout=120, check=True,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        cwd=REPO,
    )  # fmt: skip
    files = json.loads(done.stdout.split(" => ", 1)[1])["files"]
    return sorted(({"path": f["path"], "checksum": f["checksum"]} for f in files), key=lambda f: f["path"])


def test_read_lists_what_the_find_tasks_listed_with_the_plans_text(host: dict[str, str]) -> None:
    read = MODULE.read_config(host)
    units = find(paths=host["unit_dir"], patterns=["vllm-fleet-*.service"], contains="^X-VllmFleet-Instance=")
    assert read["units"] == units and [Path(u["path"]).name for u in units] == [
        "vllm-fleet-i0.service",
        "vllm-fleet-i1.service",
    ]
    assert read["config"] == find(paths=host["config_dir"], patterns=["*.env", "*.json"])
    assert read["state"] == find(paths=host["state_dir"])
    assert [json.loads(plan) for plan in read["plans"]] == [{"instance": "i0"}, {"instance": "i1"}]
    # no plan text of an env file: those hold the key
    assert not any("secret" in plan for plan in read["plans"])


def test_read_of_a_host_with_nothing_deployed_is_empty(tmp_path: Path) -> None:
    missing = {key: str(tmp_path / key) for key in ("unit_dir", "config_dir", "state_dir")}
    read = MODULE.read_config(
        {**missing, "unit_prefix": "vllm-fleet-", "unit_marker": "^X-VllmFleet-Instance="}
    )
    assert read == {"units": [], "config": [], "state": [], "plans": []}


def test_keep_copies_once_root_only_and_again_only_what_changed(host: dict[str, str], tmp_path: Path) -> None:
    read = MODULE.read_config(host)
    snapshot = tmp_path / "history" / "cfg-0123456789abcdef"
    params = {
        "snapshot": str(snapshot),
        "units": [f["path"] for f in read["units"]],
        "config": [f["path"] for f in read["config"]],
        "state_files": [f["path"] for f in read["state"]],
    }
    assert MODULE.keep_config(params, check_mode=True) and not snapshot.exists()
    written = MODULE.keep_config(params)
    assert len(written) == 4 + 2 + 4 + 2
    for folder in (snapshot, *(snapshot / name for name in ("units", "config", "state"))):
        assert folder.stat().st_mode & 0o7777 == 0o700
    for kind, folder in (("units", "units"), ("config", "config"), ("state_files", "state")):
        for source in params[kind]:
            kept = snapshot / folder / Path(source).name
            assert kept.read_bytes() == Path(source).read_bytes()
            assert kept.stat().st_mode & 0o7777 == Path(source).stat().st_mode & 0o7777
    assert (snapshot / "config" / "i0.env").stat().st_mode & 0o7777 == 0o600
    assert MODULE.keep_config(params) == []
    Path(params["config"][1]).write_text('{"instance": "i0", "changed": true}')
    assert MODULE.keep_config(params) == [str(snapshot / "config" / "i0.json")]
    assert not list(snapshot.rglob(".keep-*"))


def test_restore_puts_the_kept_files_back_and_removes_what_the_failed_one_added(
    host: dict[str, str], tmp_path: Path
) -> None:
    good = MODULE.read_config(host)
    paths = {kind: [f["path"] for f in good[kind]] for kind in ("units", "config", "state")}
    snapshot = tmp_path / "history" / "cfg-good"
    kept = {"snapshot": str(snapshot), "units": paths["units"], "config": paths["config"]}
    MODULE.keep_config({**kept, "state_files": paths["state"]})
    # the failed configuration: a changed plan and env file (mode too), a new instance's unit
    Path(paths["config"][1]).write_text('{"instance": "i0", "failed": true}')
    Path(paths["config"][0]).write_text('VLLM_API_KEY="other"\n')
    Path(paths["config"][0]).chmod(0o644)
    added = Path(host["unit_dir"]) / "vllm-fleet-i2.service"
    added.write_text(UNIT.format(name="i2"))
    restore = {**kept, "state_files": paths["state"], "remove": [str(added)]}
    assert MODULE.restore_config(restore, check_mode=True) == (paths["config"][:2], [str(added)])
    assert added.exists()
    assert MODULE.restore_config(restore) == (paths["config"][:2], [str(added)])
    assert MODULE.read_config(host) == good
    assert Path(paths["config"][0]).stat().st_mode & 0o7777 == 0o600
    assert MODULE.restore_config(restore) == ([], [])


def test_a_kept_file_gone_is_an_os_error_the_module_reports(host: dict[str, str], tmp_path: Path) -> None:
    """main() turns it into a failed task (fail_json with the path), which the role's rescue reports."""
    good = MODULE.read_config(host)
    snapshot = tmp_path / "history" / "cfg-pruned"
    (snapshot / "units").mkdir(parents=True)  # kept, then its files removed by hand
    restore = {
        "snapshot": str(snapshot),
        "units": [good["units"][0]["path"]],
        "config": [],
        "state_files": [],
    }
    with pytest.raises(OSError, match=r"cfg-pruned/units/vllm-fleet-i0\.service"):
        MODULE.restore_config({**restore, "remove": []})
