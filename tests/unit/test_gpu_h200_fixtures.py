"""What vLLM 0.26.0 showed on a real H200 (tests/fixtures/gpu-h200-vllm-0.26.0, README there says how).

These tests need no GPU: they judge the recorded logs, /metrics scrapes and API answers again with
`vllm-fleet verify --replay` and read what the recordings show (KV tokens from the plan, the CPU tier in
effect, speculative acceptance, the refusal's kind and vLLM's own line).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fleet.cli import main
from vllm_fleet.verify.logcheck import parse_log
from vllm_fleet.verify.metrics import metric_total, parse_prometheus

GPU = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-h200-vllm-0.26.0"


def replay(run: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    d = GPU / run
    # verify read the log while the server ran; the recorded file goes on to the deliberate stop (SIGINT)
    log = d / "vllm.until-stop.log" if (d / "vllm.until-stop.log").exists() else d / "vllm.log"
    argv = ["verify", "--plan", str(d / "plan.json"), "--log", str(log)]
    rc = main([*argv, "--replay", str(d / "answers.json"), "--host", "h200", "--json"])
    return rc, json.loads(capsys.readouterr().out)


def checks(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def plan(run: str) -> dict:
    return json.loads((GPU / run / "plan.json").read_text())


def test_seed_dense_passes_every_check_again(capsys) -> None:
    rc, report = replay("seed-dense", capsys)
    assert rc == 0 and report["ok"]
    recorded = json.loads((GPU / "seed-dense" / "verify.json").read_text())
    # every check the GPU host ran gives the same verdict on the same figure; newer checks pass too
    now = {c["name"]: (c["ok"], c["seen"]) for c in report["checks"]}
    assert {c["name"]: (c["ok"], c["seen"]) for c in recorded["checks"]}.items() <= now.items()
    names = set(checks(report))
    assert {"readiness", "kv_cache_tokens", "max_concurrency", "kv_cache_dtype", "api_completion"} <= names
    assert {"api_chat_completion", "prefix_cache_hits", "spec_decode_acceptance", "ttft_p99"} <= names
    assert "restarts" not in names  # no systemd on that host: nothing counts restarts


def test_seed_dense_kv_tokens_are_the_plans(capsys) -> None:
    expected = plan("seed-dense")["expectations"]
    # 10 GiB of fp8 KV at 64 layers x 2 x 8 heads x 128 = 131,072 B per token
    assert expected["kv_cache_tokens"] == 10 * 2**30 // (64 * 2 * 8 * 128) == 81920
    _, report = replay("seed-dense", capsys)
    kv = checks(report)["kv_cache_tokens"]
    assert kv["ok"] and kv["seen"] == 81920 and "GPU KV cache size: 81,920 tokens" in kv["line"]
    conc = checks(report)["max_concurrency"]
    assert conc["seen"] == expected["max_concurrency"] == 1.25


def test_seed_dense_features_in_effect() -> None:
    log = (GPU / "seed-dense" / "vllm.log").read_text()
    report = parse_log(log)
    assert report.version == "0.26.0" and report.kv_cache_dtype == "fp8_e4m3"
    assert report.attention_backend == "FLASH_ATTN" and report.settings["flash_attention_version"] == 3
    assert report.settings["speculative_method"] == "ngram"
    assert report.settings["num_speculative_tokens"] == 3
    assert "'cudagraph_mode': <CUDAGraphMode.PIECEWISE: 1>" in log and "Graph capturing finished" in log
    assert "'rope_type': 'yarn', 'factor': 3.0, 'original_max_position_embeddings': 262144" in log
    argv = plan("seed-dense")["argv"]
    assert "--hf-overrides" in argv and "--enable-prompt-tokens-details" in argv


def test_seed_dense_cpu_tier_in_effect(capsys) -> None:
    _, replay_report = replay("seed-dense", capsys)
    log = (GPU / "seed-dense" / "vllm.log").read_text()
    assert "Creating v1 connector with name: OffloadingConnector" in log
    assert "Creating offloading spec with name: CPUOffloadingSpec" in log
    argv = plan("seed-dense")["argv"]
    tier = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert tier["kv_connector_extra_config"]["cpu_bytes_to_use"] == 16 * 2**30
    tier_check = checks(replay_report)["kv_offload_metrics"]
    assert tier_check["ok"] and "stored 23068672.0 B" in tier_check["detail"]  # over the verify window
    samples = parse_prometheus((GPU / "seed-dense" / "metrics-final.txt").read_text())
    # the long prompt's blocks went to the CPU tier (offload_prompt_only): 2.25 GB stored GPU -> CPU
    stored = metric_total(samples, "vllm:kv_offload_store_bytes_total")
    assert stored is not None and stored > 2e9
    assert (
        metric_total(samples, "vllm:kv_offload_total_bytes_total", {"transfer_type": "GPU_to_CPU"}) == stored
    )


def test_seed_dense_speculative_acceptance(capsys) -> None:
    _, report = replay("seed-dense", capsys)
    spec = checks(report)["spec_decode_acceptance"]
    assert spec["ok"] and spec["seen"] == 1.0
    assert report["metrics"]["spec_draft_tokens"] == report["metrics"]["spec_accepted_tokens"] == 50
    line = parse_log((GPU / "seed-dense" / "vllm.log").read_text()).spec_decode
    assert line["avg_draft_acceptance_rate"] == 100.0 and line["per_position"] == [1.0, 0.565, 0.478]


def test_seed_dense_prompt_details_and_parsers() -> None:
    extra = (GPU / "seed-dense" / "extra-requests.txt").read_text().splitlines()
    second = json.loads(extra[1].split(" ", 3)[3])
    assert second["prompt_tokens_details"]["cached_tokens"] == 16960  # the repeated long prompt hit the cache
    chat = json.loads(extra[2].removeprefix("chat with tools "))
    assert "reasoning" in chat["choices"][0]["message"]  # the qwen3 reasoning parser ran


def test_refused_start_is_reported_with_vllms_line_and_the_fix(capsys) -> None:
    rc, report = replay("refused", capsys)
    assert rc == 1 and not report["ok"]
    assert report["readiness"]["state"] == "crashed"
    by_name = checks(report)
    fatal = by_name["log_fatal_max_model_len_exceeds_kv_cache"]
    assert "To serve at least one request with the model's max seq len (750000)" in fatal["line"]
    assert "(91.55 GiB KV cache is needed" in fatal["line"]
    assert "Fix: lower max_model_len, or give the KV cache more memory" in by_name["readiness"]["detail"]
    errors = parse_log((GPU / "refused" / "vllm.log").read_text()).errors
    (values,) = {json.dumps(e.values) for e in errors if e.kind == "max_model_len_exceeds_kv_cache"}
    values = json.loads(values)
    assert (values["max_model_len"], values["needed_gib"], values["available_gib"]) == (750000, 91.55, 10.0)
    capacity = plan("refused")["expectations"]["capacity"]
    assert values["estimated_max_model_len"] == capacity["estimated_max_model_len"] == 81920
    # render said so before the start: the plan's error names the 750,000 tokens and the way out
    assert any("750,000-token request does not fit" in e for e in plan("refused")["errors"])


def test_hybrid_without_cutlass_dsl_dies_at_the_first_request(capsys) -> None:
    rc, report = replay("next-hybrid", capsys)
    by_name = checks(report)
    assert rc == 1 and by_name["readiness"]["ok"]
    assert not by_name["api_completion"]["ok"] and "status 500" in by_name["api_completion"]["detail"]
    log = (GPU / "next-hybrid" / "vllm.log").read_text()
    assert "SM90 GDN prefill DSL kernel is unavailable" in log
    assert "EngineCore encountered a fatal error." in log
    assert "engine_dead" in by_name["no_errors"]["seen"]  # the log checks see the engine die too


def test_hybrid_on_triton_serves_and_the_recorded_plan_was_off(capsys) -> None:
    rc, report = replay("next-hybrid-triton", capsys)
    failed = {c["name"] for c in report["checks"] if not c["ok"]}
    # the plan recorded on the host (the planner of then counted "align" mode: 2 state blocks per GDN group,
    # 68 blocks per request) is 4.4 % below vLLM's figure; test_hybrid_plan_now_equals_vllms_line re-plans
    assert rc == 1 and failed == {"kv_cache_tokens", "max_concurrency"}
    by_name = checks(report)
    assert by_name["kv_cache_tokens"]["seen"] == 821720
    assert plan("next-hybrid-triton")["expectations"]["kv_cache_tokens"] == 785468
    assert by_name["api_completion"]["ok"] and by_name["api_chat_completion"]["ok"]
    # vLLM starts a hybrid model without prefix caching unless asked: not measurable, not a failure
    assert by_name["prefix_cache_hits"]["expected"] == "not measurable"


def render_plan(run: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """`vllm-fleet render` of the run's vars with the current planner, as run-on-gpu.sh rendered it."""
    vars_file = GPU / f"vars-{run}.yml"
    config = GPU / "models" / f"{run.removesuffix('-triton')}-config.json"
    argv = ["render", "--vars", str(vars_file), "--vllm-version", "0.26.0", "--model-config", str(config)]
    assert main([*argv, "--json"]) == 0
    path = tmp_path / "plan.json"
    path.write_text(capsys.readouterr().out)
    return path


def test_hybrid_plan_now_equals_vllms_line(tmp_path: Path, capsys) -> None:
    # vLLM 0.26.0 leaves prefix caching off for a hybrid unless asked (arg_utils: "keep it opt-in"; the
    # log's /metrics cache_config_info: enable_prefix_caching="False", mamba_cache_mode="none"), so each
    # of the 3 GDN groups takes 1 state block per request: 62 attention blocks (65,536 / 1,072) + 3 = 65, and
    # 815 blocks / 65 x 65,536 = 821,720 tokens, 12.54x: the log's own line
    fresh = json.loads(render_plan("next-hybrid-triton", tmp_path, capsys).read_text())
    capacity = fresh["expectations"]["capacity"]
    blocks = (capacity["block_size"], capacity["num_gpu_blocks"], capacity["blocks_per_request"])
    assert blocks == (1072, 815, 65)
    assert capacity["exact"] and capacity["approximate_because"] == []
    log = parse_log((GPU / "next-hybrid-triton" / "vllm.log").read_text())
    assert log.kv_cache_tokens == fresh["expectations"]["kv_cache_tokens"] == 821720
    assert log.max_concurrency == fresh["expectations"]["max_concurrency"] == 12.54
    # verify, replayed against the fresh plan, passes every check on the same recorded answers
    d = GPU / "next-hybrid-triton"
    argv = ["verify", "--plan", str(tmp_path / "plan.json"), "--log", str(d / "vllm.until-stop.log")]
    rc = main([*argv, "--replay", str(d / "answers.json"), "--host", "h200", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in report["checks"] if not c["ok"]] == [] and rc == 0
