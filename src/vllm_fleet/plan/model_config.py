"""Where the model's config.json comes from at plan time, before anything is installed.

In order: `vllm_service_model_config` (a mapping, or a path on the controller, relative to the inventory), the
config.json read from the host (read-only) where the model is staged or pre-staged, a Hugging Face model's
config.json in the controller's hub cache. None of them: `({}, why)`, and the plan refuses every setting whose
check needs it (`vllm_fleet.plan.build.missing_model_config_errors`).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from vllm_fleet.errors import FleetInputError

VARIABLE = "vllm_service_model_config"
# A real config.json is a few kB (the largest multimodal ones, with their label maps, some 100 kB); beyond
# this it is not one, and reading /dev/zero or a weights file by mistake must end, not fill memory.
MAX_CONFIG_BYTES = 4 << 20
# Real configs are 3 or 4 levels deep (text_config.rope_scaling.mrope_section); json's C parser recurses.
MAX_CONFIG_DEPTH = 32
_LENGTHS = 1 << 32  # positions, windows: Llama 4 Scout's 10M context is far below
_WIDTHS = 1 << 16  # heads, head sizes, state sizes, conv kernels (the largest real ones are a few thousand)
# Every count a stage reads from a config.json (model.py, capacity.py): its upper bound, and whether 0 is a
# value the config may hold (a window of 0 is "none" in some configs; a head size of 0 never is).
COUNT_BOUNDS: dict[str, tuple[int, bool]] = {
    **dict.fromkeys(("num_hidden_layers", "num_layers", "n_layer"), (4096, False)),
    **dict.fromkeys(
        ("num_attention_heads", "n_head", "num_key_value_heads", "num_kv_heads"), (_WIDTHS, False)
    ),
    **dict.fromkeys(("head_dim", "v_head_dim", "qk_rope_head_dim", "qk_nope_head_dim"), (_WIDTHS, False)),
    "kv_lora_rank": (_WIDTHS, False),
    "hidden_size": (1 << 20, False),
    **dict.fromkeys(("max_position_embeddings", "original_max_position_embeddings"), (_LENGTHS, False)),
    **dict.fromkeys(("sliding_window", "attention_chunk_size"), (_LENGTHS, True)),
    **dict.fromkeys(
        ("sliding_window_pattern", "full_attention_interval", "attn_layer_period"), (4096, False)
    ),
    "attn_layer_offset": (4096, True),
    **dict.fromkeys(
        (
            "mamba_n_heads",
            "mamba_num_heads",
            "mamba_d_head",
            "mamba_head_dim",
            "mamba_d_state",
            "ssm_state_size",
            "mamba_n_groups",
            "mamba_d_conv",
            "mamba_chunk_size",
            "mamba_expand",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel_dim",
            "num_heads",
            "short_conv_kernel_size",
        ),
        (_WIDTHS, False),
    ),
    # generic names other models use for other things, where 0 may be meant
    **dict.fromkeys(("state_size", "n_groups", "conv_kernel", "chunk_size"), (_WIDTHS, True)),
}
# The sections whose keys the stages read: the top level, the language model's and these named maps.
_SECTIONS = ("text_config", "llm_config", "language_config")
_COUNTED_MAPS = ("rope_scaling", "rope_parameters", "linear_attn_config")
_RESCALE_LIMIT = 1024.0  # rope_scaling.factor: YaRN's real factors are 2 to 64


def _shown(value: Any) -> str:
    """A value for a message, cut to a readable length (a config may hold a 4,000-digit number)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:40] + f"... ({len(text)} characters)"


def read_model_config_file(path: str | os.PathLike[str], what: str) -> str:
    """A config.json's text, at most MAX_CONFIG_BYTES read (a device or a huge file is refused, not read);
    `what` (the flag or variable) and the path name it in the error."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise FleetInputError(f"{what}: cannot read {str(path)!r}: {exc.strerror}") from exc
    return _config_text(data, f"{what} {str(path)!r}")


def _config_text(data: bytes, where: str) -> str:
    if len(data) > MAX_CONFIG_BYTES:
        raise FleetInputError(
            f"{where} is larger than {MAX_CONFIG_BYTES >> 20} MiB, which no model's config.json is; give the "
            "config.json beside the weights"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FleetInputError(
            f"{where} is not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r}); give the "
            "model's config.json"
        ) from exc


def _decode(text: str, embedded: bool) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        if not embedded:
            raise
        return json.JSONDecoder().raw_decode(text[text.find("{") :])[0]


def parse_model_config(text: str, where: str, *, embedded: bool = False) -> dict[str, Any]:
    """The model's config.json as a dict, its counts checked (`check_model_config`); `where` names it in the
    error. `embedded`: the first JSON object in other text is taken too (a config pasted into an issue, for
    `vllm-fleet plan --model-config`)."""
    if len(text) > MAX_CONFIG_BYTES:
        raise FleetInputError(
            f"{where} is larger than {MAX_CONFIG_BYTES >> 20} MiB, which no model's config.json is; give the "
            "config.json beside the weights"
        )
    if embedded and "{" not in text:
        raise FleetInputError(f"{where} holds no JSON object; give the model's config.json")
    try:
        data = _decode(text, embedded)
    except json.JSONDecodeError as exc:
        raise FleetInputError(
            f"{where} is not valid JSON ({exc.msg} at line {exc.lineno}); give the model's config.json"
        ) from exc
    except RecursionError as exc:
        raise FleetInputError(
            f"{where} is nested deeper than a JSON parser follows; give the model's config.json"
        ) from exc
    except ValueError as exc:  # an integer of more than 4,300 digits (sys.int_info.default_max_str_digits)
        raise FleetInputError(f"{where} is not a config.json: {exc}") from exc
    if not isinstance(data, dict):
        raise FleetInputError(
            f"{where} holds a JSON {type(data).__name__}, not an object; give the model's config.json"
        )
    return check_model_config(data, where)


def _walk(config: dict[str, Any]) -> Iterator[tuple[str, Any, int]]:
    """(dotted key, value, depth) of everything in the config, without recursion."""
    stack: list[tuple[str, Any, int]] = [("", config, 0)]
    while stack:
        path, value, depth = stack.pop()
        yield path, value, depth
        if isinstance(value, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v, depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v, depth + 1) for i, v in enumerate(value))


def _check_count(where: str, key: str, value: Any, bound: int, zero_ok: bool) -> None:
    low = 0 if zero_ok else 1
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= bound:
        raise FleetInputError(
            f"{where}: {key} = {_shown(value)} is not a whole number from {low} to {bound:,}; fix the "
            "model's config.json (or give the one beside the weights)"
        )


def _check_section(where: str, prefix: str, section: dict[str, Any]) -> None:
    for key, value in section.items():
        if key in COUNT_BOUNDS and value is not None:
            _check_count(where, prefix + key, value, *COUNT_BOUNDS[key])
    for name in _COUNTED_MAPS:
        inner = section.get(name)
        if isinstance(inner, dict):
            for key, value in inner.items():
                if key in COUNT_BOUNDS and value is not None:
                    _check_count(where, f"{prefix}{name}.{key}", value, *COUNT_BOUNDS[key])
            factor = inner.get("factor")
            if factor is not None and (
                isinstance(factor, bool)
                or not isinstance(factor, int | float)
                or not 0 < factor <= _RESCALE_LIMIT
            ):
                raise FleetInputError(
                    f"{where}: {prefix}{name}.factor = {_shown(factor)} must be a number above 0 and at most "
                    f"{_RESCALE_LIMIT:g}; fix the model's config.json"
                )
    layers_key = next((k for k in ("num_hidden_layers", "num_layers", "n_layer") if k in section), "")
    layers = section.get(layers_key)
    layer_types = section.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or not all(isinstance(kind, str) for kind in layer_types):
            raise FleetInputError(
                f"{where}: {prefix}layer_types = {_shown(layer_types)} is not a list of layer kinds "
                "(strings); fix the model's config.json"
            )
        if isinstance(layers, int) and layer_types and len(layer_types) != layers:
            raise FleetInputError(
                f"{where}: {prefix}layer_types lists {len(layer_types):,} layers but {prefix}{layers_key} is "
                f"{layers}; fix the model's config.json (one kind per layer)"
            )
    pattern = section.get("hybrid_override_pattern")
    if pattern is not None and not isinstance(pattern, str):
        raise FleetInputError(
            f"{where}: {prefix}hybrid_override_pattern = {_shown(pattern)} is not a string of M * - E, "
            "one per layer; fix the model's config.json"
        )
    kda = section.get("linear_attn_config", {})
    kda_layers = kda.get("kda_layers") if isinstance(kda, dict) else None
    if kda_layers is not None:
        for index, number in enumerate(kda_layers if isinstance(kda_layers, list) else [kda_layers]):
            _check_count(where, f"{prefix}linear_attn_config.kda_layers[{index}]", number, 4096, False)


def check_model_config(config: dict[str, Any], where: str) -> dict[str, Any]:
    """The config itself once every number in it is finite, it is at most MAX_CONFIG_DEPTH deep, and every
    count the stages read (COUNT_BOUNDS, layer_types) is a whole number in its range; else a FleetInputError
    that names `where`, the key and the value. Run where a config enters: a file, a host's copy, a mapping."""
    for path, value, depth in _walk(config):
        if depth > MAX_CONFIG_DEPTH:
            raise FleetInputError(
                f"{where}: {path.split('[')[0][:80]} is nested more than {MAX_CONFIG_DEPTH} levels deep, "
                "which no model's config.json is; give the config.json beside the weights"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise FleetInputError(
                f"{where}: {path} = {value!r} is not a finite number; fix the model's config.json"
            )
    _check_section(where, "", config)
    for name in _SECTIONS:
        section = config.get(name)
        if isinstance(section, dict):
            _check_section(where, f"{name}.", section)
    return config


def hub_cache_dir() -> Path:
    """The controller's Hugging Face hub cache, as huggingface_hub finds it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    return home / "hub"


def hub_cached_config(repo_id: str, cache_dir: Path) -> Path | None:
    """`<cache>/models--ORG--NAME/snapshots/<rev>/config.json` of the revision `refs/main` names, else any."""
    repo = cache_dir / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        candidate = repo / "snapshots" / ref.read_text().strip() / "config.json"
        if candidate.is_file():
            return candidate
    found = sorted((repo / "snapshots").glob("*/config.json")) if repo.is_dir() else []
    return found[-1] if found else None


def model_config_from(
    given: Any,
    read_from_host: Mapping[str, Any] | None,
    *,
    base_dir: str | os.PathLike[str] = ".",
    model: str = "",
    cache_dir: Path | None = None,
) -> tuple[dict[str, Any], str]:
    """(config, where it came from); `read_from_host` is `{path, content}` of a slurp (content base64)."""
    if isinstance(given, Mapping) and given:
        return check_model_config(dict(given), f"{VARIABLE} (inline mapping)"), f"{VARIABLE} (inline mapping)"
    if isinstance(given, str) and given.strip():
        path = Path(given)
        if not path.is_absolute():
            path = Path(base_dir) / path
        if not path.is_file():
            raise FleetInputError(
                f"{VARIABLE}: {given!r} is not a file on the controller (looked at {path}); give the "
                "path of the model's config.json, absolute or relative to the inventory"
            )
        config = parse_model_config(read_model_config_file(path, VARIABLE), f"{VARIABLE} {path}")
        return config, f"{VARIABLE}: {path}"
    if given not in (None, "", {}):
        raise FleetInputError(
            f"{VARIABLE}: {type(given).__name__} given; expected the config.json's path or its mapping"
        )
    if read_from_host and read_from_host.get("content"):
        where = f"the host's {read_from_host.get('path') or 'config.json'}"
        try:
            data = base64.b64decode(read_from_host["content"], validate=True)
        except (binascii.Error, TypeError, ValueError) as exc:
            raise FleetInputError(f"{where}: the slurped content is not base64 ({exc})") from exc
        return parse_model_config(_config_text(data, where), where), where
    if model and not model.startswith("/") and "/" in model:
        cached = hub_cached_config(model, cache_dir or hub_cache_dir())
        if cached is not None:
            text = read_model_config_file(cached, "the hub cache's config.json")
            return parse_model_config(text, str(cached)), f"hub cache: {cached}"
    return {}, f"not found: no {VARIABLE}, no config.json where vllm_service_model points on the host"
