"""The install playbooks on this machine itself (no NVIDIA GPU here), over a local connection, as the lead
runs driver detection on a real GPU host: detect changes nothing, a GPU-less host is left alone, and reboot
policy 'always' is refused on the machine running the play before anything is touched."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def play(book: str, *args: str) -> tuple[int, str]:
    """`-t nvidia_driver` still plans this machine first (preflight runs under any tag): its vLLM listens on
    loopback, which needs no API key."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            "ansible_python_interpreter=/usr/bin/python3",
            "-e",
            "vllm_service_host=127.0.0.1",
            *args,
            str(REPO / "playbooks" / book),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def recap(out: str) -> dict[str, int]:
    line = out.split("PLAY RECAP")[-1]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def test_detect_on_a_machine_without_gpu_reports_and_changes_nothing(tmp_path: Path) -> None:
    rc, out = play("driver-detect.yml")
    assert rc == 0, out[-4000:]
    assert "status: no_gpu" in out and recap(out)["changed"] == 0
    rc, out = play("driver-detect.yml", "-e", f"nvidia_driver_record_dir={tmp_path}")
    assert rc == 0, out[-4000:]
    record = json.loads((tmp_path / "localhost.driver.json").read_text())
    assert record["assessment"]["status"] == "no_gpu" and "=== pci rc=0" in record["probe"]
    # the record is stable: the same machine gives the same file, so a second run changes nothing
    rc, out = play("driver-detect.yml", "-e", f"nvidia_driver_record_dir={tmp_path}")
    assert rc == 0 and recap(out)["changed"] == 0, out[-4000:]


def test_install_mode_leaves_a_gpu_less_host_alone() -> None:
    rc, out = play("install.yml", "-t", "nvidia_driver", "--check", "-e", "nvidia_driver_mode=install")
    assert rc == 0, out[-4000:]
    assert "status: no_gpu" in out and recap(out)["changed"] == 0
    assert "Install, pin and protect the driver" in out and "Write the deb822 source" not in out


def test_reboot_always_is_refused_on_the_machine_running_the_play() -> None:
    rc, out = play("install.yml", "-t", "nvidia_driver", "-e", "nvidia_driver_reboot=always")
    assert rc != 0
    assert "nvidia_driver_reboot: 'always' would reboot localhost, the machine running this play" in out
    # refused before the role's install include (preflight before it only read the host)
    assert "TASK [vllm_fleet.serving.nvidia_driver : Install, pin and protect the driver]" not in out
