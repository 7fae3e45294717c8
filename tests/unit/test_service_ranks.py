"""The units of a multi-host instance's ranks, rendered from the example inventory's real plan
(inventory/examples/2x4x4090-pp: recorded topology, real config.json) and checked by systemd itself."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_fleet.deploy.service import (
    WATCH_MASTER,
    ServiceOptions,
    instance_files,
    managed_items,
    restart_list,
)
from vllm_fleet.plan.inventory import plan_inventory

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventory" / "examples" / "2x4x4090-pp"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
KEY = "example-key-not-a-secret-replace-with-ansible-vault"


@pytest.fixture(scope="module")
def files() -> dict[str, object]:
    plans = plan_inventory(str(EXAMPLE), project_dir=ROOT)
    return {
        host: instance_files(plan.instances[0], options=ServiceOptions(), secret_env={"VLLM_API_KEY": KEY})
        for host, plan in plans.items()
    }


def test_rank_0_waits_for_its_api_and_a_headless_rank_for_nothing(files: dict) -> None:
    rank0, rank1 = files["pp-4090-a"], files["pp-4090-b"]
    assert "ExecStartPost=" in rank0.unit_text and "http://127.0.0.1:8000/health" in rank0.unit_text
    # a headless rank has no API: a /health wait would hold its start until the start timeout
    assert "ExecStartPost=" not in rank1.unit_text and rank1.health_url == ""
    assert "--headless" in rank1.unit_text and "--node-rank 1" in rank1.unit_text
    assert 'VLLM_HOST_IP="192.0.2.22"' in rank1.env_text


def test_a_headless_rank_is_marked_to_start_before_rank_0(files: dict) -> None:
    """The role starts the marked items first on every host, then rank 0 (vllm_service/tasks/apply.yml)."""
    rank0, rank1 = files["pp-4090-a"], files["pp-4090-b"]
    assert restart_list([rank1], {}, {}) == [
        {
            "name": "i0",
            "unit": rank1.unit_name,
            "action": "restarted",
            "why": "new instance",
            "headless": True,
            "serving": False,
        }
    ]
    assert restart_list([rank0], {}, {}) == [
        {
            "name": "i0",
            "unit": rank0.unit_name,
            "action": "restarted",
            "why": "new instance",
            "serving": False,
        }
    ]
    assert restart_list([rank1], {"i0": rank1.digest}, {"i0": "failed"})[0]["headless"] is True


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is needed (apt-get install systemd)")
@pytest.mark.parametrize("host", ["pp-4090-a", "pp-4090-b"])
def test_each_ranks_unit_passes_systemd_analyze_verify(files: dict, host: str, tmp_path: Path) -> None:
    unit = files[host]
    root = tmp_path / "root"
    (root / "lib" / "systemd").mkdir(parents=True)
    shutil.copytree("/lib/systemd/system", root / "lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    for word in (unit.plan["argv"][0], "/usr/bin/python3"):
        exe = root / word.lstrip("/")
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    path = root / "etc/systemd/system" / unit.unit_name
    path.write_text(unit.unit_text)
    paths = [str(path)]
    if unit.watch_unit_name:  # rank 1: its watch of rank 0, which its unit is bound to
        watch = root / "etc/systemd/system" / unit.watch_unit_name
        watch.write_text(unit.watch_unit_text)
        paths.append(str(watch))
    proc = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", f"--root={root}", *paths], capture_output=True, text=True, timeout=60
    )
    assert (proc.stdout + proc.stderr).strip() == "" and proc.returncode == 0, proc.stdout + proc.stderr


def test_only_rank_0_is_a_gateway_server_and_a_scrape_target() -> None:
    """The gateway's sets and Prometheus' vLLM targets, from the example's plans: one instance, on rank 0."""
    from vllm_fleet.gateway.sets import instance_sets
    from vllm_fleet.monitoring.targets import vllm_targets

    plans = plan_inventory(str(EXAMPLE), project_dir=ROOT)
    addresses = {"pp-4090-a": "192.0.2.21", "pp-4090-b": "192.0.2.22"}
    targets = vllm_targets("fleet", plans, addresses)
    assert [t.address for t in targets] == ["192.0.2.21:8000"]
    (only,) = instance_sets(plans, {}, addresses, gateway_host="gw")
    assert [s.address for s in only.servers] == ["192.0.2.21:8000"]


def test_every_rank_restarts_when_one_of_them_does(files: dict) -> None:
    """Rank 1's files did not change but rank 0 restarts: rank 1 restarts too (headless first), and a rank
    whose peers do not restart is left alone."""
    from vllm_fleet.deploy.service import group_restarts

    rank1 = files["pp-4090-b"].to_dict()
    (item,) = group_restarts([], [rank1], {"i0": ["pp-4090-a"]})
    assert item["name"] == "i0" and item["headless"] is True and "pp-4090-a restart(s) it" in item["why"]
    assert group_restarts([], [rank1], {}) == []
    own = [{"name": "i0", "unit": rank1["unit_name"], "action": "started", "why": "it is failed"}]
    assert group_restarts(own, [rank1], {"i0": ["pp-4090-a"]}) == own  # its own reason stands


def test_a_headless_rank_is_bound_to_its_watch_of_rank_0(files: dict) -> None:
    rank0, rank1 = files["pp-4090-a"], files["pp-4090-b"]
    assert rank0.watch_unit_name == "" and "BindsTo=" not in rank0.unit_text
    assert rank1.watch_unit_name == "vllm-fleet-i0-rank0-watch.service"
    assert "BindsTo=vllm-fleet-i0-rank0-watch.service" in rank1.unit_text
    assert "PartOf=vllm-fleet-i0.service" in rank1.watch_unit_text
    assert " 192.0.2.21 29501 5 3" in rank1.watch_unit_text  # rank 0's master, probed every 5 s, 3 misses
    kinds = [
        (i["path"], i["kind"])
        for i in managed_items([rank1.to_dict()], dirs=[], home_root="/h", user="u", group="g")
    ]
    assert ("/etc/systemd/system/vllm-fleet-i0-rank0-watch.service", "unit") in kinds


def test_the_watch_waits_for_rank_0_then_ends_when_its_master_port_refuses(tmp_path: Path) -> None:
    """The watch's own script, run for real against a real listening socket: it waits while nothing answers
    (the rank's workers wait for rank 0 too), watches once the port answers, and exits non-zero (ending the
    rank's unit through BindsTo=) after the port refused 2 probes in a row."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    watch = subprocess.Popen(
        [sys.executable, "-c", WATCH_MASTER, "127.0.0.1", str(port), "0.1", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.5)
        assert watch.poll() is None  # nothing answers yet: it waits
        master = socket.socket()
        master.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        master.bind(("127.0.0.1", port))
        master.listen(16)
        time.sleep(0.8)
        assert watch.poll() is None  # the master answers: it watches
        master.close()
        out, err = watch.communicate(timeout=10)
    finally:
        watch.kill()
    assert watch.returncode == 1
    assert f"rank 0 master 127.0.0.1:{port} answers; watching it" in out
    assert f"rank 0 master 127.0.0.1:{port} refused 2 probes in a row: rank 0 is gone" in err


def test_only_the_peers_of_the_batch_restart_a_rank(files: dict) -> None:
    """A peer's decision counts only when it is in this play's batch: a fact left from an earlier play (a
    first deploy, a rollback's second include of the role) or another batch restarts nothing."""
    from vllm_fleet.deploy.service import restarting_peers

    rank1 = files["pp-4090-b"].to_dict()
    todos = {"pp-4090-a": {"restart": [{"name": "i0"}]}, "pp-4090-b": {"restart": []}}
    assert restarting_peers([rank1], todos, ["pp-4090-a", "pp-4090-b"]) == {"i0": ["pp-4090-a"]}
    assert restarting_peers([rank1], todos, ["pp-4090-b"]) == {}  # rank 0 decided in another play or batch
    assert restarting_peers([rank1], {"pp-4090-a": {"restart": []}}, ["pp-4090-a", "pp-4090-b"]) == {}
    assert restarting_peers([rank1], {"pp-4090-a": None}, ["pp-4090-a"]) == {}  # no decision of its own yet


def test_the_group_restart_filter_reads_only_the_batchs_peers(files: dict) -> None:
    from ansible_collections.vllm_fleet.serving.plugins.filter.vllm_service import vllm_service_group_restart

    rank1 = files["pp-4090-b"].to_dict()
    public = {k: v for k, v in rank1.items() if k != "env_text"}
    hostvars = {"pp-4090-a": {"__vllm_service_todo": {"restart": [{"name": "i0"}]}}, "pp-4090-b": {}}
    todo = {"writes": [], "restart": [], "stale": [], "enable": [], "reload": False}
    (item,) = vllm_service_group_restart(todo, [public], hostvars, ["pp-4090-a", "pp-4090-b"])["restart"]
    assert item["headless"] is True
    assert vllm_service_group_restart(todo, [public], hostvars, ["pp-4090-b"])["restart"] == []
