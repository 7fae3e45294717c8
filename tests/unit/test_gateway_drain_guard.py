"""The drain keeps the fleet serving: vllm_fleet.gateway.drain.DRAIN_SCRIPT against a real HAProxy.

Debian bookworm's haproxy 2.6 (installed by scripts/bootstrap) runs here in the foreground with two backends
in the order the gateway writes them, smallest set first: set_short (s1, s2) and set_long (l1). Each server
is a real HTTP server on loopback that HAProxy health-checks every 100 ms. The script is run as the action
plugin runs it on the gateway host (`python3 -c DRAIN_SCRIPT socket backend server`).

- A server is drained while another server that takes its requests is UP: one of its own set or of a larger
  set (the frontend sends a set's requests to the next larger one while it has none).
- It is not drained when every such server is out (drained, in maintenance or down): draining it too would
  leave its requests nowhere to go (site.yml restarting every host at once did exactly that).
- The largest set's only server has no other to wait for: it is drained (a one-instance set).
- Two hosts asking at the same moment are answered one after the other (a lock beside the socket): exactly
  one of two servers of a set whose larger set is out is drained, 5 times out of 5 (with a lock per server
  instead, 2 of 3 runs of that test failed: both were drained).
"""

from __future__ import annotations

import fcntl
import http.server
import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_fleet.gateway.drain import Target, drain_argv, parse_drain, stat_rows

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


class _Quiet(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def _ask(path: Path, command: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(path))
        s.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def _status(path: Path) -> dict[str, str]:
    return {f"{r.backend}/{r.server}": r.status for r in stat_rows(_ask(path, "show stat"))}


def _until(path: Path, wanted: dict[str, str], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = _status(path)
        if all(seen.get(k) == v for k, v in wanted.items()):
            return
        time.sleep(0.05)
    raise AssertionError(f"wanted {wanted}, HAProxy shows {_status(path)}")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if not Path(HAPROXY).exists():
        pytest.fail("haproxy is not installed: run scripts/bootstrap")
    work = tmp_path_factory.mktemp("haproxy")
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet) for _ in range(3)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    s1, s2, l1 = (f"127.0.0.1:{server.server_address[1]}" for server in servers)
    sock = work / "admin.sock"
    with socket.socket() as probe:  # a free port for the frontend
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (work / "haproxy.cfg").write_text(
        "global\n"
        f"    stats socket {sock} mode 600 level admin\n"
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n"
        "    timeout check 1s\n"
        f"frontend fe\n    bind 127.0.0.1:{port}\n    default_backend set_long\n"
        "backend set_short\n    option httpchk GET /\n    default-server check inter 100ms fall 1 rise 1\n"
        f"    server s1 {s1}\n    server s2 {s2}\n"
        "backend set_long\n    option httpchk GET /\n    default-server check inter 100ms fall 1 rise 1\n"
        f"    server l1 {l1}\n"
    )
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(work / "haproxy.cfg")], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        _until(sock, {"set_short/s1": "UP", "set_short/s2": "UP", "set_long/l1": "UP"})
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for server in servers:
            server.shutdown()


def _drain(sock: Path, backend: str, server: str, timeout_s: float = 10) -> dict:
    argv = drain_argv(sys.executable, str(sock), Target(backend, server, ""))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=True)
    return parse_drain(done.stdout).__dict__


def _ready_all(sock: Path) -> None:
    for name in ("set_short/s1", "set_short/s2", "set_long/l1"):
        assert _ask(sock, f"set server {name} state ready").strip() == ""
    _until(sock, {"set_short/s1": "UP", "set_short/s2": "UP", "set_long/l1": "UP"})


def test_a_server_is_drained_while_another_that_takes_its_requests_is_up(gateway: Path) -> None:
    _ready_all(gateway)
    first = _drain(gateway, "set_short", "s1")
    assert first["drained"] and first["reply"].strip() == "", first
    assert first["others"] == {"set_short/s2": "UP", "set_long/l1": "UP"}
    _until(gateway, {"set_short/s1": "DRAIN"})
    # s2's own set has no server left, but the long set takes short requests while the short set has none
    second = _drain(gateway, "set_short", "s2")
    assert second["drained"] and second["others"] == {"set_short/s1": "DRAIN", "set_long/l1": "UP"}


def test_a_server_whose_requests_would_have_nowhere_to_go_is_not_drained(gateway: Path) -> None:
    _ready_all(gateway)
    assert _drain(gateway, "set_short", "s1")["drained"]
    assert _ask(gateway, "set server set_long/l1 state maint").strip() == ""
    _until(gateway, {"set_short/s1": "DRAIN", "set_long/l1": "MAINT"})
    refused = _drain(gateway, "set_short", "s2")
    assert not refused["drained"] and refused["others"] == {"set_short/s1": "DRAIN", "set_long/l1": "MAINT"}
    assert _status(gateway)["set_short/s2"] == "UP"  # still serving
    # once the other is back, it goes
    assert _ask(gateway, "set server set_short/s1 state ready").strip() == ""
    _until(gateway, {"set_short/s1": "UP"})
    assert _drain(gateway, "set_short", "s2")["drained"]


def test_the_largest_sets_only_server_is_drained_as_there_is_no_other(gateway: Path) -> None:
    _ready_all(gateway)
    alone = _drain(gateway, "set_long", "l1")
    assert alone["drained"] and alone["others"] == {}  # the smaller set cannot take long requests


def test_two_hosts_asking_at_once_are_answered_one_after_the_other(gateway: Path) -> None:
    for _ in range(5):
        _ready_all(gateway)
        assert _ask(gateway, "set server set_long/l1 state maint").strip() == ""
        _until(gateway, {"set_long/l1": "MAINT"})
        argvs = [drain_argv(sys.executable, str(gateway), Target("set_short", s, "")) for s in ("s1", "s2")]
        procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for argv in argvs]
        answers = [parse_drain(proc.communicate(timeout=20)[0]) for proc in procs]
        assert sorted(a.drained for a in answers) == [False, True], answers
        status = _status(gateway)
        assert sorted((status["set_short/s1"], status["set_short/s2"])) == ["DRAIN", "UP"], status


def test_the_script_waits_for_the_gateways_lock(gateway: Path) -> None:
    _ready_all(gateway)
    with open(f"{gateway}.vllm-fleet-drain.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(subprocess.TimeoutExpired):
            _drain(gateway, "set_short", "s1", timeout_s=2)
    assert _status(gateway)["set_short/s1"] == "UP"  # nothing done while another held it


def test_no_gateway_yet_is_said_so(tmp_path: Path) -> None:
    answer = _drain(tmp_path / "absent.sock", "set_short", "s1")
    assert answer["no_socket"] and not answer["drained"]
    assert json.loads(json.dumps(answer))  # a plain JSON object for the action's result


def _filter(name: str):
    path = Path(__file__).resolve().parents[2] / "plugins" / "filter" / "fleet_gateway.py"
    spec = importlib.util.spec_from_file_location("fleet_gateway_filters_under_test", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module.FilterModule().filters()[name]


def test_the_roles_wait_names_the_servers_that_are_not_up(gateway: Path) -> None:
    """fleet_gateway's last tasks, as the role runs them: the read command on the gateway host, its result
    judged by fleet_gateway_servers_not_up; a server whose check fails is named with its status."""
    argv = _filter("fleet_gateway_stat_argv")(str(gateway), python=sys.executable)
    not_up = _filter("fleet_gateway_servers_not_up")

    def read() -> list[str]:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        return not_up({"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr})

    _ready_all(gateway)
    assert read() == []
    assert _ask(gateway, "set server set_short/s2 state maint").strip() == ""
    assert _ask(gateway, "set server set_long/l1 state drain").strip() == ""
    _until(gateway, {"set_short/s2": "MAINT", "set_long/l1": "DRAIN"})
    assert read() == ["set_short/s2 MAINT", "set_long/l1 DRAIN"]
    _ready_all(gateway)
    absent = _filter("fleet_gateway_stat_argv")(str(gateway.parent / "absent.sock"), python=sys.executable)
    done = subprocess.run(absent, capture_output=True, text=True, timeout=30, check=False)
    assert not_up({"rc": done.returncode, "stdout": done.stdout}) == ["the runtime socket: not there yet"]
    failed = not_up({"rc": 1, "stdout": "", "stderr": "Traceback ...\nConnectionRefusedError: [Errno 111]"})
    assert failed == ["the runtime API did not answer (ConnectionRefusedError: [Errno 111])"]
