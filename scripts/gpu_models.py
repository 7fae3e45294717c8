#!/usr/bin/env python3
"""Build random-weight models with real KV geometries on a GPU host that has torch and transformers (no hub).

    python3 scripts/gpu_models.py OUT_DIR [seed-dense] [next-hybrid]
    python3 scripts/gpu_models.py OUT_DIR --dummy NAME=CONFIG.json [NAME=CONFIG.json ...]

- seed-dense: the seed's KV geometry, Qwen3 with 64 layers x 8 KV heads x 128 (131,072 B of fp8 KV per token),
  a narrow hidden size so the weights are small (about 0.2 GB).
- next-hybrid: Qwen3-Next-shaped, 48 layers with every 4th full attention (2 KV heads x 256) and Gated
  DeltaNet linear attention (16 key / 32 value heads of 128) in the others, a small MoE.

- --dummy: a released model's config.json as it is, beside the tokenizer, and no weights: for
  `vllm serve --load-format dummy`, which fills every weight at random on the GPU (models of tens of GB in
  seconds, with no file to copy). vLLM sizes the KV cache from the config alone.

The tokenizer is the lab's tinymodel one (`vllm_fleet.lab.tinymodel`) plus the marker tokens the seed's
parsers look up by name: `<think>`/`</think>` (vLLM's qwen3 reasoning parser raises "could not locate think
start/end tokens" without them) and `<tool_call>`/`</tool_call>` (qwen3_coder). The weights are random with
a fixed seed, so the model talks nonsense; it exists to exercise vLLM's real start-up, KV-cache sizing, CPU
offload, speculative decoding and API on the GPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parent.parent / "src"
if SRC.is_dir():
    sys.path.insert(0, str(SRC))

from vllm_fleet.lab import tinymodel  # noqa: E402

MARKER_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]

GEOMETRIES: dict[str, dict[str, Any]] = {
    "seed-dense": dict(
        model_type="qwen3",
        architectures=["Qwen3ForCausalLM"],
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=64,
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=262144,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
    ),
    "next-hybrid": dict(
        model_type="qwen3_next",
        architectures=["Qwen3NextForCausalLM"],
        hidden_size=512,
        intermediate_size=512,
        num_hidden_layers=48,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_value_heads=32,
        linear_num_key_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        full_attention_interval=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        max_position_embeddings=262144,
        rope_theta=10000000.0,
        partial_rotary_factor=0.25,
        rms_norm_eps=1e-6,
    ),
}


def tokenizer_files() -> tuple[dict[str, bytes], dict[str, int]]:
    """The tinymodel tokenizer files with MARKER_TOKENS added; returns the files and the special ids."""
    files = tinymodel.model_files()
    tok = json.loads(files["tokenizer.json"])
    next_id = max([*tok["model"]["vocab"].values(), *(t["id"] for t in tok["added_tokens"])]) + 1
    for i, token in enumerate(MARKER_TOKENS):
        tok["added_tokens"].append(
            {
                "id": next_id + i,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": False,
            }
        )
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    out = {name: files[name] for name in ("tokenizer_config.json", "special_tokens_map.json")}
    out["tokenizer.json"] = (json.dumps(tok, indent=2, ensure_ascii=False, sort_keys=True) + "\n").encode()
    gen = {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"], "do_sample": False}
    out["generation_config.json"] = (json.dumps(gen, indent=2) + "\n").encode()
    return out, ids


def vocab_size(ids: dict[str, int]) -> int:
    """Room for every token id, rounded up to 64 (embedding rows vLLM pads to anyway)."""
    return -(-(max(ids.values()) + 1) // 64) * 64


def build(out: Path, names: list[str]) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    files, ids = tokenizer_files()
    common = dict(
        vocab_size=vocab_size(ids),
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    for name in names:
        kw = dict(GEOMETRIES[name])
        model_type = kw.pop("model_type")
        cfg = AutoConfig.for_model(model_type, **kw, **common)
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        dest = out / name
        dest.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(dest, safe_serialization=True)
        for fname, data in files.items():
            (dest / fname).write_bytes(data)
        print(name, sum(p.numel() for p in model.parameters()), "params ->", dest, flush=True)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def dummy(out: Path, pairs: list[str]) -> None:
    """OUT/NAME/config.json (the released file, byte for byte) and the tokenizer, for --load-format dummy."""
    files, _ = tokenizer_files()
    for pair in pairs:
        name, _, config = pair.partition("=")
        dest = out / name
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "config.json").write_bytes(Path(config).read_bytes())
        for fname, data in files.items():
            if fname != "generation_config.json":  # the released config names its own token ids
                (dest / fname).write_bytes(data)
        print(name, "config", config, "->", dest, flush=True)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "--dummy":
        dummy(Path(argv[0]), argv[2:])
        return 0
    if not argv:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    names = argv[1:] or list(GEOMETRIES)
    unknown = [n for n in names if n not in GEOMETRIES]
    if unknown:
        print(f"gpu_models: unknown model(s) {unknown}; known: {sorted(GEOMETRIES)}", file=sys.stderr)
        return 2
    build(Path(argv[0]), names)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
