"""A start that dies before readiness with no fatal line logcheck knows: the exception that ends its first
traceback is reported (`start_exception`), on real vLLM 0.26.0 logs from an H200
(tests/fixtures/gpu-h200-vllm-0.26.0*/, each folder's README says how they were made). A traceback a start
recovers from (logged as a WARNING, or followed by readiness) is not an error, and a start whose known fatal
line names the cause gets no second one."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fleet.verify.logcheck import parse_file, parse_log
from vllm_fleet.verify.report import Readiness, crash_message

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FAMILIES = FIXTURES / "gpu-h200-vllm-0.26.0-families" / "run2"
GPU = FIXTURES / "gpu-h200-vllm-0.26.0"


def kinds(path: Path) -> list[str]:
    return list(dict.fromkeys(e.kind for e in parse_file(path).errors))


def test_a_config_the_release_cannot_load_is_the_error() -> None:
    """Falcon-H1-0.5B's partial config.json: transformers' validator refuses it inside ModelConfig; vLLM
    prints only the traceback (no EngineCore, no known fatal line) and exits."""
    report = parse_file(FAMILIES / "falcon-h1-0.5b-16k.log")
    assert not report.ready
    assert [e.kind for e in report.errors] == ["start_exception"]
    assert report.errors[0].values == {
        "exception": "ValueError",
        "message": "mamba_n_heads must divide mamba_expand * hidden_size",
    }
    evidence = report.evidence["start_exception"]
    assert evidence.endswith("ValueError: mamba_n_heads must divide mamba_expand * hidden_size")


@pytest.mark.parametrize(
    ("path", "exception", "needle"),
    [
        (FAMILIES / "granite-h-1b-128k.log", "KeyError", "attribute 'weight' already exists"),
        (GPU / "next-hybrid-triton-flashinfer-jit" / "vllm.log", "CalledProcessError", "'ninja', '-v'"),
    ],
    ids=["granite-excerpt-config", "flashinfer-jit-build"],
)
def test_the_root_cause_under_vllms_wrapper(path: Path, exception: str, needle: str) -> None:
    """`EngineCore failed to start` / "See root cause above": the first traceback's exception is the cause."""
    report = parse_file(path)
    assert kinds(path) == ["engine_init_failed", "start_exception"]
    error = next(e for e in report.errors if e.kind == "start_exception")
    assert error.values["exception"] == exception and needle in error.values["message"]
    unit = "vllm-fleet-i0.service"
    message, errors = crash_message(unit, Readiness("crashed", "exit"), path.read_text(), 30)
    assert errors[0]["kind"] == "start_exception"  # the cause leads, the wrapper follows
    assert "(start_exception)" in message.splitlines()[1] and needle in message.splitlines()[1]


@pytest.mark.parametrize(
    "path",
    [FAMILIES / "falcon-h1-7b-128k.log", FAMILIES / "kimi-linear-128k.log"],
    ids=["kv-too-small", "cuda-oom"],
)
def test_a_known_fatal_line_names_the_cause_alone(path: Path) -> None:
    report = parse_file(path)
    assert report.start_exception is not None  # the traceback was read ...
    assert "start_exception" not in kinds(path)  # ... and the known kind (refusal, OOM) reports it


def test_tracebacks_a_start_recovers_from_are_not_errors() -> None:
    """Qwen3-Next on 0.26.0: the GDN prefill kernel probe logs NotImplementedError tracebacks as WARNINGs
    while starting, then the server becomes ready (it dies later, at the first request: engine_dead)."""
    report = parse_file(GPU / "next-hybrid" / "vllm.log")
    assert report.ready and report.start_exception is None
    assert "start_exception" not in {e.kind for e in report.errors}
    lines = (FAMILIES / "falcon-h1-0.5b-16k.log").read_text().splitlines()
    ready = "(APIServer pid=1854) INFO:     Application startup complete."
    assert parse_log("\n".join([*lines, ready])).errors == []  # a later readiness: recovered
