"""ServeSpec.from_vars: the vllm_service_* variables, typed; errors name the variable and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vllm_fleet.errors import FleetInputError
from vllm_fleet.render.schema import ServeSpec, variable_names

REPO = Path(__file__).resolve().parents[2]
SEED_VARS = REPO / "inventory/examples/seed-4x4090/group_vars/all/vllm_service.yml"


def seed_vars() -> dict:
    return yaml.safe_load(SEED_VARS.read_text(encoding="utf-8"))


def test_seed_inventory_reads():
    spec = ServeSpec.from_vars(seed_vars())
    assert spec.kv_cache_memory_bytes == 10 * 2**30
    assert spec.kv_offload_cpu_bytes == 200 * 2**30
    assert spec.served_model_name == ("qwen3-27b",)
    assert spec.num_speculative_tokens == 3
    assert spec.scheduler_reserve_full_isl is False
    assert spec.rope_scaling["factor"] == 3.0


def test_sizes_and_lengths_take_vllm_suffixes():
    spec = ServeSpec.from_vars(
        {
            "vllm_service_model": "/m",
            "vllm_service_host": "127.0.0.1",
            "vllm_service_kv_cache_memory_bytes": "10G",
            "vllm_service_kv_offload_cpu_bytes": "200GiB",
            "vllm_service_max_model_len": "32k",
            "vllm_service_max_num_batched_tokens": "8K",
        }
    )
    assert spec.kv_cache_memory_bytes == 10 * 2**30
    assert spec.kv_offload_cpu_bytes == 200 * 2**30
    assert spec.max_model_len == 32000
    assert spec.max_num_batched_tokens == 8192


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        ({"vllm_service_model": ""}, r"vllm_service_model: not set"),
        ({"vllm_service_max_num_seqs": "many"}, r"vllm_service_max_num_seqs: 'many' is not an integer"),
        (
            {"vllm_service_gpu_memory_utilization": 1.5},
            r"vllm_service_gpu_memory_utilization: 1.5 is not between",
        ),
        (
            {"vllm_service_enable_prefix_caching": "maybe"},
            r"vllm_service_enable_prefix_caching: 'maybe'.*true or false",
        ),
        (
            {"vllm_service_limit_mm_per_prompt": '{"image": 40}'},
            r"vllm_service_limit_mm_per_prompt: .*not a mapping",
        ),
        (
            {"vllm_service_extra_args": "--dtype bfloat16"},
            r"vllm_service_extra_args: .*one list item per argv word",
        ),
        ({"vllm_service_port": 70000}, r"vllm_service_port: 70000 is not allowed: give at most 65535"),
        ({"vllm_service_kv_cache_memory_bytes": "10 parsecs"}, r"vllm_service_kv_cache_memory_bytes"),
        (
            {"vllm_service_kv_offload_fs_tier": {"n_read_threads": 16}},
            r"vllm_service_kv_offload_fs_tier: .*root_dir",
        ),
    ],
)
def test_bad_values_name_the_variable(overrides, pattern):
    variables = {**seed_vars(), **overrides}
    with pytest.raises(FleetInputError, match=pattern):
        ServeSpec.from_vars(variables)


def test_fs_tier_threads_at_the_top_level_are_refused_with_the_fix():
    variables = {
        **seed_vars(),
        "vllm_service_kv_offload_extra_config": {"n_read_threads": 16, "n_write_threads": 4},
    }
    with pytest.raises(FleetInputError) as excinfo:
        ServeSpec.from_vars(variables)
    message = str(excinfo.value)
    assert "n_read_threads, n_write_threads" in message
    assert "vllm_service_kv_offload_fs_tier" in message


def test_offload_settings_without_cpu_bytes_are_refused():
    variables = {**seed_vars(), "vllm_service_kv_offload_cpu_bytes": None}
    with pytest.raises(FleetInputError, match="vllm_service_kv_offload_cpu_bytes: not set"):
        ServeSpec.from_vars(variables)


def test_api_key_is_masked_in_the_plan():
    spec = ServeSpec.from_vars({**seed_vars(), "vllm_service_api_key": "sk-secret"})
    assert spec.api_key == "sk-secret"
    assert "sk-secret" not in repr(spec)
    assert spec.to_dict()["api_key"] == "********"


def test_every_schema_variable_is_documented_in_the_role():
    defaults = (REPO / "roles/vllm_service/defaults/main.yml").read_text(encoding="utf-8")
    specs = yaml.safe_load((REPO / "roles/vllm_service/meta/argument_specs.yml").read_text(encoding="utf-8"))
    options = specs["argument_specs"]["main"]["options"]
    for name in variable_names():
        assert f"\n{name}:" in defaults, f"{name} missing from defaults/main.yml"
        assert name in options, f"{name} missing from meta/argument_specs.yml"
