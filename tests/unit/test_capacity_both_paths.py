"""One capacity (issue 34): for every real vLLM log in tests/fixtures that prints a KV-cache line, the render
path (`vllm-fleet render`'s expectations, what preflight, deploy's /etc/vllm-fleet/<instance>.json and
verify use) and `vllm-fleet plan` give the same tokens and concurrency, and both equal vLLM's own line.

The runs are found by a layout convention (docs/interfaces.md, "Capacity fixtures"): every
tests/fixtures/*/runs.tsv whose rows have four tab-separated columns (wave or release, name, model, the `vllm
serve` arguments that size the KV cache) is read, the layout of tests/fixtures/gpu-h200-vllm-0.26.0-families/.
A row's log is the newest `run*/<name>.log`, else `<name>` itself beside runs.tsv; its model is
tests/fixtures/models/<model>.config.json. A log with a KV line that is no row must be named, with the reason,
in tests/fixtures/vllm-logs/not-both-paths.tsv: a new fixture cannot slip past this test. No GPU is needed:
the logs are the real output of the hosts their READMEs name.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_fleet.cli import main
from vllm_fleet.sizes import parse_size
from vllm_fleet.verify.logcheck import LogReport, parse_log

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
EXCUSED = FIXTURES / "vllm-logs" / "not-both-paths.tsv"


def _rows(runs: Path) -> list[list[str]]:
    lines = runs.read_text(encoding="utf-8").splitlines()
    return [line.split("\t") for line in lines if line.strip() and not line.startswith("#")]


def _log_of(folder: Path, name: str) -> Path | None:
    found = sorted(folder.glob(f"run*/{name}.log"))
    if found:
        return found[-1]
    return folder / name if (folder / name).is_file() else None


def _report(path: Path) -> LogReport:
    text = path.read_text(encoding="utf-8", errors="replace")
    return parse_log(text.split("# ---- verbatim below ----\n", 1)[-1])


def runs() -> list[Any]:
    found = []
    for runs_tsv in sorted(FIXTURES.glob("*/runs.tsv")):
        rows = _rows(runs_tsv)
        if not rows or any(len(row) != 4 for row in rows):
            continue  # another layout (lab-cpu-vllm-0.32.0-pp: stages and partitions), see not-both-paths.tsv
        for first, name, model, args in rows:
            log = _log_of(runs_tsv.parent, name)
            if log is None or not _report(log).kv_cache_tokens:
                continue  # never started, or refused before sizing the cache
            release = first if re.fullmatch(r"\d+\.\d+\.\d+(\.\d+)?", first) else None
            rel = str(log.relative_to(FIXTURES))
            # run-on-gpu.sh passes the column unquoted: split on blanks, quotes kept (a JSON value stays JSON)
            found.append(pytest.param(log, release, model, shlex.split(args, posix=False), id=rel))
    return found


RUNS = runs()


def _size(text: str) -> int:
    """vLLM reads `4G` as 4 GiB (human_readable_int, binary); the planner's parse_size spells it 4GiB."""
    return parse_size(re.sub(r"([KMGT])$", r"\1iB", text))


def _env(args: list[str]) -> dict[str, str]:
    """The leading NAME=VALUE words of a row (run-on-gpu.sh puts them in the run's environment)."""
    env: dict[str, str] = {}
    for word in args:
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", word):
            break
        name, value = word.split("=", 1)
        env[name] = value
    return env


def _flags(args: list[str]) -> dict[str, str]:
    flags: dict[str, str] = {}
    i = len(_env(args))
    while i < len(args):
        word = args[i]
        if i + 1 == len(args) or args[i + 1].startswith("--"):  # a switch (--enable-prefix-caching, ...)
            flags[word] = "true"
            i += 1
            continue
        flags[{"-tp": "--tensor-parallel-size"}.get(word, word)] = args[i + 1]
        i += 2
    return flags


def _render_vars(flags: dict[str, str], env: dict[str, str]) -> dict[str, Any]:
    variables: dict[str, Any] = {
        "vllm_service_model": "/models/under-test",
        "vllm_service_host": "127.0.0.1",
        "vllm_service_max_model_len": int(flags["--max-model-len"]),
        "vllm_service_kv_cache_memory_bytes": _size(flags["--kv-cache-memory-bytes"]),
        "vllm_service_tensor_parallel_size": int(flags.get("--tensor-parallel-size", "1")),
    }
    if "--kv-cache-dtype" in flags:
        variables["vllm_service_kv_cache_dtype"] = flags["--kv-cache-dtype"]
    if "--max-num-batched-tokens" in flags:
        variables["vllm_service_max_num_batched_tokens"] = int(flags["--max-num-batched-tokens"])
    if "--enable-prefix-caching" in flags:
        variables["vllm_service_enable_prefix_caching"] = True
    extra_args = ["--block-size", flags["--block-size"]] if "--block-size" in flags else []
    if "--disable-hybrid-kv-cache-manager" in flags:
        extra_args.append("--disable-hybrid-kv-cache-manager")
    if extra_args:
        variables["vllm_service_extra_args"] = extra_args
    if env:
        variables["vllm_service_extra_env"] = env
    if "--hf-overrides" in flags:
        variables["vllm_service_hf_overrides"] = json.loads(flags["--hf-overrides"])
    return variables


def _plan_argv(
    flags: dict[str, str], env: dict[str, str], config: Path, release: str, device: str
) -> list[str]:
    argv = ["plan", "--model-config", str(config), "--vllm-version", release, "--device", device]
    argv += ["--max-model-len", flags["--max-model-len"]]
    argv += ["--kv-cache-memory-bytes", str(_size(flags["--kv-cache-memory-bytes"]))]
    argv += ["--tensor-parallel-size", flags.get("--tensor-parallel-size", "1")]
    for flag in ("--kv-cache-dtype", "--max-num-batched-tokens", "--block-size", "--hf-overrides"):
        if flag in flags:
            argv += [flag, flags[flag]]
    for switch in ("--enable-prefix-caching", "--disable-hybrid-kv-cache-manager"):
        if switch in flags:
            argv.append(switch)
    for name, value in env.items():
        argv += ["--env", f"{name}={value}"]
    return [*argv, "--json"]


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, Any]]:
    code = main(argv)
    out, err = capsys.readouterr()
    assert out, err
    return code, json.loads(out)


@pytest.mark.parametrize(("log", "release", "model", "args"), RUNS)
def test_render_and_plan_give_vllms_own_line(
    log: Path, release: str | None, model: str, args: list[str], tmp_path: Path, capsys
) -> None:
    report = _report(log)
    release = report.version or release
    assert release, f"{log}: the log prints no release; give it in runs.tsv's first column"
    flags, env = _flags(args), _env(args)
    config = FIXTURES / "models" / f"{model}.config.json"
    device = report.kv_cache_device or "GPU"

    vars_file = tmp_path / "vars.yml"
    vars_file.write_text(yaml.safe_dump(_render_vars(flags, env)), encoding="utf-8")
    render = ["render", "--vars", str(vars_file), "--vllm-version", release, "--model-config", str(config)]
    if device == "CPU":
        instance = {"name": "i0", "device": "cpu", "tensor_parallel_size": 1, "port": 8000}
        (tmp_path / "instance.json").write_text(json.dumps(instance), encoding="utf-8")
        render += ["--instance-json", str(tmp_path / "instance.json")]
    _code, rendered = _json(capsys, [*render, "--json"])
    expectations = rendered["expectations"]
    assert "kv_cache_tokens" in expectations, rendered["warnings"]

    code, plan = _json(capsys, _plan_argv(flags, env, config, release, device))
    assert code == 0

    seen = (report.kv_cache_tokens, report.max_concurrency)
    assert (expectations["kv_cache_tokens"], expectations["max_concurrency"]) == seen
    assert (plan["gpu_kv_tokens"], round(plan["max_concurrency"], 2)) == seen
    assert expectations["kv_capacity_exact"] is plan["exact"] is True, plan["approximate_because"]


def _kv_logs() -> list[str]:
    found = []
    for path in sorted(FIXTURES.rglob("*")):
        if path.is_file() and path.suffix in (".log", ".txt") and _report(path).kv_cache_tokens:
            found.append(str(path.relative_to(FIXTURES)))
    return found


def test_every_fixture_log_with_a_kv_line_runs_both_paths_or_says_why_not() -> None:
    covered = {str(Path(p.values[0]).relative_to(FIXTURES)) for p in RUNS}
    excused = [row[0] for row in _rows(EXCUSED)]
    assert all(len(row) == 2 and row[1].strip() for row in _rows(EXCUSED)), "every entry gives a reason"
    loose = [
        path
        for path in _kv_logs()
        if path not in covered and not any(fnmatch.fnmatch(path, pattern) for pattern in excused)
    ]
    assert loose == [], "add each to a runs.tsv row (or, with the reason, to vllm-logs/not-both-paths.tsv)"
    assert len(covered) >= 15  # the families' 12 served runs and the public logs of vllm-logs/runs.tsv


def test_every_proven_range_names_fixtures_that_exist_and_catalogued_releases() -> None:
    from vllm_fleet import flags
    from vllm_fleet.plan.proven import PROVEN

    for proof in PROVEN:
        assert {proof.first, proof.last} <= set(flags.catalogued_versions()), proof
        assert flags.release_key(proof.first) <= flags.release_key(proof.last), proof
        for fixture in proof.fixtures:
            assert (FIXTURES / fixture).exists(), (proof.feature, fixture)
