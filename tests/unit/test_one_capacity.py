"""Issue 34's bug, end to end: render (and so preflight, deploy's expectations and verify) plans the release
vllm_install_version installs, never the flag catalog's neighbour; a release the catalog lacks is an error
with the fix; a figure no real log of the release proves is judged by verify as a warning with both numbers.

The Gemma-3-4B geometry and its figures are the issue's: one H200, vLLM 0.26.0 served from the project's
bundle printed "GPU KV cache size: 50,045 tokens" and 1.53x, where render (checked against 0.25.0) expected
77,947 and 2.38x and verify failed the healthy instance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from plans import lab_instance_plan

from vllm_fleet.cli import main
from vllm_fleet.verify.report import build_report, failure_message, warning_lines

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
METRICS = FIXTURES / "metrics"

# Gemma-3-4B's text geometry (the issue's): 34 layers, 5 sliding-window layers per full one, window 1024,
# 4 KV heads x 256.
GEMMA3_4B: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "num_hidden_layers": 34,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_size": 2560,
    "sliding_window": 1024,
    "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(34)],
    "torch_dtype": "bfloat16",
}
VARS = {
    "vllm_service_model": "/models/gemma-3-4b",
    "vllm_service_host": "127.0.0.1",
    "vllm_service_max_model_len": 32768,
    "vllm_service_kv_cache_memory_bytes": 4 * 2**30,
    "vllm_service_max_num_batched_tokens": 8192,
}


def _render(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: str, **extra: Any
) -> tuple[int, str, str]:
    (tmp_path / "vars.yml").write_text(yaml.safe_dump({**VARS, **extra}), encoding="utf-8")
    (tmp_path / "config.json").write_text(json.dumps(GEMMA3_4B), encoding="utf-8")
    argv = ["render", "--vars", str(tmp_path / "vars.yml"), "--model-config", str(tmp_path / "config.json")]
    code = main([*argv, "--vllm-version", version, "--json"])
    out, err = capsys.readouterr()
    return code, out, err


def test_render_expects_what_the_installed_release_prints(tmp_path: Path, capsys) -> None:
    code, out, _ = _render(tmp_path, capsys, "0.26.0")
    rendered = json.loads(out)
    assert code == 0, rendered["errors"]
    assert rendered["catalog_release"] == rendered["vllm_version"] == "0.26.0"
    assert not [w for w in rendered["warnings"] if "nearest catalogued" in w]
    expected = rendered["expectations"]
    assert (expected["kv_cache_tokens"], expected["max_concurrency"]) == (50_045, 1.53)  # vLLM 0.26.0's line
    assert expected["kv_capacity_exact"] is True
    # 0.25.0 itself (the old neighbour) counts one in-flight batch: the 77,947 of the issue, and no real log
    # of 0.25.0 proves sliding windows, so its figure is approximate
    code, out, _ = _render(tmp_path, capsys, "0.25.0")
    older = json.loads(out)["expectations"]
    assert (older["kv_cache_tokens"], older["max_concurrency"], older["kv_capacity_exact"]) == (
        77_947,
        2.38,
        False,
    )


def test_plan_gives_render_s_figures(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.json").write_text(json.dumps(GEMMA3_4B), encoding="utf-8")
    argv = ["plan", "--model-config", str(tmp_path / "config.json"), "--max-model-len", "32768"]
    argv += ["--kv-cache-memory-bytes", str(4 * 2**30), "--max-num-batched-tokens", "8192"]
    assert main([*argv, "--vllm-version", "0.26.0", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["gpu_kv_tokens"], round(plan["max_concurrency"], 2), plan["exact"]) == (50_045, 1.53, True)


@pytest.mark.parametrize("version", ["0.26.1", "0.35.0"])
def test_a_release_the_catalog_lacks_is_refused_with_the_fix(tmp_path: Path, capsys, version: str) -> None:
    code, _out, err = _render(tmp_path, capsys, version)
    assert code == 2
    assert f"vLLM {version!r} is not in the flag catalog" in err
    assert "vllm_install_version" in err and "scripts/gen_flag_catalog.py" in err


def _lab_report(kv_tokens: int, exact: bool) -> Any:
    """The recorded healthy lab start (fixtures/metrics/healthy) against a plan expecting `kv_tokens`."""
    plan = lab_instance_plan(vllm_service_host="0.0.0.0")
    plan["expectations"] = {
        **plan["expectations"],
        "kv_cache_tokens": kv_tokens,
        "max_concurrency": kv_tokens / 256,
        "kv_capacity_exact": exact,
    }
    api = json.loads((METRICS / "healthy" / "api.json").read_text())
    api["metrics"] = {"status": 200, "content": (METRICS / "healthy" / "metrics-after.txt").read_text()}
    return build_report(
        host="lab-1",
        plan=plan,
        journal=(METRICS / "healthy" / "startup.log").read_text(),
        unit_show=(METRICS / "systemctl" / "running.txt").read_text(),
        api=api,
        metrics_before=(METRICS / "healthy" / "metrics-before.txt").read_text(),
        metrics_after=(METRICS / "healthy" / "metrics-after.txt").read_text(),
        readiness={"state": "ready", "reason": "/health answered 200", "waited_s": 31.0, "timeout": 320},
    )


def test_verify_warns_with_both_numbers_when_the_plan_is_approximate() -> None:
    report = _lab_report(1_500_000, exact=False)
    assert report.ok, failure_message(report)
    lines = warning_lines(report)
    assert len(lines) == 2
    tokens = next(line for line in lines if "kv_cache_tokens" in line)
    assert "vLLM shows 1048576, the plan expected 1500000" in tokens


def test_verify_fails_an_exact_plan_that_is_off() -> None:
    report = _lab_report(1_500_000, exact=True)
    assert not report.ok
    assert {c.name for c in report.failed()} == {"kv_cache_tokens", "max_concurrency"}
    assert warning_lines(report) == []
    assert _lab_report(1_048_576, exact=False).ok and warning_lines(_lab_report(1_048_576, exact=False)) == []


def test_hf_overrides_reach_the_capacity_on_both_paths(tmp_path: Path, capsys) -> None:
    """vLLM sizes the config after --hf-overrides: a window of 512 instead of Gemma's 1024 is fewer blocks
    per sliding group; render (vllm_service_hf_overrides) and plan (--hf-overrides) both see it."""
    base = json.loads(_render(tmp_path, capsys, "0.26.0")[1])["expectations"]
    code, out, _ = _render(tmp_path, capsys, "0.26.0", vllm_service_hf_overrides={"sliding_window": 512})
    smaller = json.loads(out)["expectations"]
    assert code == 0 and smaller["capacity"]["blocks_per_request"] < base["capacity"]["blocks_per_request"]
    argv = ["plan", "--model-config", str(tmp_path / "config.json"), "--max-model-len", "32768"]
    argv += ["--kv-cache-memory-bytes", str(4 * 2**30), "--max-num-batched-tokens", "8192"]
    argv += ["--vllm-version", "0.26.0", "--hf-overrides", '{"sliding_window": 512}', "--json"]
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["gpu_kv_tokens"] == smaller["kv_cache_tokens"] and plan["max_concurrency"] > 1.53
    assert main([*argv[:-3], "--hf-overrides", "[1]"]) == 2
    assert "--hf-overrides: '[1]' must be a JSON object" in capsys.readouterr().err
