"""Every offline command of the CLI, run from the installed wheel as a user without the clone runs it (issue
32): a fresh venv holding only the wheel `pip wheel` builds from this clone (tests/unit/wheelvenv.py: uv
installs it and its dependencies from its cache, about 7 s with the build), its `vllm-fleet` console script
run in an empty folder outside the clone, on copies of the examples and recordings (nothing is read from the
clone). The wheel's answer must be the clone's: the same exit status and the same output, byte for byte, for
the same arguments from an empty folder of its own, and no traceback. Before issue 32 `plan --inventory` and
`monitoring` died here with FileNotFoundError: .../lib/python3.11/roles.

Each command of `vllm-fleet --help` is either in COMMANDS (with an example that reads only the copied files)
or in NEEDS_A_FLEET with the test that runs it for real; a new command fails
test_every_command_is_run_from_the_wheel until it is added to one of them (`gateway`: add its offline example
to COMMANDS).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from wheelvenv import build_wheel_venv

from vllm_fleet.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FIXTURES = ROOT / "tests" / "fixtures"
# what the examples read, copied out of the clone (relative paths inside each are kept)
DATA = {
    "examples": ROOT / "inventory" / "examples",
    "h200x2": FIXTURES / "topology" / "recorded" / "h200x2",
    "models": FIXTURES / "models",
    "seed": FIXTURES / "seed",
    "healthy": FIXTURES / "metrics" / "healthy",
    "reports": FIXTURES / "reports" / "verify",
    "h200-run": FIXTURES / "gpu-h200-vllm-0.26.0" / "seed-dense",
}
# command -> (its arguments, split at spaces, and its exit status): {name} is the copy of DATA[name]; relative
# paths are the empty folder's
COMMANDS: dict[str, tuple[str, int]] = {
    "plan": ("plan --inventory {examples}/seed-4x4090", 0),
    "render": (
        "render --vars {examples}/seed-4x4090/group_vars/all/vllm_service.yml --vllm-version 0.33.0 --shell",
        0,
    ),
    "monitoring": ("monitoring --inventory {examples}/seed-4x4090 --out out", 0),
    "gateway": ("gateway --inventory {examples}/seed-4x4090 --out out", 0),
    "verify": (
        "verify --plan {h200-run}/plan.json --log {h200-run}/vllm.until-stop.log "
        "--replay {h200-run}/answers.json --host h200",
        0,
    ),
    "logcheck": ("logcheck {healthy}/journal.txt --expect-kv-tokens 1048576", 0),
    "report": ("report {reports}", 0),
    "topology": ("topology --recorded {h200x2}", 0),
    "flags": ("flags --vllm-version 0.33.0 --check-command {seed}/seed-command.sh", 1),
}
# commands that act on hosts: from the wheel only their --help here, the real runs are elsewhere
NEEDS_A_FLEET = {
    "lab": "tests/integration/test_lab.py (root, systemd-nspawn)",
    "loadtest": "tests/integration/test_loadtest_lab.py (-i, a lab host's vLLM); "
    "tests/unit/test_cli_loadtest.py",
    "rollout": "tests/integration/test_collection_lab.py's wheel venv; tests/unit/test_collection.py finds "
    "the installed rollout.yml",
}


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheel's venv, the copied data, and the environment both CLIs run with (no ansible.cfg anywhere)."""
    work = tmp_path_factory.mktemp("installed-cli")
    _wheel, venv = build_wheel_venv(work)
    data = work / "data"
    for name, source in DATA.items():
        shutil.copytree(source, data / name, symlinks=True)
    home = work / "home"
    home.mkdir()
    return {"work": work, "venv": venv, "data": data, "home": home}


def _run(script: Path, args: list[str], folder: Path, home: Path) -> subprocess.Popen[str]:
    folder.mkdir(parents=True)
    env = {"PATH": f"{script.parent}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
           "ANSIBLE_NOCOLOR": "1"}  # fmt: skip
    return subprocess.Popen(
        [str(script), *args], cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_every_command_is_run_from_the_wheel() -> None:
    (subparsers,) = [a for a in build_parser()._actions if a.dest == "command"]
    commands = set(subparsers.choices)
    missing = commands - set(COMMANDS) - set(NEEDS_A_FLEET)
    assert not missing, f"add an offline example of {sorted(missing)} to COMMANDS (or NEEDS_A_FLEET)"
    assert not (set(COMMANDS) | set(NEEDS_A_FLEET)) - commands


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_installed_command_answers_as_the_clones(command: str, user: dict[str, Path]) -> None:
    template, status = COMMANDS[command]
    paths = {name: str(user["data"] / name) for name in DATA}
    args = [part.format(**paths) for part in template.split()]
    runs = {which: user["work"] / "run" / command / which for which in ("wheel", "clone")}
    scripts = {"wheel": user["venv"] / "bin" / "vllm-fleet", "clone": BIN / "vllm-fleet"}
    procs = {which: _run(scripts[which], args, runs[which], user["home"]) for which in runs}  # both at once
    out = {which: proc.communicate(timeout=300)[0] for which, proc in procs.items()}
    for which, proc in procs.items():
        assert "Traceback" not in out[which], f"{which}:\n{out[which][-3000:]}"
        assert proc.returncode == status, f"{which}: exit {proc.returncode}\n{out[which][-3000:]}"
    assert out["wheel"].strip()
    assert out["wheel"] == out["clone"]
    assert _tree(runs["wheel"]) == _tree(runs["clone"])  # what it wrote (monitoring's files)
    if command == "monitoring":
        assert (runs["wheel"] / "out" / "prometheus.yml").is_file()


@pytest.mark.parametrize("command", sorted(NEEDS_A_FLEET))
def test_the_installed_fleet_commands_start(command: str, user: dict[str, Path]) -> None:
    proc = _run(user["venv"] / "bin" / "vllm-fleet", [command, "--help"], user["work"] / "help" / command,
                user["home"])  # fmt: skip
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0 and "Traceback" not in out and f"vllm-fleet {command}" in out, out
