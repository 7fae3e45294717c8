"""A tiny Qwen2 model that real vLLM can serve on a CPU in seconds, built offline with the standard library.

Nothing is downloaded: the tokenizer is a byte-level BPE trained here on a few sentences, the weights are
random (fixed seed, so the files are byte-for-byte reproducible) and written in the safetensors format by hand
(an 8-byte little-endian header length, a JSON header, then the raw tensors). The model talks nonsense; it
exists so that the lab exercises vLLM's real startup, KV-cache sizing, API and metrics.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import struct
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

SEED = 20261129
VOCAB_SIZE = 512
HIDDEN = 256
INTERMEDIATE = 512
LAYERS = 2
HEADS = 4
KV_HEADS = 2
MAX_POSITIONS = 2048
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A fleet of servers answers questions about long documents.",
    "The model reads the prompt, fills the cache and writes the answer token by token.",
    "Hello, how are you today? I am fine, thank you.",
    "Tensor parallel instances share the work of one model across several devices.",
    "The service starts, loads its weights and listens on a port for requests.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 and symbols ( ) [ ] { } < > = + - * / .",
]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, used by byte-level BPE vocabularies."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    )
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def train_bpe(corpus: list[str], vocab_budget: int) -> tuple[dict[str, int], list[str]]:
    """Byte-level BPE: the 256 byte symbols, then the most frequent adjacent pairs merged until the budget is
    reached or no pair occurs twice. Ties break on the pair itself, so the result is deterministic."""
    byte_map = bytes_to_unicode()
    vocab = {byte_map[b]: b for b in range(256)}
    words: Counter[tuple[str, ...]] = Counter()
    for line in corpus:
        for i, word in enumerate(line.split(" ")):
            text = (" " if i else "") + word
            words[tuple(byte_map[b] for b in text.encode())] += 1
    merges: list[str] = []
    while len(vocab) < vocab_budget:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for a, b in itertools.pairwise(word):
                pairs[(a, b)] += count
        if not pairs:
            break
        (a, b), count = min(pairs.items(), key=lambda item: (-item[1], item[0]))
        if count < 2:
            break
        merges.append(f"{a} {b}")
        vocab[a + b] = len(vocab)
        merged: Counter[tuple[str, ...]] = Counter()
        for word, n in words.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return vocab, merges


def tokenizer_json(vocab: dict[str, int], merges: list[str]) -> dict[str, Any]:
    added = [
        {
            "id": len(vocab) + i,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, token in enumerate(SPECIAL_TOKENS)
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def model_config(eos_id: int, bos_id: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": MAX_POSITIONS,
        "max_window_layers": LAYERS,
        "use_sliding_window": False,
        "sliding_window": None,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "use_cache": True,
    }


def tensor_shapes() -> dict[str, tuple[int, ...]]:
    """Qwen2ForCausalLM's parameter names and shapes (q/k/v carry a bias, o_proj and the MLP do not)."""
    head_dim = HIDDEN // HEADS
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB_SIZE, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (HIDDEN,)
        shapes[p + "post_attention_layernorm.weight"] = (HIDDEN,)
        shapes[p + "self_attn.q_proj.weight"] = (HEADS * head_dim, HIDDEN)
        shapes[p + "self_attn.q_proj.bias"] = (HEADS * head_dim,)
        shapes[p + "self_attn.k_proj.weight"] = (KV_HEADS * head_dim, HIDDEN)
        shapes[p + "self_attn.k_proj.bias"] = (KV_HEADS * head_dim,)
        shapes[p + "self_attn.v_proj.weight"] = (KV_HEADS * head_dim, HIDDEN)
        shapes[p + "self_attn.v_proj.bias"] = (KV_HEADS * head_dim,)
        shapes[p + "self_attn.o_proj.weight"] = (HIDDEN, HEADS * head_dim)
        shapes[p + "mlp.gate_proj.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[p + "mlp.up_proj.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[p + "mlp.down_proj.weight"] = (HIDDEN, INTERMEDIATE)
    shapes["model.norm.weight"] = (HIDDEN,)
    shapes["lm_head.weight"] = (VOCAB_SIZE, HIDDEN)
    return shapes


def _bf16(values: array) -> bytes:
    """float32 -> bfloat16 by keeping the upper half of each little-endian float (truncation)."""
    raw = values.tobytes()
    out = bytearray(len(raw) // 2)
    out[0::2] = raw[2::4]
    out[1::2] = raw[3::4]
    return bytes(out)


def safetensors_bytes(shapes: dict[str, tuple[int, ...]], seed: int = SEED) -> bytes:
    rng = random.Random(seed)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    offset = 0
    for name, shape in shapes.items():
        count = 1
        for dim in shape:
            count *= dim
        if name.endswith("norm.weight"):
            values = array("f", [1.0]) * count
        elif name.endswith(".bias"):
            values = array("f", [0.0]) * count
        else:
            values = array("f", (rng.gauss(0.0, 0.02) for _ in range(count)))
        blob = _bf16(values)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


def model_files() -> dict[str, bytes]:
    """Every file of the tiny model, by name."""
    vocab, merges = train_bpe(CORPUS, VOCAB_SIZE - len(SPECIAL_TOKENS))
    tok = tokenizer_json(vocab, merges)
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    eos, bos = ids["<|im_end|>"], ids["<|endoftext|>"]
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": MAX_POSITIONS,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    generation_config = {"bos_token_id": bos, "eos_token_id": eos, "do_sample": False}

    def dump(doc: dict[str, Any]) -> bytes:
        return (json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=True) + "\n").encode()

    return {
        "config.json": dump(model_config(eos_id=eos, bos_id=bos)),
        "generation_config.json": dump(generation_config),
        "tokenizer.json": dump(tok),
        "tokenizer_config.json": dump(tokenizer_config),
        "special_tokens_map.json": dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
        "model.safetensors": safetensors_bytes(tensor_shapes()),
    }


def build_model(dest: Path) -> dict[str, str]:
    """Write the model into `dest` (created); returns each file's sha256."""
    dest.mkdir(parents=True, exist_ok=True)
    digests = {}
    for name, data in model_files().items():
        (dest / name).write_bytes(data)
        digests[name] = hashlib.sha256(data).hexdigest()
    return digests


if __name__ == "__main__":  # pragma: no cover - python -m vllm_fleet.lab.tinymodel DIR
    import sys

    print(json.dumps(build_model(Path(sys.argv[1])), indent=2))
