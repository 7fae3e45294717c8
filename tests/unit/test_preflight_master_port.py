"""Preflight's reachability check of a multi-host instance's master port, run for real: two inventory hosts
on this machine (ansible_connection local, loopback addresses 127.0.0.1 and 127.0.0.2 as their addresses
between the nodes, each read back from the machine's own `ip -j addr show`), rank 0 listening with
vllm_fleet_master_listen while rank 1 connects with wait_for.
The facts are the example's recorded topology (inventory/examples/2x4x4090-pp, a stand-in, its first line
says so)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventory" / "examples" / "2x4x4090-pp"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def preflight(
    tmp_path: Path, rank0_address: str, port: int, playbook: str = "preflight.yml"
) -> subprocess.CompletedProcess[str]:
    """`playbook` on the two local hosts; port 0: a free one."""
    port = port or free_port()
    inventory = tmp_path / "inventory"
    shutil.copytree(EXAMPLE, inventory)
    shutil.copytree(EXAMPLE.parent / "models", tmp_path / "models")
    (inventory / "hosts.yml").write_text(
        "all:\n  children:\n    coder_next:\n      hosts:\n"
        f"        pp-4090-a: {{ansible_host: 127.0.0.1, vllm_service_node_address: '{rank0_address}'}}\n"
        "        pp-4090-b: {ansible_host: 127.0.0.2}\n"
    )
    bin_dir = Path(sys.executable).parent
    return subprocess.run(
        [
            str(bin_dir / "ansible-playbook"),
            "-i",
            str(inventory),
            str(ROOT / "playbooks" / playbook),
            "-e",
            "ansible_connection=local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            "-e",
            f"vllm_fleet_report_dir={tmp_path / 'reports'}",
            "-e",
            f"vllm_service_master_port={port}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={
            **os.environ,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
        },
        check=False,
    )


def test_rank_1_reaches_rank_0s_master_port_before_anything_listens(tmp_path: Path) -> None:
    proc = preflight(tmp_path, "127.0.0.1", free_port())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Connect from each other rank to the master's address and port" in out
    # the interface of each rank's address, from the host's own `ip -j addr show`, is in its plan
    for host in ("pp-4090-a", "pp-4090-b"):
        env = json.loads((tmp_path / "reports" / "plan" / f"{host}.json").read_text())["instances"][0]["env"]
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo", env
    recap = out.split("PLAY RECAP", 1)[1]
    assert "failed=0" in recap and "changed=0" in recap.split("pp-4090-a", 1)[1].splitlines()[0], recap


def test_a_master_port_rank_1_cannot_connect_to_is_refused_naming_the_variable(tmp_path: Path) -> None:
    """Something else holds the port on rank 0 without accepting (bound, not listening): rank 0's listener
    finds it in use, and rank 1's connection is refused, as behind a firewall that rejects it."""
    with socket.socket() as holder:
        holder.bind(("", 0))
        port = int(holder.getsockname()[1])
        proc = preflight(tmp_path, "127.0.0.1", port)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    fatal = out.split("fatal: [pp-4090-b]", 1)[1]
    assert f"vllm_service_master_port: pp-4090-b cannot connect to the master 127.0.0.1:{port}" in fatal
    assert "vllm_service_node_address of rank 0" in fatal
    assert "fatal: [pp-4090-a]" not in out  # only the rank without a way to the master fails


def test_an_address_rank_0_does_not_have_is_refused_before_the_connection(tmp_path: Path) -> None:
    """192.0.2.21 (TEST-NET-1, RFC 5737) is no address of this machine: the plan refuses it from the host's
    own `ip -j addr show`, before any listener or connection."""
    proc = preflight(tmp_path, "192.0.2.21", free_port())
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "vllm_service_node_address: 192.0.2.21 is no address of pp-4090-a" in out
    assert "Listen on the master port" not in out.split("fatal: ", 1)[0]


def test_a_rank_whose_own_probe_came_first_passes(tmp_path: Path) -> None:
    """Rank 1's host probes the master port itself, as a rank restarted while rank 0 is down does (its watch
    of rank 0 every 5 s, its workers' store client): that connection, from rank 1's address 127.0.0.2, may
    reach rank 0's listener before rank 1's own check does and end it. Rank 1 then passes on the listener's
    word (CI, stop 36: the check failed, as it did here before the fix, the watch's probe having ended the
    wait)."""
    port = free_port()
    stop = threading.Event()
    seen: list[bool] = []

    def probe() -> None:  # the watch's probe: connect, close, again
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), 1, ("127.0.0.2", 0)):
                    seen.append(True)
            except OSError:
                pass
            time.sleep(0.05)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        proc = preflight(tmp_path, "127.0.0.1", port)
    finally:
        stop.set()
        prober.join(timeout=5)
    out = proc.stdout + proc.stderr
    assert seen, "the probe never reached the listener: this test did not race"
    assert proc.returncode == 0, out[-3000:]
