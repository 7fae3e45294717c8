"""Every command in README.md's `sh` blocks, run as written in a fresh checkout.

The checkout is a copy of the files git tracks (their working-tree content: a file the examples name but git
does not track fails here, as it would in a clone), with `.venv` linked to this checkout's venv, as
`scripts/bootstrap` leaves a clone. `vllm-fleet` is called by name through a PATH holding only the link that
scripts/bootstrap makes (a folder with `vllm-fleet -> .venv/bin/vllm-fleet`) and the system folders.

A command passes when it exits 0, or with the status its trailing comment names (`# exits 1: ...`), and
prints something. The two set-up commands are not run here (the first is the main job, the second runs this
suite); every other command must be one of the kinds below, or the last test fails:

- tour commands that read only the checkout: run here, no lab;
- `vllm-fleet lab ...` and `.venv/bin/ansible ...` (the lab section's block): run in order, as root, and
  the lab is gone afterwards;
- `vllm-fleet rollout -i inventory/ ...`: run against the embedded default lab, which the session's shared
  installed lab is (tests/integration/conftest.py), as it is after set-up command 1.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SETUP = (
    "scripts/bootstrap && .venv/bin/ansible-playbook site.yml -i inventory/",
    "scripts/bootstrap && .venv/bin/pytest",
)
_BLOCK_RE = re.compile(r"^```sh\n(.*?)^```", re.M | re.S)
_EXITS_RE = re.compile(r"#\s*exits (\d+)")


@dataclass(frozen=True)
class Example:
    command: str  # as written, continuation lines joined
    block: int  # which sh block of README.md (0-based)
    exits: int

    @property
    def kind(self) -> str:
        if self.command in SETUP:
            return "setup"
        if self.command.startswith("vllm-fleet rollout "):
            return "rollout"
        if self.command.startswith(("vllm-fleet lab ", ".venv/bin/ansible ")):
            return "lab"
        if self.command.startswith(("vllm-fleet ", ".venv/bin/vllm-fleet ")):
            return "tour"
        return "unknown"


def readme_examples(text: str) -> list[Example]:
    """The commands of every ```sh block: comment and blank lines dropped, `\\` continuations joined."""
    examples = []
    for number, block in enumerate(_BLOCK_RE.findall(text)):
        joined = re.sub(r"\\\n\s*", "", block)
        for line in joined.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            exits = _EXITS_RE.search(line)
            examples.append(Example(line, number, int(exits.group(1)) if exits else 0))
    return examples


EXAMPLES = readme_examples((ROOT / "README.md").read_text())


def _of(kind: str) -> list[Example]:
    return [e for e in EXAMPLES if e.kind == kind]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh checkout (git's tracked files) and the environment of a shell after scripts/bootstrap."""
    clone = tmp_path_factory.mktemp("readme") / "vllm-fleet"
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True, timeout=60
    ).stdout.decode()
    for name in filter(None, tracked.split("\0")):
        source = ROOT / name
        if source.is_file():  # tracked but deleted in the working tree: not in a clone of it either
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name, follow_symlinks=False)
    (clone / ".venv").symlink_to(BIN.parent)
    link_dir = clone.parent / "bin"
    link_dir.mkdir()
    (link_dir / "vllm-fleet").symlink_to(BIN / "vllm-fleet")
    env = {
        "PATH": f"{link_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "ANSIBLE_NOCOLOR": "1",
    }
    if "VLLM_FLEET_LAB_ROOT" in os.environ:
        env["VLLM_FLEET_LAB_ROOT"] = os.environ["VLLM_FLEET_LAB_ROOT"]
    return clone, env


def run_example(checkout: tuple[Path, dict[str, str]], example: Example, timeout: int) -> str:
    """Run one example with bash in the checkout; '' when it did as README says, else what went wrong."""
    clone, env = checkout
    proc = subprocess.run(
        ["bash", "-c", example.command],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    output = proc.stdout + proc.stderr
    if proc.returncode == example.exits and output.strip():
        return ""
    return f"$ {example.command}\n-> exit {proc.returncode} (README: {example.exits})\n{output[-3000:]}"


def test_every_readme_command_is_of_a_kind_this_file_runs() -> None:
    assert [e.command for e in _of("setup")] == list(SETUP)
    assert not _of("unknown"), [e.command for e in _of("unknown")]
    assert len(_of("tour")) >= 6 and _of("lab") and _of("rollout")


def test_the_parser_reads_continuations_and_exit_comments() -> None:
    text = "x\n```sh\n# a comment\nvllm-fleet plan --a 1 \\\n  --b 2\n"
    text += "vllm-fleet flags x   # exits 1: found\n```\n"
    assert readme_examples(text) == [
        Example("vllm-fleet plan --a 1 --b 2", 0, 0),
        Example("vllm-fleet flags x   # exits 1: found", 0, 1),
    ]


def test_readme_tour_commands_run_as_written(checkout) -> None:
    failures = [f for e in _of("tour") if (f := run_example(checkout, e, timeout=300))]
    assert not failures, "\n\n".join(failures)


@pytest.mark.lab
def test_readme_lab_commands_run_as_written_and_leave_no_lab(checkout) -> None:
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (network namespaces, systemd-nspawn)")
    names = sorted({m for e in _of("lab") for m in re.findall(r"--name (\S+)", e.command)})
    inventories = sorted({Path(m) for e in _of("lab") for m in re.findall(r"--inventory (\S+)", e.command)})
    try:
        failures = []
        for example in _of("lab"):
            failure = run_example(checkout, example, timeout=1800)
            failures.append(failure)
            if failure:
                break  # the next commands need this one
        assert not any(failures), "\n\n".join(filter(None, failures))
        listing = subprocess.run(
            [str(BIN / "vllm-fleet"), "lab", "list"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        assert not [n for n in names if re.search(rf"^{re.escape(n)}\t", listing, re.M)], listing
    finally:
        for name in names:
            subprocess.run([str(BIN / "vllm-fleet"), "lab", "down", "--name", name], capture_output=True)
        for path in inventories:
            (checkout[0] / path).unlink(missing_ok=True)  # README's example writes it (/tmp/try.yml)


@pytest.mark.lab
@pytest.mark.slow
def test_readme_rollout_runs_as_written_on_the_default_lab(checkout, installed_lab) -> None:
    # the rollout writes its run folder under the vllm-fleet checkout it runs from (the installed one, this
    # checkout): the test removes the folders it made, as a user keeps theirs
    runs = ROOT / "reports" / "rollouts"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    try:
        failures = [f for e in _of("rollout") if (f := run_example(checkout, e, timeout=2400))]
        assert not failures, "\n\n".join(failures)
        made = set(runs.iterdir()) - before
        assert len(made) == 1 and (next(iter(made)) / "summary.json").is_file(), made
    finally:
        for folder in set(runs.iterdir()) - before if runs.is_dir() else ():
            shutil.rmtree(folder)
        for folder in (runs, runs.parent):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty
