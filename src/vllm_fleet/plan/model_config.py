"""Where the model's config.json comes from at plan time, before anything is installed.

In order: `vllm_service_model_config` (a mapping, or a path on the controller, relative to the inventory), the
config.json read from the host (read-only) where the model is staged or pre-staged, a Hugging Face model's
config.json in the controller's hub cache. None of them: `({}, why)`, and the plan refuses every setting whose
check needs it (`vllm_fleet.plan.build.missing_model_config_errors`).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_fleet.errors import FleetInputError

VARIABLE = "vllm_service_model_config"


def _decode(text: str, embedded: bool) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        if not embedded:
            raise
        return json.JSONDecoder().raw_decode(text[text.find("{") :])[0]


def parse_model_config(text: str, where: str, *, embedded: bool = False) -> dict[str, Any]:
    """The model's config.json as a dict; `where` names it in the error. `embedded`: the first JSON object in
    other text is taken too (a config pasted into an issue, for `vllm-fleet plan --model-config`)."""
    if embedded and "{" not in text:
        raise FleetInputError(f"{where} holds no JSON object; give the model's config.json")
    try:
        data = _decode(text, embedded)
    except json.JSONDecodeError as exc:
        raise FleetInputError(
            f"{where} is not valid JSON ({exc.msg} at line {exc.lineno}); give the model's config.json"
        ) from exc
    if not isinstance(data, dict):
        raise FleetInputError(
            f"{where} holds a JSON {type(data).__name__}, not an object; give the model's config.json"
        )
    return data


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
        return dict(given), f"{VARIABLE} (inline mapping)"
    if isinstance(given, str) and given.strip():
        path = Path(given)
        if not path.is_absolute():
            path = Path(base_dir) / path
        if not path.is_file():
            raise FleetInputError(
                f"{VARIABLE}: {given!r} is not a file on the controller (looked at {path}); give the "
                "path of the model's config.json, absolute or relative to the inventory"
            )
        config = parse_model_config(path.read_text(encoding="utf-8"), f"{VARIABLE} {path}")
        return config, f"{VARIABLE}: {path}"
    if given not in (None, "", {}):
        raise FleetInputError(
            f"{VARIABLE}: {type(given).__name__} given; expected the config.json's path or its mapping"
        )
    if read_from_host and read_from_host.get("content"):
        where = f"the host's {read_from_host.get('path') or 'config.json'}"
        text = base64.b64decode(read_from_host["content"]).decode("utf-8")
        return parse_model_config(text, where), where
    if model and not model.startswith("/") and "/" in model:
        cached = hub_cached_config(model, cache_dir or hub_cache_dir())
        if cached is not None:
            return parse_model_config(cached.read_text(encoding="utf-8"), str(cached)), f"hub cache: {cached}"
    return {}, f"not found: no {VARIABLE}, no config.json where vllm_service_model points on the host"
