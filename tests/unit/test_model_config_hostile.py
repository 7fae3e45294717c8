"""A hostile or broken config.json is refused where it is read, naming the file, the key and the value
(issue 31).

The good configs are the recorded ones of tests/fixtures/models/ (each with its .source.txt); the bad ones are
built from lab-tiny-qwen2.config.json with one key changed, as a person or a damaged download would.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.model import ModelInfo, check_heads, divisors
from vllm_fleet.plan.model_config import (
    MAX_CONFIG_BYTES,
    model_config_from,
    parse_model_config,
    read_model_config_file,
)

MODELS = Path(__file__).resolve().parent.parent / "fixtures" / "models"
TINY = json.loads((MODELS / "lab-tiny-qwen2.config.json").read_text(encoding="utf-8"))


def changed(**keys: Any) -> str:
    return json.dumps({**TINY, **keys})


@pytest.mark.parametrize("path", sorted(MODELS.glob("*.config.json")), ids=lambda p: p.name)
def test_every_recorded_config_passes(path: Path) -> None:
    config = parse_model_config(read_model_config_file(path, "--model-config"), str(path))
    ModelInfo.from_config(config, str(path))


# (key, JSON text of the value, the value as the message shows it)
COUNTS = [
    ("num_attention_heads", "1e12", "1000000000000.0"),
    ("num_attention_heads", "1000000000001", "1000000000001"),
    ("num_hidden_layers", "64.0", "64.0"),
    ("num_hidden_layers", "0", "0"),
    ("num_hidden_layers", "-4", "-4"),
    ("num_hidden_layers", "100000", "100000"),
    ("head_dim", "0", "0"),
    ("head_dim", "true", "True"),
    ("num_key_value_heads", '"2"', "'2'"),
    ("num_key_value_heads", "[2]", "[2]"),
    ("sliding_window", "-1", "-1"),
    ("sliding_window", "1e300", "1e+300"),
    ("max_position_embeddings", "18446744073709551616", "18446744073709551616"),
    ("hidden_size", "2.5", "2.5"),
]


@pytest.mark.parametrize(("key", "text", "shown"), COUNTS, ids=[f"{k}={t}" for k, t, _ in COUNTS])
def test_a_count_out_of_range_names_file_key_and_value(key: str, text: str, shown: str) -> None:
    raw = json.dumps(TINY)[:-1] + f', "{key}": {text}}}'
    with pytest.raises(FleetInputError) as error:
        parse_model_config(raw, "--model-config 'bad.json'")
    message = str(error.value)
    assert message.startswith("--model-config 'bad.json': ")
    assert f"{key} = {shown} is not a whole number from " in message
    assert "fix the model's config.json" in message


@pytest.mark.parametrize("text", ["Infinity", "-Infinity", "NaN", "1e999"])
def test_a_non_finite_number_anywhere_is_refused(text: str) -> None:
    raw = json.dumps({**TINY, "rope_scaling": {"type": "yarn"}})[:-1] + f', "extra": {{"x": [1, {text}]}}}}'
    with pytest.raises(
        FleetInputError, match=r"^c\.json: extra\.x\[1\] = -?(inf|nan) is not a finite number"
    ):
        parse_model_config(raw, "c.json")


def test_counts_in_the_language_models_section_are_checked_with_its_name() -> None:
    raw = json.dumps({"architectures": ["X"], "text_config": {**TINY, "num_attention_heads": 0}})
    with pytest.raises(FleetInputError, match=r"^c\.json: text_config\.num_attention_heads = 0 is not"):
        parse_model_config(raw, "c.json")


def test_layer_types_of_the_wrong_length_or_type() -> None:
    with pytest.raises(
        FleetInputError, match=r"c\.json: layer_types lists 3 layers but num_hidden_layers is 2"
    ):
        parse_model_config(changed(layer_types=["full_attention"] * 3), "c.json")
    with pytest.raises(FleetInputError, match=r"c\.json: layer_types = 'full_attention' is not a list"):
        parse_model_config(changed(layer_types="full_attention"), "c.json")
    with pytest.raises(
        FleetInputError, match=r"c\.json: layer_types = \[1, 2\] is not a list of layer kinds"
    ):
        parse_model_config(changed(layer_types=[1, 2]), "c.json")
    with pytest.raises(FleetInputError, match=r"c\.json: hybrid_override_pattern = 7 is not a string"):
        parse_model_config(changed(hybrid_override_pattern=7), "c.json")


def test_rope_factor_and_kda_layers() -> None:
    with pytest.raises(
        FleetInputError, match=r"c\.json: rope_scaling\.factor = 1e\+200 must be a number above 0"
    ):
        parse_model_config(changed(rope_scaling={"type": "yarn", "factor": 1e200}), "c.json")
    with pytest.raises(
        FleetInputError, match=r"rope_scaling\.original_max_position_embeddings = 0 is not a whole number"
    ):
        parse_model_config(
            changed(rope_scaling={"factor": 4, "original_max_position_embeddings": 0}), "c.json"
        )
    with pytest.raises(
        FleetInputError, match=r"linear_attn_config\.kda_layers\[1\] = 'x' is not a whole number"
    ):
        parse_model_config(changed(linear_attn_config={"kda_layers": [1, "x"]}), "c.json")


def test_a_device_or_huge_file_is_refused_after_a_bounded_read(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(FleetInputError, match=r"^--model-config '/dev/zero' is larger than 4 MiB"):
        read_model_config_file("/dev/zero", "--model-config")
    assert time.monotonic() - started < 5
    big = tmp_path / "big.json"
    big.write_text('{"a": "' + "x" * MAX_CONFIG_BYTES + '"}')
    with pytest.raises(FleetInputError, match=r"big\.json' is larger than 4 MiB"):
        read_model_config_file(big, "vllm_service_model_config")


def test_binary_deep_and_odd_json(tmp_path: Path) -> None:
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(FleetInputError, match=r"weights\.bin' is not UTF-8 text \(byte 128"):
        read_model_config_file(binary, "--model-config")
    with pytest.raises(FleetInputError, match=r"^c\.json is nested deeper than a JSON parser follows"):
        parse_model_config("[" * 100_000 + "]" * 100_000, "c.json")
    with pytest.raises(FleetInputError, match=r"^c\.json: a\.a\.a.* is nested more than 32 levels deep"):
        parse_model_config('{"a": ' * 40 + "1" + "}" * 40, "c.json")
    with pytest.raises(FleetInputError, match=r"^c\.json is not a config\.json: Exceeds the limit"):
        parse_model_config('{"num_hidden_layers": ' + "9" * 5000 + "}", "c.json")
    with pytest.raises(FleetInputError, match=r"^c\.json holds a JSON list, not an object"):
        parse_model_config("[1, 2]", "c.json")
    with pytest.raises(FleetInputError, match=r"^c\.json is not valid JSON"):
        parse_model_config("", "c.json")


def test_an_inline_mapping_and_a_host_copy_are_checked_too(tmp_path: Path) -> None:
    with pytest.raises(
        FleetInputError, match=r"vllm_service_model_config \(inline mapping\): head_dim = 0 is"
    ):
        model_config_from({**TINY, "head_dim": 0}, None)
    slurp = {
        "path": "/models/x/config.json",
        "content": base64.b64encode(changed(n_head=-1).encode()).decode(),
    }
    with pytest.raises(FleetInputError, match=r"the host's /models/x/config\.json: n_head = -1 is not"):
        model_config_from(None, slurp)
    with pytest.raises(
        FleetInputError, match=r"the host's /models/x/config\.json: the slurped content is not"
    ):
        model_config_from(None, {"path": "/models/x/config.json", "content": "@@not base64@@"})
    path = tmp_path / "config.json"
    path.write_text(changed(num_hidden_layers=64.0))
    with pytest.raises(
        FleetInputError, match=r"config\.json: num_hidden_layers = 64\.0 is not a whole number"
    ):
        model_config_from(str(path), None)


def test_model_info_checks_a_dict_from_anywhere() -> None:
    with pytest.raises(FleetInputError, match=r"^mine: num_attention_heads = 1000000000001 is not"):
        ModelInfo.from_config({**TINY, "num_attention_heads": 1_000_000_000_001}, "mine")


def test_divisors_of_a_huge_head_count_take_no_list_per_head() -> None:
    """check_heads once listed range(1, heads + 1): 10^12 + 1 heads never returned (issue 31)."""
    started = time.monotonic()
    assert divisors(1_000_000_000_001) == [
        1,
        73,
        137,
        10001,
        99990001,
        7299270073,
        13698630137,
        1_000_000_000_001,
    ]
    assert time.monotonic() - started < 2
    assert divisors(64) == [1, 2, 4, 8, 16, 32, 64] and divisors(1) == [1]
    with pytest.raises(FleetInputError, match=r"Choose a tensor_parallel_size among \[1, 2, 3, 4, 6, 12\]"):
        check_heads(8, 12, None)
