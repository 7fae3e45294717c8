"""Real lab hosts: systemd-nspawn containers booted in their own network namespaces on this machine.

Runs `vllm-fleet lab ...` as a user does, reaches the hosts with plain `ansible` from the root network
namespace, and proves teardown leaves nothing behind (namespaces, links, processes, mounts, the lab's lock
file), also after an `up` that failed and after one that was killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from vllm_fleet.lab import spec as lab

pytestmark = [pytest.mark.lab, pytest.mark.slow]

BIN = Path(sys.executable).parent
CLI = str(BIN / "vllm-fleet")
ROOT = lab.lab_root()


def cli(*args: str, timeout: float = 1500, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([CLI, "lab", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"vllm-fleet lab {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def ansible_env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "ANSIBLE_HOST_KEY_CHECKING": "False"}


def ansible_ping(inventory: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "ansible"), "-i", str(inventory), "all", "-m", "ansible.builtin.ping", "-o"],
        capture_output=True,
        text=True,
        timeout=180,
        env=ansible_env(),
        check=False,
    )


def leftovers(name: str) -> dict[str, list[str]]:
    """Everything of lab `name` still on the machine."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    tag = lab.plan_lab(name, ["x"], ROOT).bridge[:9]  # "vfl" + the lab's 6-char tag
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    procs = subprocess.run(
        ["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True, check=True
    ).stdout
    mounts = subprocess.run(
        ["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=True
    ).stdout
    lab_dir = str(ROOT / "labs" / name)
    lab_netns = [ln.split()[0] for ln in netns.splitlines() if lab.lab_of_netns(ln.split()[0]) == name]
    # every process inside the lab's namespaces: containers' systemd and services, ProxyCommand netcats
    contained = sorted(
        int(pid)
        for ns in lab_netns
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    )
    return {
        "netns": lab_netns,
        "links": [ln for ln in links.splitlines() if tag in ln],
        "processes": [
            ln for ln in procs.splitlines() if f"--machine={name}-" in ln and "systemd-nspawn" in ln
        ],
        "contained": contained,
        "mounts": [ln for ln in mounts.splitlines() if ln.startswith(lab_dir)],
        "dir": [lab_dir] if Path(lab_dir).exists() else [],
        # the lab's lock goes with it (15 empty lock files were left in labs/ after a test run before)
        "lock": [f"{lab_dir}.lock"] if Path(f"{lab_dir}.lock").exists() else [],
        "cgroups": [str(p) for p in lab_cgroups(name) if p.exists()],
    }


def lab_cgroups(name: str) -> list[Path]:
    mounts = lab.systemd_cgroup_mounts(Path("/proc/self/mountinfo").read_text())
    return [lab.lab_cgroup(mount, name) for mount in mounts]


def systemd_cgroup(pid: int) -> str:
    """The cgroup of `pid` in systemd's hierarchy (name=systemd on a hybrid host, else the unified one)."""
    lines = dict(ln.split(":", 2)[1:] for ln in Path(f"/proc/{pid}/cgroup").read_text().splitlines())
    return lines.get("name=systemd", lines.get(""))


def start_a_unit_repeatedly(inventories: list[Path], times: int) -> list[subprocess.Popen]:
    """On every host of every inventory at once, start the same transient unit `times` times in a row;
    each host prints how many starts failed."""
    loop = (
        f"fails=0; for i in $(seq {times}); do systemd-run --wait --quiet --collect --unit=vfl-cgroup-race "
        "/bin/true || fails=$((fails+1)); done; echo fails=$fails"
    )
    return [
        subprocess.Popen(
            [
                str(BIN / "ansible"),
                "-i",
                str(inv),
                "all",
                "-f",
                "10",
                "-m",
                "ansible.builtin.shell",
                "-a",
                loop,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=ansible_env(),
        )
        for inv in inventories
    ]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def assert_clean(name: str) -> None:
    left = leftovers(name)
    assert not any(left.values()), f"lab {name} left behind: {left}"


@pytest.fixture
def lab_name(request):
    """A lab name unique to the test; the lab is taken down afterwards whatever happened."""
    name = f"it-{request.node.name.split('_', 1)[1][:10].rstrip('_-').replace('_', '-')}"
    cli("down", "--name", name, check=False)
    yield name
    cli("down", "--name", name, check=False)


def test_two_labs_up_reachable_by_ansible_idempotent_and_down_clean(tmp_path):
    names = ("it-alpha", "it-beta")
    for name in names:
        cli("down", "--name", name, check=False)
    try:
        inv_a, inv_b = tmp_path / "a.yml", tmp_path / "b.yml"
        first = json.loads(
            cli(
                "up",
                "--name",
                "it-alpha",
                "--hosts",
                "2",
                "--without-vllm",
                "--inventory",
                str(inv_a),
                "--json",
            ).stdout
        )
        assert first["changed"] is True and first["status"] == "up"
        print("it-alpha up timings:", first["timings_s"])
        beta = cli(
            "up", "--name", "it-beta", "--host", "solo", "--without-vllm", "--inventory", str(inv_b), "--json"
        )
        solo_pid = json.loads(beta.stdout)["hosts"][0]["pid"]
        # plain ansible from the root network namespace reaches every host of both labs
        ping = ansible_ping(inv_a)
        assert ping.returncode == 0, ping.stdout + ping.stderr
        assert ping.stdout.count("SUCCESS") == 2
        ping = ansible_ping(inv_b)
        assert ping.returncode == 0 and "solo | SUCCESS" in ping.stdout, ping.stdout + ping.stderr
        # each host is its own machine: its hostname, real systemd as PID 1, its own address
        hosts = yaml.safe_load(inv_a.read_text())["all"]["children"]["lab"]["hosts"]
        assert set(hosts) == {"it-alpha-1", "it-alpha-2"}
        # each host's systemd runs in a cgroup of its own: nspawn puts the container in <its cgroup>/payload,
        # and with one cgroup for all of them a unit stopped on one host removed the cgroup another host was
        # starting the same unit in (status=219/CGROUP): 43 of these 120 starts failed so, 37 on one host
        labs = {**{h["name"]: ("it-alpha", h["pid"]) for h in first["hosts"]}, "solo": ("it-beta", solo_pid)}
        for host, (name, pid) in labs.items():
            init = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
            assert systemd_cgroup(init) == f"/{lab.CGROUP_PARENT}/{name}/{host}/payload/init.scope", host
        runs = start_a_unit_repeatedly([inv_a, inv_b], 40)
        outputs = [run.communicate(timeout=600)[0] for run in runs]
        assert all(run.returncode == 0 for run in runs), outputs
        assert "".join(outputs).count("fails=0") == 3, outputs
        status = json.loads(cli("status", "--name", "it-alpha", "--json").stdout)["labs"][0]
        assert status["status"] == "up"
        assert all(h["running"] and h["system_state"] in ("running", "degraded") for h in status["hosts"])
        # up again: reused, nothing created
        again = json.loads(cli("up", "--name", "it-alpha", "--hosts", "2", "--without-vllm", "--json").stdout)
        assert again["changed"] is False
        assert [h["pid"] for h in again["hosts"]] == [h["pid"] for h in first["hosts"]]
        # a different host list for a lab that is up is refused, naming the fix
        refused = cli("up", "--name", "it-alpha", "--hosts", "3", "--without-vllm", check=False)
        assert refused.returncode == 2 and "lab down --name it-alpha" in refused.stderr
        # taking one lab down leaves the other one alone
        cli("down", "--name", "it-alpha")
        assert_clean("it-alpha")
        ping = ansible_ping(inv_b)
        assert ping.returncode == 0, ping.stdout + ping.stderr
        cli("down", "--name", "it-beta")
        assert_clean("it-beta")
    finally:
        for name in names:
            cli("down", "--name", name, check=False)


def test_failed_up_tears_down_what_it_created(lab_name):
    # A file where the second host's overlay mount point goes: `up` fails after the network exists and the
    # first host has booted, and must take all of it down again.
    blocker = ROOT / "labs" / lab_name / "hosts" / f"{lab_name}-2" / "root"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a directory\n")
    proc = cli("up", "--name", lab_name, "--hosts", "2", "--without-vllm", check=False)
    assert proc.returncode != 0
    assert "tearing down" in proc.stderr
    assert_clean(lab_name)


def test_down_cleans_after_a_killed_up(lab_name):
    child = subprocess.Popen(
        [CLI, "lab", "up", "--name", lab_name, "--hosts", "2", "--without-vllm"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    state_file = ROOT / "labs" / lab_name / "state.json"
    deadline = time.monotonic() + 600
    try:
        # kill it once a container runs: it leaves namespaces, a booting host and its mount behind
        while time.monotonic() < deadline:
            try:
                if json.loads(state_file.read_text()).get("pids"):
                    break
            except (OSError, ValueError):
                pass
            assert child.poll() is None, "lab up ended before it could be killed"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        left = leftovers(lab_name)
        assert left["netns"] and left["mounts"] and left["processes"] and left["contained"], left
        status = json.loads(cli("status", "--name", lab_name, "--json").stdout)["labs"][0]
        assert status["status"] == "starting"
        cli("down", "--name", lab_name)
        assert_clean(lab_name)
        alive = [p for p in left["contained"] if _alive(p)]
        assert not alive, f"processes of the lab's containers survived: {alive}"
    finally:
        if child.poll() is None:
            child.kill()


def test_down_finds_the_hosts_by_their_cgroups_without_state_file_or_namespaces(lab_name):
    # What a teardown that missed a host's nspawn left (a CI run, before nspawn was recognised inside its
    # cgroup shell): no state file, no namespace names, the nspawn still running. `down` knew hosts only by
    # those two; the lab's cgroups still hold them.
    cli("up", "--name", lab_name, "--hosts", "2", "--without-vllm")
    (ROOT / "labs" / lab_name / "state.json").unlink()
    for ns in leftovers(lab_name)["netns"]:
        subprocess.run(["ip", "netns", "del", ns], check=True)
    assert len(leftovers(lab_name)["processes"]) == 2
    cli("down", "--name", lab_name)
    assert_clean(lab_name)


def test_terminated_up_tears_itself_down(lab_name):
    # SIGTERM (a timeout, a CI cancel) must unwind like a failure: `up` removes what it created by itself
    child = subprocess.Popen(
        [CLI, "lab", "up", "--name", lab_name, "--hosts", "2", "--without-vllm"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    state_file = ROOT / "labs" / lab_name / "state.json"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if json.loads(state_file.read_text()).get("pids"):
                break
        except (OSError, ValueError):
            pass
        assert child.poll() is None, "lab up ended before it could be terminated"
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 128 + signal.SIGTERM
    assert "tearing down" in err
    assert_clean(lab_name)


def test_up_recreates_a_lab_whose_host_died(lab_name, tmp_path):
    inv = tmp_path / "inv.yml"
    first = json.loads(cli("up", "--name", lab_name, "--hosts", "1", "--without-vllm", "--json").stdout)
    pid = first["hosts"][0]["pid"]
    os.kill(pid, signal.SIGKILL)  # the container vanishes as after an OOM kill or a reboot
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    status = json.loads(cli("status", "--name", lab_name, "--json").stdout)["labs"][0]
    assert status["hosts"][0]["running"] is False
    orphans = leftovers(lab_name)["contained"]  # the container's own processes outlive nspawn
    again = cli("up", "--name", lab_name, "--hosts", "1", "--without-vllm", "--inventory", str(inv), "--json")
    result = json.loads(again.stdout)
    assert result["changed"] is True and result["hosts"][0]["pid"] != pid
    assert "cleaning up first" in again.stderr
    assert not [p for p in orphans if _alive(p)]
    ping = ansible_ping(inv)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    cli("down", "--name", lab_name)
    assert_clean(lab_name)
