"""One reader of a model's config.json: what every stage needs to know about the model's shape.

    ModelInfo.from_config(config: dict, source="model config") -> ModelInfo

Multimodal wrappers nest the language model under `text_config` (or `llm_config` / `language_config`); its
keys win over the top level. Layer kinds, one per layer: `full`, `sliding` (sliding-window attention),
`chunked` (chunked-local attention: Llama 4's RoPE layers), `linear` (Gated DeltaNet, Qwen3-Next /
Qwen3.5), `mamba` (Mamba-2: Nemotron-H, Granite-4.0-H),
`mamba1` (Jamba), `kda` (Kimi Delta Attention), `short_conv` (LFM2). Bad or missing fields raise a
FleetInputError naming the field and the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.model_config import check_model_config

# layer_types values (transformers' names, and each family's own) -> the planner's kind
_LAYER_TYPES = {
    "full_attention": "full",
    "attention": "full",
    "global": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
    "local": "sliding",
    "linear_attention": "linear",
    "gated_delta_net": "linear",
    "linear": "linear",
    "mamba": "mamba",
    "mamba2": "mamba",
    "conv": "short_conv",
    "short_conv": "short_conv",
    "kda": "kda",
}
_NEMOTRON_H = {"M": "mamba", "*": "full", "-": None, "E": None}  # '-' MLP, 'E' MoE: no cache
NON_ATTENTION_KINDS = ("linear", "mamba", "mamba1", "kda", "short_conv")


def _int(cfg: dict[str, Any], names: tuple[str, ...], source: str, default: int | None = None) -> int:
    for name in names:
        value = cfg.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise FleetInputError(
                f"{source}: {name} = {value!r} is not a positive integer; fix the config.json"
            )
        return value
    if default is not None:
        return default
    raise FleetInputError(
        f"{source}: no {' / '.join(names)} in the model's config.json (nor in its text_config); give the "
        "config.json of the model itself (the one beside the weights)"
    )


def with_hf_overrides(config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The config.json vLLM sizes after `--hf-overrides` (vllm_service_hf_overrides): each key replaces the
    config's, a dict merges into a nested section (`{"text_config": {"sliding_window": 512}}`), as vLLM's
    ModelConfig applies the overrides to the loaded config before it builds the KV-cache specs."""
    merged = dict(config)
    for key, value in overrides.items():
        current = merged.get(key)
        if isinstance(value, dict) and isinstance(current, dict):
            merged[key] = with_hf_overrides(current, value)
        else:
            merged[key] = value
    return merged


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Top-level keys overlaid by the language model's own section (multimodal wrappers nest it)."""
    merged = {key: value for key, value in config.items() if not isinstance(value, dict)}
    for key in ("rope_scaling", "rope_parameters", "linear_attn_config", "quantization_config"):
        if isinstance(config.get(key), dict):
            merged[key] = config[key]
    for nested in ("text_config", "llm_config", "language_config"):
        section = config.get(nested)
        if isinstance(section, dict):
            merged.update(section)
            break
    return merged


def _layer_kinds(cfg: dict[str, Any], num_layers: int, source: str) -> tuple[tuple[str, ...], list[str]]:
    notes: list[str] = []
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        if len(layer_types) != num_layers:
            raise FleetInputError(
                f"{source}: layer_types lists {len(layer_types)} layers but num_hidden_layers is "
                f"{num_layers}; fix the config.json"
            )
        kinds = []
        for index, kind in enumerate(layer_types):
            text = str(kind)
            mapped = _LAYER_TYPES.get(text)
            if mapped is None and "sliding" in text:
                mapped = "sliding"
            elif mapped is None and text.endswith("attention"):
                mapped = "full"
            if mapped is None:
                raise FleetInputError(
                    f"{source}: layer_types[{index}] = {text!r} is not a layer kind the planner knows "
                    f"({', '.join(sorted(_LAYER_TYPES))})"
                )
            kinds.append(mapped)
        notes.append("layer kinds from layer_types")
        return tuple(kinds), notes
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        if len(pattern) != num_layers or set(pattern) - set(_NEMOTRON_H):
            raise FleetInputError(
                f"{source}: hybrid_override_pattern {pattern!r} must have one of M * - E per layer "
                f"({num_layers} layers); fix the config.json"
            )
        notes.append(
            "layer kinds from hybrid_override_pattern (M mamba, * attention; MLP layers hold no cache)"
        )
        return tuple(k for k in (_NEMOTRON_H[c] for c in pattern) if k), notes
    if cfg.get("model_type") == "falcon_h1":
        # A parallel hybrid: every decoder layer holds an attention AND a Mamba-2 mixer, each with its own
        # cache (vLLM 0.26 falcon_h1.py: FalconH1ParallelHybrid), so the cache has 2 x num_layers layers.
        notes.append("Falcon-H1: every layer has attention and Mamba-2 side by side")
        return ("full",) * num_layers + ("mamba",) * num_layers, notes
    period, offset = cfg.get("attn_layer_period"), cfg.get("attn_layer_offset")
    if isinstance(period, int) and isinstance(offset, int) and period > 0:
        notes.append(f"Jamba: attention every {period} layers from layer {offset}, Mamba elsewhere")
        return tuple("full" if i % period == offset else "mamba1" for i in range(num_layers)), notes
    linear_attn = cfg.get("linear_attn_config")
    if isinstance(linear_attn, dict) and isinstance(linear_attn.get("kda_layers"), list):
        kda = {int(i) - 1 for i in linear_attn["kda_layers"]}  # Kimi-Linear numbers layers from 1
        notes.append("Kimi-Linear: KDA layers from linear_attn_config.kda_layers, MLA elsewhere")
        return tuple("kda" if i in kda else "full" for i in range(num_layers)), notes
    interval = cfg.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0 and any(k.startswith("linear_") for k in cfg):
        notes.append(f"every {interval}th layer is full attention (full_attention_interval)")
        return tuple("full" if (i + 1) % interval == 0 else "linear" for i in range(num_layers)), notes
    chunk = cfg.get("attention_chunk_size")
    if isinstance(chunk, int) and chunk > 0 and str(cfg.get("model_type", "")).startswith("llama4"):
        return _llama4_kinds(cfg, num_layers), [
            "Llama 4: chunked-local attention, except the NoPE layers (no_rope_layers 0), which are global"
        ]
    window = cfg.get("sliding_window")
    if isinstance(window, int) and window > 0 and cfg.get("use_sliding_window", True) is not False:
        every = cfg.get("sliding_window_pattern")
        if isinstance(every, int) and every > 1:
            notes.append(f"every {every}th layer is full attention (sliding_window_pattern)")
            return tuple("full" if (i + 1) % every == 0 else "sliding" for i in range(num_layers)), notes
        if str(cfg.get("model_type", "")).startswith("gemma2"):
            notes.append("Gemma-2 alternates sliding and full layers")
            return tuple("sliding" if i % 2 == 0 else "full" for i in range(num_layers)), notes
        notes.append(f"every layer uses a sliding window of {window}")
        return ("sliding",) * num_layers, notes
    return ("full",) * num_layers, notes


def _llama4_kinds(cfg: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    """vLLM's llama4.py: a layer is chunked-local unless `no_rope_layers[i] == 0` (NoPE, global attention);
    transformers' Llama4TextConfig fills an empty no_rope_layers with every no_rope_layer_interval-th (4)
    layer NoPE."""
    nope = cfg.get("no_rope_layers")
    if not (isinstance(nope, list) and len(nope) == num_layers):
        interval = cfg.get("no_rope_layer_interval")
        interval = interval if isinstance(interval, int) and interval > 0 else 4
        nope = [int((i + 1) % interval != 0) for i in range(num_layers)]
    return tuple("full" if flag == 0 else "chunked" for flag in nope)


def _position_limit(cfg: dict[str, Any]) -> int | None:
    """The longest context the checkpoint supports as configured (YaRN: original × factor)."""
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if isinstance(rope, dict):
        factor = rope.get("factor")
        original = rope.get("original_max_position_embeddings")
        if isinstance(factor, int | float) and isinstance(original, int) and factor > 0:
            return int(original * factor)
    limit = cfg.get("max_position_embeddings")
    return limit if isinstance(limit, int) and limit > 0 else None


@dataclass(frozen=True)
class ModelInfo:
    """A model's shape as vLLM sees it (the language model's section of its config.json)."""

    model_type: str
    architectures: tuple[str, ...]
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    hidden_size: int | None
    layer_kinds: tuple[str, ...]
    sliding_window: int | None
    mla_kv_lora_rank: int | None
    mla_rope_head_dim: int | None
    max_position_embeddings: int | None
    position_limit: int | None  # max_position_embeddings, or YaRN's original × factor
    rope_scaling: dict[str, Any] | None
    torch_dtype: str
    attention_sinks: bool  # gpt-oss: one learned sink per head (no per-token cache)
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)  # the merged text config
    notes: tuple[str, ...] = ()
    attention_chunk_size: int | None = None  # chunked-local layers' chunk (Llama 4)

    @property
    def is_mla(self) -> bool:
        return self.mla_kv_lora_rank is not None

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(self.layer_kinds)

    @property
    def is_hybrid(self) -> bool:
        return bool(self.kinds & set(NON_ATTENTION_KINDS))

    def count(self, kind: str) -> int:
        return self.layer_kinds.count(kind)

    @classmethod
    def from_config(cls, config: dict[str, Any], source: str = "model config") -> ModelInfo:
        if not isinstance(config, dict):
            raise FleetInputError(
                f"{source}: expected a JSON object (the model's config.json), got {type(config)}"
            )
        cfg = text_config(check_model_config(config, source))
        num_layers = _int(cfg, ("num_hidden_layers", "num_layers", "n_layer"), source)
        heads = _int(cfg, ("num_attention_heads", "n_head"), source)
        kv_heads = _int(cfg, ("num_key_value_heads", "num_kv_heads"), source, default=heads)
        hidden = cfg.get("hidden_size")
        head_default = hidden // heads if isinstance(hidden, int) and hidden > 0 else None
        if head_default is None and cfg.get("head_dim") is None:
            raise FleetInputError(
                f"{source}: neither head_dim nor hidden_size in the model's config.json, so the KV head size "
                "is unknown; give the config.json of the model itself (the one beside the weights)"
            )
        head_dim = _int(cfg, ("head_dim",), source, default=head_default)
        kv_lora_rank = cfg.get("kv_lora_rank")
        rope_dim = None
        if kv_lora_rank is not None:
            kv_lora_rank = _int(cfg, ("kv_lora_rank",), source)
            rope_dim = _int(cfg, ("qk_rope_head_dim",), source)
            kv_heads = 1
        kinds, notes = _layer_kinds(cfg, num_layers, source)
        window = cfg.get("sliding_window") if "sliding" in kinds else None
        chunk = cfg.get("attention_chunk_size") if "chunked" in kinds else None
        rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
        dtype = cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype") or "bfloat16"
        arch = config.get("architectures") or cfg.get("architectures") or ()
        position = cfg.get("max_position_embeddings")
        return cls(
            model_type=str(cfg.get("model_type") or config.get("model_type") or "unknown"),
            architectures=tuple(str(a) for a in arch) if isinstance(arch, list) else (),
            num_layers=num_layers,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            v_head_dim=head_dim,
            hidden_size=hidden if isinstance(hidden, int) else None,
            layer_kinds=kinds,
            sliding_window=window if isinstance(window, int) else None,
            mla_kv_lora_rank=kv_lora_rank,
            mla_rope_head_dim=rope_dim,
            max_position_embeddings=position if isinstance(position, int) and position > 0 else None,
            position_limit=_position_limit(cfg),
            rope_scaling=rope if isinstance(rope, dict) else None,
            torch_dtype=str(dtype),
            attention_sinks=str(cfg.get("model_type", "")) == "gpt_oss",
            raw=cfg,
            notes=tuple(notes),
            attention_chunk_size=chunk if isinstance(chunk, int) and chunk > 0 else None,
        )


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FleetInputError(f"{name}: {value!r} is not a positive whole number; give e.g. 1, 2, 4 or 8")
    return value


def divisors(number: int) -> list[int]:
    """The divisors of a positive number in order, in O(sqrt(number)) steps (not one per head)."""
    small = [d for d in range(1, math.isqrt(number) + 1) if number % d == 0]
    return small + [number // d for d in reversed(small) if d * d != number]


def check_heads(
    tensor_parallel_size: int, num_attention_heads: int | None, num_key_value_heads: int | None
) -> list[str]:
    """vLLM's own divisibility rules for tensor parallelism; returns the explanation, raises when "
    "impossible."""
    tp = tensor_parallel_size
    reasons: list[str] = []
    if num_attention_heads is not None:
        heads = _positive(num_attention_heads, "num_attention_heads")
        if heads % tp:
            options = divisors(heads)
            raise FleetInputError(
                f"tensor_parallel_size: {tp} does not divide the model's num_attention_heads ({heads}); vLLM "
                f"refuses to start. Choose a tensor_parallel_size among {options}"
            )
        reasons.append(f"TP{tp} divides the model's {heads} attention heads: {heads // tp} per GPU.")
    if num_key_value_heads is not None:
        kv = _positive(num_key_value_heads, "num_key_value_heads")
        if kv >= tp and kv % tp:
            raise FleetInputError(
                f"tensor_parallel_size: {tp} does not divide the model's num_key_value_heads ({kv}); vLLM "
                f"cannot "
                f"split the KV heads evenly. Choose a tensor_parallel_size that divides {kv}"
            )
        if kv < tp and tp % kv:
            raise FleetInputError(
                f"tensor_parallel_size: {tp} is above the model's num_key_value_heads ({kv}) and not a "
                f"multiple "
                f"of it; vLLM can only replicate KV heads a whole number of times. Choose a multiple of {kv}"
            )
        if kv >= tp:
            reasons.append(f"Each GPU holds {kv // tp} of the model's {kv} KV heads.")
        else:
            reasons.append(
                f"The model has only {kv} KV heads for TP{tp}: vLLM replicates each KV head on {tp // kv} "
                f"GPUs, "
                f"so every GPU stores one KV head and the instance's KV cache per token is {tp // kv}x what "
                "the model alone would need."
            )
    return reasons
