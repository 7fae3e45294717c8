"""JSON files the controller writes (plans, probe facts, verify reports): whole or not at all; and read back
bounded (a file over MAX_INPUT_BYTES, nested past the parser or holding a non-finite number is refused)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_fleet.errors import FleetInputError

# The JSON and text files a command reads whole (plans, probe reports, recorded answers, vars, topology
# outputs) are kilobytes to a few megabytes; a bigger one is a mistake (a weights file, /dev/zero), refused
# before it fills memory.
MAX_INPUT_BYTES = 16 << 20


def write_json(path: str | os.PathLike[str], data: Mapping[str, Any]) -> Path:
    """`data` as indented JSON at `path` (folders created), through a temporary file and a rename, so a
    reader never sees half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(target)
    return target


def read_text(path: str | os.PathLike[str], what: str) -> str:
    """A text file, at most MAX_INPUT_BYTES read; a missing, unreadable or larger file is a FleetInputError
    naming `what` and the path (undecodable bytes are replaced)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise FleetInputError(f"{what}: cannot read {str(path)!r}: {exc.strerror}") from exc
    if len(data) > MAX_INPUT_BYTES:
        raise FleetInputError(
            f"{what}: {str(path)!r} is larger than {MAX_INPUT_BYTES >> 20} MiB, more than any file this "
            "option takes; check the path"
        )
    return data.decode("utf-8", errors="replace")


def read_json(path: str | os.PathLike[str], what: str, fix: str) -> Any:
    """The JSON value of a file (`read_text`); a file that is not JSON, is nested deeper than the parser
    follows or holds a number that is not finite is a FleetInputError naming `what`, the path and `fix`."""
    text = read_text(path, what)
    where = f"{what}: {str(path)!r}"
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise FleetInputError(f"{where} is not JSON ({exc.msg} at line {exc.lineno}); {fix}") from exc
    except RecursionError as exc:
        raise FleetInputError(f"{where} is nested deeper than a JSON parser follows; {fix}") from exc
    except ValueError as exc:  # NaN / Infinity / 1e999, or an integer of over 4,300 digits
        raise FleetInputError(f"{where} is not JSON a plan can hold ({exc}); {fix}") from exc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is not a finite number")
    return value
