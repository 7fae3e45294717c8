"""JSON files the controller writes (plans, probe facts, verify reports): whole or not at all; and read back
bounded (a file over MAX_INPUT_BYTES, nested past the parser or holding a non-finite number is refused)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

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


def _matches(value: Any, hint: Any) -> bool:
    """Whether JSON-shaped `value` is of the annotated type `hint` (str, int, float, bool, None, Any, unions,
    list[X], tuple[X, ...], dict[K, V]); a float must be finite, a bool is no int."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return True
    if origin in (Union, UnionType):
        return any(_matches(value, arg) for arg in args)
    if hint is None or hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if origin in (list, tuple):
        return isinstance(value, list | tuple) and all(_matches(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, Mapping) and all(
            _matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items()
        )
    return isinstance(value, hint) if isinstance(hint, type) else True


def check_shape(values: Mapping[str, Any], hints: Mapping[str, Any], where: str, fix: str) -> None:
    """Every value of `values` whose key `hints` types is of that type (a JSON document read back: a plan,
    a rendered command, recorded answers); else a FleetInputError naming `where`, the key, the value and
    `fix`."""
    for key, hint in hints.items():
        if key in values and not _matches(values[key], hint):
            shown = repr(values[key])
            shown = shown if len(shown) <= 60 else shown[:40] + "..."
            kind = getattr(hint, "__name__", None) if get_origin(hint) is None else None
            raise FleetInputError(f"{where}: {key} = {shown} is not {kind or str(hint)}; {fix}")
