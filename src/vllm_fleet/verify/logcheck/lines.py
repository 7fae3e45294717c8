"""Pure functions over one log line: prefixes and colours off, numbers and stats fields read."""

from __future__ import annotations

import contextlib
import re
from typing import Any

from vllm_fleet.terminal import without_escapes
from vllm_fleet.verify.logcheck.patterns import (
    _BACKEND_CANONICAL,
    _BACKEND_NAME_WORDS,
    _CAR_DISABLED,
    _CAR_REASONS,
    _COMPOSE_PREFIX,
    _CONTINUATION_START,
    _FLOAT_TEXT,
    _FP8_SAME,
    _INT_TEXT,
    _ISO_PREFIX,
    _JOURNAL_PREFIX,
    _KV_TOKENS,
    _MAXLEN_V0_VALUES,
    _MAXLEN_VALUES,
    _PROCESS_PREFIX,
    _PYDANTIC_INPUT,
    _SPEC_FIELDS,
    _SPEC_PER_POSITION,
    _SPEC_RATE_NEW,
    _SPEC_RATE_OLD,
    _SPEC_V0,
    _SPEC_V0_FIELDS,
    _SPEC_V1,
    _STATS_KEYS,
    _TRANSFER_VALUE,
)
from vllm_fleet.verify.logcheck.records import LogError

MAX_DIGITS = 40  # a count or size vLLM prints has at most 20 digits; int() refuses over 4,300


class UnreadableNumber(ValueError):
    """A number in a log line that no vLLM prints (`1.2.3`, thousands of digits): the line says nothing."""


def _int(text: str) -> int:
    """`2,048` -> 2048; UnreadableNumber for anything that is not a plain run of ASCII digits (and commas)."""
    digits = text.replace(",", "")
    if not 0 < len(digits) <= MAX_DIGITS or not digits.isascii() or not digits.isdigit():
        raise UnreadableNumber(text[:MAX_DIGITS])
    return int(digits)


def _float(text: str) -> float:
    """`0.90` -> 0.9; UnreadableNumber for `1.2.3`, `...` or a number too long to be one vLLM printed."""
    try:
        if len(text) <= MAX_DIGITS:
            return float(text)
    except ValueError:
        pass
    raise UnreadableNumber(text[:MAX_DIGITS])


def _number(text: str) -> int | float | str:
    """`2048` -> 2048, `0.90` -> 0.9, anything else stays text."""
    try:
        if _INT_TEXT.fullmatch(text):
            return _int(text)
        if _FLOAT_TEXT.fullmatch(text):
            return _float(text)
    except UnreadableNumber:
        pass
    return text


def clean_line(raw: str) -> str:
    """A log line without colour codes, journald / container prefixes and vLLM process tags.

    Each prefix regex runs only where a character it needs is in place (a journald date has a space at 3,
    an ISO date a dash at 4, a compose column a `|`, a process tag starts with `(`, `[` or a space): most
    lines need none of the four, and test_logcheck_reference checks these tests against the bare regexes.
    """
    line = without_escapes(raw).rstrip("\r\n")
    # match + slice, not sub: each prefix regex is anchored (one match at most) and a slice is cheaper.
    if line[3:4] == " " and (found := _JOURNAL_PREFIX.match(line)):
        line = line[found.end() :]
    if line[4:5] == "-" and (found := _ISO_PREFIX.match(line)):
        line = line[found.end() :]
    if "|" in line and (found := _COMPOSE_PREFIX.match(line)):
        line = line[found.end() :]  # docker compose service column
    first = line[:1]
    if (first == "(" or first == "[" or first.isspace()) and (found := _PROCESS_PREFIX.match(line)):
        line = line[found.end() :]
    return line


def canonical_backend(name: str) -> str:
    """`Flash Attention` / `FLASH_ATTN` / `AttentionBackendEnum.FLASH_ATTN` -> `FLASH_ATTN`."""
    text = name.strip().split(".")[-1]
    return _BACKEND_CANONICAL.get(text.lower(), text.upper())


def canonical_kv_dtype(name: str) -> str:
    """fp8 is fp8_e4m3 on CUDA; everything else is compared as written."""
    text = name.strip().lower()
    return _FP8_SAME.get(text, text)


def _joined(lines: list[str], index: int) -> str:
    """The line plus continuation lines that a terminal or a paste hard-wrapped (no prefix, no level)."""
    text = lines[index]
    for follow in lines[index + 1 : index + 4]:
        if not follow or _CONTINUATION_START.match(follow) or _KV_TOKENS.search(follow):
            break
        text += follow
    return text


def _parse_spec(line: str) -> dict[str, Any] | None:
    match = _SPEC_V1.search(line)
    if match:
        body = match.group("body")
        result: dict[str, Any] = {"format": "v1"}
        for key, pattern in _SPEC_FIELDS.items():
            found = pattern.search(body)
            if found:
                value = found.group("v")
                result[key] = _int(value) if key.endswith("_tokens") else _float(value)
        rate = _SPEC_RATE_NEW.search(body) or _SPEC_RATE_OLD.search(body)
        result["avg_draft_acceptance_rate"] = _float(rate.group("v")) if rate else None
        positions = _SPEC_PER_POSITION.search(body)
        result["per_position"] = [_float(v) for v in positions.group("v").split(", ")] if positions else None
        result["line"] = line
        return result
    match = _SPEC_V0.search(line)
    if match:
        body = match.group("body")
        result = {"format": "v0"}
        rate = _SPEC_RATE_OLD.search(body)
        if rate:
            value = _float(rate.group("v"))
            # V0 prints a 0-1 fraction; the report is in percent like V1's.
            result["avg_draft_acceptance_rate"] = value if rate.group("pct") else round(value * 100, 4)
        else:
            result["avg_draft_acceptance_rate"] = None
        for key, pattern in _SPEC_V0_FIELDS.items():
            found = pattern.search(body)
            if found:
                value = found.group("v")
                result[key] = _float(value) if key == "system_efficiency" else _int(value)
        result["mean_acceptance_length"] = None
        result["per_position"] = None
        result["line"] = line
        return result
    return None


def _parse_stats(line: str) -> dict[str, Any] | None:
    """The periodic stats line, by its `Key: value` parts (plain string splits: the line comes every 10 s)."""
    start = line.find("Avg prompt throughput")
    if start == -1:
        return None
    stats: dict[str, Any] = {}
    for part in line[start:].split(", "):
        key, _, value = part.partition(": ")
        name = _STATS_KEYS.get(key)
        if name is None and key.endswith(" KV cache usage"):
            number = _stats_number(value, "kv_cache_usage_percent")
            if number is not None:
                if key.endswith("CPU KV cache usage"):
                    stats.setdefault("cpu_kv_cache_usage_percent", number)
                stats.setdefault("kv_cache_usage_percent", number)  # the first device (GPU) in V0's two
            continue
        if name is None or name in stats:
            continue
        number = _stats_number(value, name)
        if number is not None:
            stats[name] = number
    engine = line.find("Engine ")
    digits = line[engine + 7 : line.find(":", engine)] if engine != -1 else ""
    stats["engine"] = _int(digits) if digits.isascii() and digits.isdigit() and len(digits) < 9 else None
    stats["line"] = line
    return stats


def _stats_number(value: str, name: str) -> int | float | None:
    """`9.2 tokens/s` / `0 reqs` / `12.5%` -> the number (float for rates and percentages), else None."""
    text = value.split(" ", 1)[0].rstrip(".%")
    if not text or not text.replace(".", "", 1).isdigit():
        return None
    try:
        return _float(text) if "." in text or name.endswith(("percent", "throughput")) else _int(text)
    except UnreadableNumber:
        return None


def _car_reason(why: str) -> str:
    for needle, code in _CAR_REASONS:
        if needle in why:
            return code
    return why.strip()


def _transfer_fields(body: str) -> dict[str, int | float | str]:
    """`k=v, k=v` of a `KV Transfer metrics:` line (vLLM joins `reduce()`'s dict with ", "): a key is the
    text from the last field's end (or the last `=` whose value is no number) to the next `=`.

    The regex `(?P<k>[^=]+?)=...` said the same but tried the lazy key from every position: quadratic in a
    long line without `=`.
    """
    fields: dict[str, int | float | str] = {}
    start = 0
    while (equals := body.find("=", start)) != -1:
        value = _TRANSFER_VALUE.match(body, equals + 1)
        if value and equals > start:
            fields[body[start:equals]] = _number(value.group("v"))
            start = value.end()
        else:
            start = equals + 1
    return fields


def backend_name(match: re.Match[str]) -> bool:
    """Whether a `Using <NAME> backend.` match names an attention backend (a word of _BACKEND_NAME_WORDS
    after the name's first letter)."""
    name = match.group("n")[1:]
    return any(word in name for word in _BACKEND_NAME_WORDS)


def car_disabled_reason(line: str) -> str | None:
    """The reason of `Custom allreduce is disabled because <why>. To silence ...` (or to the line's end, one
    final dot and blanks off); None when the line does not say it is disabled."""
    found = _CAR_DISABLED.search(line)
    if found is None:
        return None
    rest = line[found.end() :]
    end = rest.rstrip()
    stop = len(end) - end.endswith(".")
    silence = rest.find(". To silence")
    return rest[: stop if silence == -1 else min(silence, stop)]


def without_pydantic_input(text: str) -> str:
    """pydantic's message without its echo of the input (` [type=value_error, input_value=...` to the end)."""
    found = _PYDANTIC_INPUT.search(text)
    return text if found is None else text[: found.start()].rstrip()


def _maxlen_values(error: LogError, whole: str) -> None:
    with contextlib.suppress(UnreadableNumber):
        _read_maxlen_values(error, whole)


def _read_maxlen_values(error: LogError, whole: str) -> None:
    found = _MAXLEN_VALUES.search(whole)
    if found:
        error.values = {
            "max_model_len": _int(found.group("len")),
            "needed_gib": _float(found.group("need")),
            "available_gib": _float(found.group("avail")),
            "estimated_max_model_len": _int(found.group("est")) if found.group("est") else None,
        }
    found = _MAXLEN_V0_VALUES.search(whole)
    if found:
        error.values = {
            "max_model_len": _int(found.group("len")),
            "kv_cache_tokens": _int(found.group("cap")),
        }
