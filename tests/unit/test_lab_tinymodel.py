"""The lab's tiny model is well-formed for vLLM: consistent config, valid safetensors, a valid byte-level BPE
tokenizer. (That real vLLM serves it is proven in tests/integration/test_lab_vllm.py.)"""

from __future__ import annotations

import functools
import itertools
import json
import struct

from vllm_fleet.lab import tinymodel
from vllm_fleet.plan.capacity import KvShape


@functools.cache
def _files():
    return tinymodel.model_files()


def test_deterministic():
    assert tinymodel.model_files() == _files()


def test_build_writes_every_file(tmp_path):
    digests = tinymodel.build_model(tmp_path / "tiny")
    assert sorted(digests) == sorted(p.name for p in (tmp_path / "tiny").iterdir())
    assert "model.safetensors" in digests and "tokenizer.json" in digests


def test_safetensors_layout_matches_the_config():
    files = _files()
    data = files["model.safetensors"]
    (head_len,) = struct.unpack("<Q", data[:8])
    assert head_len % 8 == 0
    header = json.loads(data[8 : 8 + head_len])
    body = len(data) - 8 - head_len
    header.pop("__metadata__")
    shapes = tinymodel.tensor_shapes()
    assert set(header) == set(shapes)
    spans = sorted(tuple(t["data_offsets"]) for t in header.values())
    assert spans[0][0] == 0 and spans[-1][1] == body
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # contiguous, no holes
    for name, meta in header.items():
        count = 1
        for dim in meta["shape"]:
            count *= dim
        assert meta["dtype"] == "BF16"
        assert meta["data_offsets"][1] - meta["data_offsets"][0] == 2 * count, name
    config = json.loads(files["config.json"])
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    assert header["model.embed_tokens.weight"]["shape"] == [config["vocab_size"], config["hidden_size"]]
    assert header["model.layers.0.self_attn.k_proj.weight"]["shape"] == [
        config["num_key_value_heads"] * head_dim,
        config["hidden_size"],
    ]
    assert sum(1 for n in header if n.endswith("input_layernorm.weight")) == config["num_hidden_layers"]


def test_norm_weights_are_one_and_linear_weights_random():
    data = _files()["model.safetensors"]
    (head_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + head_len])
    body = data[8 + head_len :]

    def first_bf16(name):
        start = header[name]["data_offsets"][0]
        (bits,) = struct.unpack("<H", body[start : start + 2])
        return struct.unpack("<f", struct.pack("<I", bits << 16))[0]

    assert first_bf16("model.norm.weight") == 1.0
    value = first_bf16("model.layers.0.mlp.up_proj.weight")
    assert value != 0.0 and abs(value) < 0.2


def test_config_is_the_documented_qwen2_shape():
    config = json.loads(_files()["config.json"])
    assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"]
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]) == (512, 256, 2)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    # the planner reads it like any real model
    shape = KvShape.from_model_config(config)
    assert shape is not None


def test_tokenizer_is_a_valid_byte_level_bpe():
    files = _files()
    tok = json.loads(files["tokenizer.json"])
    vocab = tok["model"]["vocab"]
    byte_chars = set(tinymodel.bytes_to_unicode().values())
    assert len(byte_chars) == 256 and byte_chars <= set(vocab)
    assert sorted(vocab.values()) == list(range(len(vocab)))
    for merge in tok["model"]["merges"]:
        a, b = merge.split(" ")
        assert a in vocab and b in vocab and a + b in vocab
    specials = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert sorted(specials.values()) == list(range(len(vocab), len(vocab) + len(specials)))
    config = json.loads(files["config.json"])
    assert max(specials.values()) < config["vocab_size"]
    assert config["eos_token_id"] == specials["<|im_end|>"]
    tcfg = json.loads(files["tokenizer_config.json"])
    assert tcfg["eos_token"] == "<|im_end|>"
    assert "<|im_start|>" in tcfg["chat_template"] and "add_generation_prompt" in tcfg["chat_template"]


def test_bpe_training_merges_frequent_pairs_first():
    vocab, merges = tinymodel.train_bpe(["ab ab ab", "ab"], 300)
    assert merges[0] == "a b"
    assert vocab["ab"] == 256
