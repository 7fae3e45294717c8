"""JSON files the controller writes (plans, probe facts, verify reports): whole or not at all."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_json(path: str | os.PathLike[str], data: Mapping[str, Any]) -> Path:
    """`data` as indented JSON at `path` (folders created), through a temporary file and a rename, so a
    reader never sees half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(target)
    return target
