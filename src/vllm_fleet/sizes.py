"""Byte sizes and human-readable integers, read the way vLLM reads them.

vLLM's own parser (`human_readable_int` in `vllm/utils/argparse_utils.py`, used by `--kv-cache-memory-bytes`,
`--max-model-len`, `--max-num-batched-tokens`) takes a plain integer or a number with ONE suffix letter:
lower case `k m g t` are decimal (10^3 ...) and may carry a fraction (`1.5g`); upper case `K M G T` are binary
(2^10 ...) and must be whole (`1.5G` is an error there). vllm-fleet accepts exactly that, plus the spelled-out
units people paste from logs and docs: `GiB`/`MiB`/`KiB`/`TiB` (binary) and `GB`/`MB`/`kB`/`TB` (decimal),
with an optional space and a fraction (`112.61 GiB`). Anything else is a FleetInputError naming the input.

    parse_size("10737418240") == parse_size("10GiB") == parse_size("10G") == 10 * 2**30
    parse_size("10g") == parse_size("10GB") == 10 * 10**9
    parse_human_int("32k") == 32000; parse_human_int("32K") == 32768     # vLLM's own semantics, nothing more
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from vllm_fleet.errors import FleetInputError

_VLLM_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_VLLM_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SPELLED = {
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_NUMBER = r"(?P<number>\d+(?:\.\d+)?)"
_VLLM_FORM = re.compile(_NUMBER + r"(?P<suffix>[kmgtKMGT])")
_SPELLED_FORM = re.compile(_NUMBER + r"\s*(?P<unit>[kKmMgGtT][iI]?[bB])")


def _describe(what: str) -> str:
    return what if what else "size"


def parse_human_int(value: int | str, what: str = "") -> int:
    """Read an integer exactly as vLLM's `human_readable_int` does (`32k`, `32K`, `8192`)."""
    if isinstance(value, bool):
        raise FleetInputError(
            f"{_describe(what)}: {value!r} is not a number; give an integer such as 8192 or 32k"
        )
    if isinstance(value, int):
        if value < 0:
            raise FleetInputError(f"{_describe(what)}: {value} is negative; give a positive integer")
        return value
    text = str(value).strip()
    match = _VLLM_FORM.fullmatch(text)
    if match:
        number, suffix = match.group("number"), match.group("suffix")
        if suffix in _VLLM_DECIMAL:
            return int(Decimal(number) * _VLLM_DECIMAL[suffix])
        if "." in number:
            raise FleetInputError(
                f"{_describe(what)}: {text!r} has a fraction with the binary suffix {suffix!r}, which vLLM "
                f"rejects; write it in a smaller unit or use the decimal suffix {suffix.lower()!r}"
            )
        return int(number) * _VLLM_BINARY[suffix]
    if re.fullmatch(r"\d+", text):
        return int(text)
    raise FleetInputError(
        f"{_describe(what)}: cannot read {text!r} as an integer; use digits (8192) or one vLLM suffix "
        "(k/m/g/t = 1000s, K/M/G/T = 1024s), e.g. 32k or 32K"
    )


def parse_size(value: int | str, what: str = "") -> int:
    """Read a byte size: vLLM's forms (`10G`, `10g`, `10737418240`) and spelled units (`10GiB`, `10GB`)."""
    if isinstance(value, str):
        text = value.strip()
        match = _SPELLED_FORM.fullmatch(text)
        if match:
            unit = match.group("unit").lower()
            try:
                number = Decimal(match.group("number"))
            except InvalidOperation as exc:  # pragma: no cover - the regex admits only digits
                raise FleetInputError(f"{_describe(what)}: cannot read {text!r}") from exc
            # A byte count is whole: round down, as vLLM's int(float(...)) does for `1.5g`.
            return int(number * _SPELLED[unit])
        if _VLLM_FORM.fullmatch(text) or re.fullmatch(r"\d+", text):
            return parse_human_int(text, what)
        raise FleetInputError(
            f"{_describe(what)}: cannot read {text!r} as a size; use bytes (10737418240), vLLM's suffixes "
            "(10G = 10 GiB, 10g = 10 GB) or a spelled unit (10GiB, 10GB)"
        )
    return parse_human_int(value, what)


def format_bytes(size: int) -> str:
    """Human-readable binary size: `10 GiB`, `51.55 GiB`, `512 B`."""
    if size < 0:
        return "-" + format_bytes(-size)
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor:
            value = size / factor
            text = f"{value:.2f}".rstrip("0").rstrip(".")
            return f"{text} {unit}"
    return f"{size} B"


def format_count(number: int) -> str:
    """An integer with thousands separators, as vLLM prints token counts (`1,048,576`)."""
    return f"{number:,}"
