"""vllm_service from one read of the host (issue 21): the host's files written as the role writes them, read
back by the module vllm_fleet_host_state's own readers, then decided on the controller
(vllm_fleet.deploy.service.decide). A converged host gives nothing to do; each drift gives exactly its fix."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError
from pluginload import load_plugin

from vllm_fleet.deploy import filestate
from vllm_fleet.deploy.service import drained_restarts, env_items, env_sha256, managed_items, markers_of
from vllm_fleet.plan.build import build_host_plan
from vllm_fleet.probe.topology import build_topology_from_dir

ROOT = Path(__file__).resolve().parents[2]
H200X2 = ROOT / "tests" / "fixtures" / "topology" / "recorded" / "h200x2"
SECRET = "sk-lab-0123456789"


MODULE = load_plugin(ROOT / "plugins" / "modules" / "vllm_fleet_host_state.py", "host_state_for_service")
FILTERS = load_plugin(ROOT / "plugins" / "filter" / "vllm_service.py", "service_filters_for_state")


class Host:
    """A host's directories below tmp_path, the files of two instances (recorded 2 x H200, TP1 each)."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        d = {k: str(tmp_path / k) for k in ("etc", "units", "cache", "state")}
        options = {
            "user": "root",
            "group": "root",
            "config_dir": d["etc"],
            "unit_dir": d["units"],
            "unit_prefix": "vllm-fleet-",
            "cache_dir": d["cache"],
            "state_dir": d["state"],
        }
        variables = {
            "vllm_service_model": "/m",
            "vllm_service_host": "0.0.0.0",
            "vllm_service_api_key": SECRET,
            "vllm_service_tensor_parallel_size": 1,
        }
        plan = build_host_plan("h200", variables, build_topology_from_dir(H200X2), vllm_version="0.32.0")
        self.files = FILTERS.vllm_service_files(
            plan.to_dict(), options=options, secret_env={"VLLM_API_KEY": SECRET}
        )
        assert [f["name"] for f in self.files] == ["i0", "i1"]
        self.public = [{k: v for k, v in f.items() if k != "env_text"} for f in self.files]
        self.dirs = [
            {"path": d["etc"], "owner": "root", "group": "root", "mode": "0755"},
            {"path": d["state"], "owner": "root", "group": "root", "mode": "0755"},
            {"path": d["cache"], "owner": "root", "group": "root", "mode": "0750"},
        ]
        self.items = managed_items(
            self.public, dirs=self.dirs, home_root=d["cache"], user="root", group="root"
        )
        self.glob = f"{d['units']}/vllm-fleet-*.service"
        self.units = {
            f["unit_name"]: {"ActiveState": "active", "UnitFileState": "enabled", "NeedDaemonReload": "no"}
            for f in self.files
        }
        (tmp_path / "units").mkdir()

    def converge(self) -> None:
        """What a finished run leaves: every item and env file as planned, each digest recorded."""
        for item in self.items:
            path = Path(item["path"])
            if item["state"] == "directory":
                path.mkdir(exist_ok=True)
            else:
                path.write_text(item["content"])
            path.chmod(int(item["mode"], 8))
        for item in env_items(self.files):
            Path(item["path"]).write_text(item["content"])
            Path(item["path"]).chmod(0o600)
        for f in self.files:
            Path(f["digest_path"]).write_text(f["digest"] + "\n")

    def read(self) -> dict[str, Any]:
        """What vllm_fleet_host_state returns for the role's arguments (tasks/main.yml), systemd aside."""
        return {
            "files": {i["path"]: MODULE.file_state(i["path"]) for i in self.items}
            | {
                p: MODULE.compared_state(p, sha)
                for p, sha in FILTERS.vllm_service_env_sha256(self.files).items()
            },
            "contents": {
                f["digest_path"]: t
                for f in self.files
                if (t := MODULE.read_text(f["digest_path"])) is not None
            },
            "units": self.units,
            "globbed": MODULE.globbed_texts([self.glob]),
        }

    def decide(self) -> dict[str, Any]:
        return FILTERS.vllm_service_decide(self.public, self.read(), items=self.items, unit_glob=self.glob)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def test_a_converged_host_gives_nothing_to_do(host: Host) -> None:
    host.converge()
    assert host.decide() == {"writes": [], "restart": [], "stale": [], "enable": [], "reload": False}
    assert FILTERS.vllm_service_env_drifted(host.files, host.read()) == []


def test_a_fresh_host_gets_every_file_and_every_instance_started_and_enabled(host: Host) -> None:
    for unit in host.units.values():  # what `systemctl show` says of a unit without a file
        unit.update(ActiveState="inactive", UnitFileState="", LoadState="not-found")
    todo = host.decide()
    assert [w["path"] for w in todo["writes"]] == [i["path"] for i in host.items]
    assert {w["drift"] for w in todo["writes"]} == {"missing"}
    assert [(r["name"], r["action"], r["why"]) for r in todo["restart"]] == [
        ("i0", "restarted", "new instance"),
        ("i1", "restarted", "new instance"),
    ]
    assert todo["enable"] == ["vllm-fleet-i0.service", "vllm-fleet-i1.service"]
    assert len(FILTERS.vllm_service_env_drifted(host.files, host.read())) == 2


def test_a_hand_edited_unit_is_written_back_and_only_its_instance_restarted(host: Host) -> None:
    host.converge()
    unit = Path(host.public[1]["unit_path"])
    unit.write_text(unit.read_text().replace("Description=", "Description=edited by hand "))
    host.units["vllm-fleet-i1.service"]["NeedDaemonReload"] = "yes"  # edited, not reloaded
    todo = host.decide()
    assert [(w["path"], w["kind"], w["drift"]) for w in todo["writes"]] == [
        (str(unit), "unit", "content differs")
    ]
    assert todo["restart"] == [
        {
            "name": "i1",
            "unit": "vllm-fleet-i1.service",
            "action": "restarted",
            "why": "its unit file on the host differed from the plan",
        }
    ]
    assert todo["reload"] and todo["enable"] == [] and todo["stale"] == []


def test_a_stopped_instance_is_started_and_a_disabled_one_enabled_without_any_write(host: Host) -> None:
    host.converge()
    host.units["vllm-fleet-i0.service"]["ActiveState"] = "failed"
    host.units["vllm-fleet-i1.service"]["UnitFileState"] = "disabled"
    todo = host.decide()
    assert todo["writes"] == []
    assert [(r["name"], r["action"], r["why"]) for r in todo["restart"]] == [
        ("i0", "started", "it is failed")
    ]
    assert todo["enable"] == ["vllm-fleet-i1.service"]


def test_a_changed_serve_command_or_environment_restarts(host: Host) -> None:
    host.converge()
    Path(host.files[0]["digest_path"]).write_text("0" * 64 + "\n")  # the digest of what ran before
    todo = host.decide()
    assert todo["writes"] == []
    assert [(r["name"], r["why"]) for r in todo["restart"]] == [
        ("i0", "its unit, environment or serve command changed")
    ]


def test_a_plan_file_or_a_directory_that_drifted_is_rewritten_without_a_restart(host: Host) -> None:
    host.converge()
    Path(host.public[0]["plan_path"]).write_text("{}\n")
    Path(host.dirs[0]["path"]).chmod(0o700)
    todo = host.decide()
    assert [(w["kind"], w["drift"]) for w in todo["writes"]] == [
        ("directory", "mode 0700, not 0755"),
        ("plan", "content differs"),
    ]
    assert todo["restart"] == []


def test_an_environment_file_is_compared_on_the_host_and_its_digest_never_returned(host: Host) -> None:
    host.converge()
    state = host.read()
    env_path = host.files[0]["env_path"]
    assert state["files"][env_path]["sha256_matches"] is True and "sha256" not in state["files"][env_path]
    assert SECRET not in repr(state) and filestate.content_sha256(host.files[0]["env_text"]) not in repr(
        state
    )
    Path(env_path).write_text('VLLM_API_KEY="stolen"\n')
    drifted = FILTERS.vllm_service_env_drifted(host.files, host.read())
    assert [(d["path"], d["drift"]) for d in drifted] == [(env_path, "content differs")]
    assert drifted[0]["content"] == host.files[0]["env_text"]  # what the no_log write puts back
    assert env_sha256(host.files)[env_path] == filestate.content_sha256(host.files[0]["env_text"])


def test_units_of_instances_that_left_the_layout_are_stale_and_foreign_units_are_not(host: Host) -> None:
    host.converge()
    units = host.root / "units"
    (units / "vllm-fleet-i7.service").write_text("[Unit]\nX-VllmFleet-Instance=i7\n")
    (units / "vllm-fleet-other.service").write_text("[Unit]\nDescription=not ours\n")
    assert host.decide()["stale"] == ["i7"]
    assert markers_of({"/u/a": "[Unit]\nX-VllmFleet-Instance= a \n", "/u/b": "[Unit]\n"}) == {"/u/a": "a"}
    # vllm_service_remove_stale: false passes no glob
    assert FILTERS.vllm_service_decide(host.public, host.read(), items=host.items)["stale"] == []


def test_a_read_without_an_instance_unit_names_the_argument_to_fix(host: Host) -> None:
    host.converge()
    state = host.read()
    state["units"] = {u: v for u, v in host.units.items() if u != "vllm-fleet-i1.service"}
    with pytest.raises(AnsibleFilterError, match=r"no systemd state of vllm-fleet-i1\.service"):
        FILTERS.vllm_service_decide(host.public, state, items=host.items)
    state = host.read()
    del state["files"][host.public[0]["unit_path"]]
    with pytest.raises(AnsibleFilterError, match="was not read on the host"):
        FILTERS.vllm_service_decide(host.public, state, items=host.items)


def test_the_module_compares_and_globs_real_files(tmp_path: Path) -> None:
    f = tmp_path / "a.env"
    f.write_text("K=v\n")
    os.chmod(f, 0o600)
    good = MODULE.compared_state(str(f), filestate.content_sha256("K=v\n").upper())
    assert good["sha256_matches"] is True and "sha256" not in good and good["mode"] == "0600"
    assert MODULE.compared_state(str(f), "0" * 64)["sha256_matches"] is False
    assert MODULE.compared_state(str(tmp_path / "none"), "0" * 64) == {"exists": False}
    (tmp_path / "u-1.service").write_text("one\n")
    (tmp_path / "u-dir.service").mkdir()
    assert MODULE.globbed_texts([str(tmp_path / "u-*.service"), str(tmp_path / "x*")]) == {
        str(tmp_path / "u-*.service"): {str(tmp_path / "u-1.service"): "one\n"},
        str(tmp_path / "x*"): {},
    }


def test_behind_a_gateway_only_serving_instances_leave_it_before_their_restart(host: Host) -> None:
    """A changed instance that serves leaves the gateway first (restart_drained.yml); a new, stopped or
    loading one serves nobody and starts at once, beside the other hosts' (a first site.yml, before the
    gateway is up, started each instance through the drained path's blocking restart and inline verify)."""
    host.converge()
    host.units["vllm-fleet-i0.service"]["ActiveState"] = "failed"
    unit = Path(host.public[1]["unit_path"])
    unit.write_text(unit.read_text().replace("Description=", "Description=edited by hand "))
    todo = host.decide()
    paths = drained_restarts(todo["restart"], host.public, drained=True)
    assert [r["name"] for r in paths["now"]] == ["i0"] and [r["name"] for r in paths["drained"]] == ["i1"]
    # apply.yml records the digest of what it started, drained.yml of what it restarted drained
    assert (paths["recorded_now"], paths["recorded_drained"]) == (["i0"], ["i1"])
    # without a gateway (or with vllm_service_drain false) every (re)start goes at once
    at_once = drained_restarts(todo["restart"], host.public, drained=False)
    assert at_once["drained"] == [] and at_once["now"] == todo["restart"]
    assert at_once["recorded_now"] == ["i0", "i1"] and at_once["recorded_drained"] == []
