"""`vllm-fleet plan`, run as the installed console script (DESIGN §4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parent.parent / "fixtures" / "models"
CLI = Path(sys.executable).with_name("vllm-fleet")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    assert CLI.is_file(), f"console script missing: {CLI} (pip install -e .)"
    return subprocess.run([str(CLI), "plan", *args], capture_output=True, text=True, timeout=60, check=False)


def test_seed_numbers_from_the_console_script(tmp_path: Path) -> None:
    seed = tmp_path / "seed-config.json"
    seed.write_text(
        json.dumps(
            {"num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128}
        )
    )
    done = run(
        "--model-config", str(seed), "--tensor-parallel-size", "4", "--kv-cache-memory-bytes", "10737418240",
        "--kv-cache-dtype", "fp8_e4m3", "--max-model-len", "750000", "--max-num-batched-tokens", "8192",
        "--avg-input-len", "32768", "--vllm-version", "0.32.0", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["kv_bytes_per_token"] == 131_072
    assert plan["kv_bytes_per_token_per_gpu"] == 32_768
    assert plan["gpu_kv_tokens"] == 327_680
    assert plan["fits_on_gpu"] is False
    assert plan["offload_bytes_needed"] == 55_354_327_040
    assert plan["prefill_chunks"] == 92
    assert plan["concurrency_at_avg_input_len"] == 10.0
    assert plan["max_concurrency"] == pytest.approx(0.4369, abs=1e-4)
    assert isinstance(plan["warnings"], list) and plan["warnings"]


def test_lab_tiny_model_line_human_output() -> None:
    done = run(
        "--model-config", str(MODELS / "lab-tiny-qwen2.config.json"), "-tp", "1",
        "--kv-cache-memory-bytes", "1G",
        "--kv-cache-dtype", "auto", "--max-model-len", "256", "--device", "CPU",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        "CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 256 tokens per request: 4096.00x"
        in done.stdout
    )
    assert "fits on CPU           yes" in done.stdout


def test_real_log_line_from_available_memory() -> None:
    done = run(
        "--model-config", str(MODELS / "qwen3.6-27b.config.json"), "-tp", "2",
        "--kv-bytes-per-gpu", "9.84 GiB",
        "--kv-cache-dtype", "fp8_e5m2", "--max-model-len", "262144", "--vllm-version", "0.21.0", "--json",
        "--enable-prefix-caching",  # club-3090's dual/docker-compose.yml serves with it
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["kv_cache_line"] == (
        "GPU KV cache size: 619,202 tokens, Maximum concurrency for 262,144 tokens per request: 2.36x"
    )
    assert plan["expectations"]["kv_cache_tokens"] == 619_202


def test_config_pasted_inside_other_text(tmp_path: Path) -> None:
    pasted = tmp_path / "issue.txt"
    pasted.write_text("Here is my config:\n" + (MODELS / "qwen3-14b.config.json").read_text() + "\nthanks!\n")
    done = run(
        "--model-config", str(pasted), "-tp", "1", "--kv-bytes-per-gpu", "6.51GiB",
        "--kv-cache-dtype", "auto",
        "--max-model-len", "40960", "--vllm-version", "0.32.0", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["gpu_kv_tokens"] == 42_656


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-cache-memory-bytes", "1.5G"], "--kv-cache-memory-bytes: '1.5G'"),
        (["--kv-cache-memory-bytes", "lots"], "--kv-cache-memory-bytes: cannot read 'lots'"),
        ([], "give the KV memory per GPU"),
        (["--kv-bytes-per-gpu", "1G", "--kv-cache-memory-bytes", "1G"], "only one of"),
    ],
)
def test_bad_sizes_exit_2_naming_the_flag(args: list[str], message: str) -> None:
    done = run(
        "--model-config", str(MODELS / "qwen3-14b.config.json"), "-tp", "1", "--kv-cache-dtype", "auto",
        "--max-model-len", "4096", *args,
    )  # fmt: skip
    assert done.returncode == 2
    assert message in done.stderr
    assert done.stdout == ""


def test_missing_and_invalid_config_exit_2(tmp_path: Path) -> None:
    common = ["-tp", "1", "--kv-bytes-per-gpu", "1G", "--kv-cache-dtype", "auto", "--max-model-len", "4096"]
    missing = run("--model-config", str(tmp_path / "nope.json"), *common)
    assert missing.returncode == 2 and "--model-config: cannot read" in missing.stderr
    broken = tmp_path / "broken.json"
    broken.write_text('{"num_hidden_layers": 4,')
    invalid = run("--model-config", str(broken), *common)
    assert invalid.returncode == 2 and "is not valid JSON" in invalid.stderr
    bad_dtype = run("--model-config", str(MODELS / "qwen3-14b.config.json"), *common[:4],
                    "--kv-cache-dtype", "int3",
                    "--max-model-len", "4096")  # fmt: skip
    assert bad_dtype.returncode == 2 and "'int3' is not a vLLM kv-cache dtype" in bad_dtype.stderr


def test_inventory_plans_from_any_working_directory(tmp_path: Path) -> None:
    """The roles' defaults call the collection's filters (vllm_fleet_report_dir): `plan --inventory` finds the
    collection where this project is, not through the working directory's ansible.cfg (README's tour runs it
    in a copy of the checkout; a user runs it anywhere)."""
    inventory = Path(__file__).resolve().parents[2] / "inventory" / "examples" / "seed-4x4090"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    # no copy elsewhere may answer (molecule's prerun leaves one in ~/.ansible/collections)
    env.update(HOME=str(tmp_path), ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "none"))
    out = subprocess.run(
        [str(CLI), "plan", "--inventory", str(inventory), "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout)["hosts"]["seed-4090"]["instances"]
