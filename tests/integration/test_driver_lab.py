"""roles/nvidia_driver installing the real NVIDIA driver packages in lab hosts (systemd-nspawn, Debian 12).

The packages are Debian's own (bookworm non-free 535.261.03-1 and bookworm-security 535.309.01-0+deb12u1,
downloaded once on the controller and cached: tests/integration/driver_repo.py), put in a reprepro repository
signed with a throw-away key and served over HTTP from the lab's own network namespace (the hosts have no
other network). The role runs as `nvidia_driver_source: distribution` with that mirror as its URL:

- the deb822 source carries Signed-By and the key's fingerprint is checked; apt installs the real packages
  (dpkg runs their maintainer scripts, DKMS registers the module); apt preferences pin the version, dpkg holds
  every driver package, unattended-upgrades is kept away; `apt-mark showhold` and `apt-cache policy` on the
  host show it;
- what a container cannot do (build the module for the kernel under it, load it) is reported with what the
  reboot policy does about it, and the play does not pretend the driver works;
- a second run changes nothing; a pin change upgrades in place, then changes nothing again;
- on a second host, a wrong fingerprint is refused before any source, key or package list is written.

No GPU exists here: nothing loads the module. Everything the test creates is removed at the end.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_fleet.lab import spec as lab

sys.path.insert(0, str(Path(__file__).resolve().parent))
import driver_repo

pytestmark = [pytest.mark.lab, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CLI = str(BIN / "vllm-fleet")
NAME = "driver19-lab"
HOSTS = [f"{NAME}-1", f"{NAME}-2"]
PORT = 8419
OLD, NEW = "535.261.03", "535.309.01"

ROLE_PLAYBOOK = """
- name: nvidia_driver from the lab's mirror of Debian's driver packages
  hosts: "{{ target }}"
  gather_facts: true
  roles:
    - nvidia_driver
  post_tasks:
    - name: Write the role's facts on the controller
      ansible.builtin.copy:
        content: >-
          {{ {'state': nvidia_driver_state, 'reboot_required': nvidia_driver_reboot_required} | to_json }}
        dest: "{{ facts_dir }}/{{ inventory_hostname }}.json"
        mode: "0644"
      delegate_to: localhost
"""


def env() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
        "ANSIBLE_FILTER_PLUGINS": str(REPO / "plugins" / "filter"),
    }


def playbook(work: Path, inventory: Path, extra: dict) -> tuple[int, str, int]:
    book = work / "driver.yml"
    book.write_text(ROLE_PLAYBOOK)
    vars_file = work / "extra.json"
    vars_file.write_text(json.dumps({**extra, "facts_dir": str(work)}))
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), "-e", f"@{vars_file}", str(book)],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    out = proc.stdout + proc.stderr
    # the recap and the timing callback's tables (the apt step's time): shown with -s, and in a failure's log
    print(out.split("PLAY RECAP")[-1][-3000:])
    changed = sum(int(n) for n in re.findall(r"changed=(\d+)", out.split("PLAY RECAP")[-1]))
    return proc.returncode, out, changed


def on_host(inventory: Path, host: str, command: str) -> str:
    proc = subprocess.run(
        [str(BIN / "ansible"), "-i", str(inventory), host, "-m", "ansible.builtin.shell", "-a", command],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def lab_env(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("driver-lab")
    root = lab.lab_root()
    debs = driver_repo.ensure_debs(root / "cache")
    repo = driver_repo.build_repo(debs, work / "repo", work / "gnupg")
    inventory = work / "inventory.yml"
    subprocess.run([CLI, "lab", "down", "--name", NAME], capture_output=True, check=False, timeout=300)
    up = subprocess.run(
        [CLI, "lab", "up", "--name", NAME, "--hosts", "2", "--without-vllm", "--inventory", str(inventory)],
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    assert up.returncode == 0, up.stderr
    plan = lab.plan_lab(NAME, HOSTS, root)
    # the mirror: plain HTTP on the lab bridge's gateway, inside the lab's control namespace
    server = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            plan.ctl_netns,
            sys.executable,
            "-m",
            "http.server",
            str(PORT),
            "--bind",
            plan.gateway,
            "--directory",
            str(repo.path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://{plan.gateway}:{PORT}/"
        deadline = time.monotonic() + 30
        while True:
            probe = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    plan.ctl_netns,
                    "curl",
                    "-fsS",
                    "-o",
                    "/dev/null",
                    url + "dists/bookworm/InRelease",
                ],
                capture_output=True,
                check=False,
            )
            if probe.returncode == 0:
                break
            assert time.monotonic() < deadline, "the lab mirror did not answer"
            time.sleep(0.5)
        yield {"work": work, "inventory": inventory, "repo": repo, "url": url, "plan": plan}
    finally:
        server.terminate()
        server.wait(timeout=30)
        subprocess.run([CLI, "lab", "down", "--name", NAME], capture_output=True, check=False, timeout=300)
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
        assert not [n for n in netns.split() if lab.lab_of_netns(n) == NAME], netns
        assert not (root / "labs" / NAME).exists()
        assert server.poll() is not None
        # nothing left behind: build_repo stopped the gpg-agent its signing started
        agents = subprocess.run(["pgrep", "-af", str(work / "gnupg")], capture_output=True, text=True)
        assert not agents.stdout, agents.stdout


def role_vars(env_: dict, version: str, **more) -> dict:
    repo: driver_repo.SignedRepo = env_["repo"]
    return {
        "nvidia_driver_mode": "install",
        # no NVIDIA GPU on a lab host's PCI bus: act anyway
        "nvidia_driver_force": True,
        "nvidia_driver_source": "distribution",
        "nvidia_driver_branch": "535",
        "nvidia_driver_version": version,
        "nvidia_driver_open": False,
        "nvidia_driver_distribution_url": env_["url"],
        "nvidia_driver_distribution_suites": list(repo.suites),
        "nvidia_driver_distribution_components": list(repo.components),
        "nvidia_driver_repo_key_file": str(repo.key_file),
        "nvidia_driver_repo_key_fingerprint": repo.fingerprint,
        # the headers of the kernel under the lab (the controller's) are in no Debian archive
        "nvidia_driver_kernel_headers": False,
        "nvidia_driver_reboot": "auto",
        **more,
    }


def facts(env_: dict, host: str) -> dict:
    return json.loads((env_["work"] / f"{host}.json").read_text())


def installed(inventory: Path, host: str) -> dict[str, str]:
    out = on_host(
        inventory,
        host,
        "dpkg-query -W -f='${Package} ${Version}\\n' 'nvidia-*' libcuda1 'firmware-nvidia-*' 'libnvidia-*'",
    )
    return dict(line.split() for line in out.splitlines() if re.match(r"^[a-z0-9.+-]+ \S+$", line))


def test_the_mirror_serves_both_real_versions(lab_env: dict) -> None:
    dists = lab_env["repo"].path / "dists"
    versions = {}
    for suite in ("bookworm", "bookworm-security"):
        assert "BEGIN PGP SIGNED MESSAGE" in (dists / suite / "InRelease").read_text()
        packages = (dists / suite / "non-free" / "binary-amd64" / "Packages").read_text()
        versions[suite] = re.findall(
            r"^Package: nvidia-smi\n(?:.+\n)*?Version: (\S+)", packages, re.MULTILINE
        )
    assert versions == {"bookworm": ["535.261.03-1"], "bookworm-security": ["535.309.01-0+deb12u1"]}


def test_a_wrong_fingerprint_is_refused_before_apt_reads_the_repository(lab_env: dict) -> None:
    host = HOSTS[1]
    wrong = "EB693B3035CD5710E231E123A4B469963BF863CC"  # NVIDIA's CUDA key: not this mirror's
    rc, out, _ = playbook(
        lab_env["work"],
        lab_env["inventory"],
        {**role_vars(lab_env, OLD, nvidia_driver_repo_key_fingerprint=wrong), "target": host},
    )
    assert rc != 0
    assert f"nvidia_driver_repo_key_fingerprint: '{wrong}' is not a fingerprint of the key from" in out
    state = on_host(
        lab_env["inventory"],
        host,
        "ls /etc/apt/sources.list.d/vllm-fleet-nvidia-driver.sources 2>&1; "
        "ls /etc/apt/keyrings/vllm-fleet-cuda.asc 2>&1; "
        f"ls /var/lib/apt/lists/ | grep -c '{lab_env['plan'].gateway}' ; dpkg-query -W nvidia-smi 2>&1",
    )
    assert state.count("No such file or directory") == 2, state
    assert re.search(r"^0$", state, re.MULTILINE), state  # apt never fetched the mirror's lists
    assert "no packages found matching nvidia-smi" in state


def test_install_pins_holds_and_reports_what_a_container_cannot_do(lab_env: dict) -> None:
    host = HOSTS[0]
    rc, out, changed = playbook(
        lab_env["work"], lab_env["inventory"], {**role_vars(lab_env, OLD), "target": host}
    )
    assert rc == 0, out[-8000:]
    assert changed > 0
    packages = installed(lab_env["inventory"], host)
    for name in (
        "nvidia-kernel-dkms",
        "nvidia-smi",
        "libcuda1",
        "firmware-nvidia-gsp",
        "nvidia-kernel-support",
    ):
        assert packages.get(name) == "535.261.03-1", (name, packages)
    holds = on_host(lab_env["inventory"], host, "apt-mark showhold").split()
    assert {
        "nvidia-kernel-dkms",
        "nvidia-smi",
        "libcuda1",
        "firmware-nvidia-gsp",
        "nvidia-persistenced",
    } <= set(holds)
    policy = on_host(lab_env["inventory"], host, "apt-cache policy nvidia-smi nvidia-kernel-dkms")
    # the installed version is the pinned one, at the pin's priority, with the newer one in the repo below it
    assert re.search(r"\*\*\* 535\.261\.03-1 1001", policy), policy
    assert re.search(r"^\s+535\.309\.01-0\+deb12u1 500", policy, re.MULTILINE), policy
    source = on_host(
        lab_env["inventory"], host, "cat /etc/apt/sources.list.d/vllm-fleet-nvidia-driver.sources"
    )
    assert (
        f"URIs: {lab_env['url']}" in source and "Signed-By: /etc/apt/keyrings/vllm-fleet-cuda.asc" in source
    )
    assert lab_env["repo"].fingerprint in source
    blacklist = on_host(lab_env["inventory"], host, "cat /etc/apt/apt.conf.d/51vllm-fleet-nvidia-driver")
    assert '"libcuda1";' in blacklist and '"nvidia-";' in blacklist
    dkms = on_host(lab_env["inventory"], host, "dkms status")
    assert "nvidia-current/535.261.03: added" in dkms, dkms  # registered, built for no kernel
    # the part a container cannot do is reported, with what the reboot policy does about it
    state = facts(lab_env, host)
    assert state["state"]["container"] == "systemd-nspawn"
    assert state["state"]["status"] == "reboot_pending" and state["reboot_required"] is True
    assert "a container can neither build the driver's kernel module for that kernel nor load it" in out
    assert "nvidia_driver_reboot=auto would reboot" in out and "so it is not rebooted" in out
    assert "nvidia-current 535.261.03 added" in state["state"]["module_note"]

    rc, out, changed = playbook(
        lab_env["work"], lab_env["inventory"], {**role_vars(lab_env, OLD), "target": host}
    )
    assert rc == 0, out[-8000:]
    assert changed == 0, out[-8000:]


def test_a_pin_change_upgrades_in_place_then_changes_nothing(lab_env: dict) -> None:
    host = HOSTS[0]
    rc, out, changed = playbook(
        lab_env["work"], lab_env["inventory"], {**role_vars(lab_env, NEW), "target": host}
    )
    assert rc == 0, out[-8000:]
    assert changed > 0
    packages = installed(lab_env["inventory"], host)
    for name in ("nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "firmware-nvidia-gsp"):
        assert packages.get(name) == "535.309.01-0+deb12u1", (name, packages)
    policy = on_host(lab_env["inventory"], host, "apt-cache policy nvidia-smi")
    assert re.search(r"\*\*\* 535\.309\.01-0\+deb12u1 1001", policy), policy
    assert "nvidia-smi" in on_host(lab_env["inventory"], host, "apt-mark showhold").split()
    assert "nvidia-current/535.309.01: added" in on_host(lab_env["inventory"], host, "dkms status")
    rc, out, changed = playbook(
        lab_env["work"], lab_env["inventory"], {**role_vars(lab_env, NEW), "target": host}
    )
    assert rc == 0, out[-8000:]
    assert changed == 0, out[-8000:]
