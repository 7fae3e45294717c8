"""Pure functions over one log line: prefixes and colours off, numbers and stats fields read."""

from __future__ import annotations

from typing import Any

from vllm_fleet.verify.logcheck.patterns import (
    _ANSI,
    _BACKEND_CANONICAL,
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
    _SPEC_FIELDS,
    _SPEC_PER_POSITION,
    _SPEC_RATE_NEW,
    _SPEC_RATE_OLD,
    _SPEC_V0,
    _SPEC_V0_FIELDS,
    _SPEC_V1,
    _STATS_KEYS,
    _TRANSFER_FIELD,
)
from vllm_fleet.verify.logcheck.records import LogError


def _number(text: str) -> int | float | str:
    """`2048` -> 2048, `0.90` -> 0.9, anything else stays text."""
    if _INT_TEXT.fullmatch(text):
        return int(text)
    if _FLOAT_TEXT.fullmatch(text):
        return float(text)
    return text


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def clean_line(raw: str) -> str:
    """A log line without colour codes, journald / container prefixes and vLLM process tags.

    Each prefix regex runs only where a character it needs is in place (a journald date has a space at 3,
    an ISO date a dash at 4, a compose column a `|`, a process tag starts with `(`, `[` or a space): most
    lines need none of the four, and test_logcheck_reference checks these tests against the bare regexes.
    """
    line = (_ANSI.sub("", raw) if "\x1b" in raw else raw).rstrip("\r\n")
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
                result[key] = int(value) if key.endswith("_tokens") else float(value)
        rate = _SPEC_RATE_NEW.search(body) or _SPEC_RATE_OLD.search(body)
        result["avg_draft_acceptance_rate"] = float(rate.group("v")) if rate else None
        positions = _SPEC_PER_POSITION.search(body)
        result["per_position"] = [float(v) for v in positions.group("v").split(", ")] if positions else None
        result["line"] = line
        return result
    match = _SPEC_V0.search(line)
    if match:
        body = match.group("body")
        result = {"format": "v0"}
        rate = _SPEC_RATE_OLD.search(body)
        if rate:
            value = float(rate.group("v"))
            # V0 prints a 0-1 fraction; the report is in percent like V1's.
            result["avg_draft_acceptance_rate"] = value if rate.group("pct") else round(value * 100, 4)
        else:
            result["avg_draft_acceptance_rate"] = None
        for key, pattern in _SPEC_V0_FIELDS.items():
            found = pattern.search(body)
            if found:
                value = found.group("v")
                result[key] = float(value) if key == "system_efficiency" else int(value)
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
    stats["engine"] = int(digits) if digits.isdigit() else None
    stats["line"] = line
    return stats


def _stats_number(value: str, name: str) -> int | float | None:
    """`9.2 tokens/s` / `0 reqs` / `12.5%` -> the number (float for rates and percentages), else None."""
    text = value.split(" ", 1)[0].rstrip(".%")
    if not text or not text.replace(".", "", 1).isdigit():
        return None
    return float(text) if "." in text or name.endswith(("percent", "throughput")) else int(text)


def _car_reason(why: str) -> str:
    for needle, code in _CAR_REASONS:
        if needle in why:
            return code
    return why.strip()


def _transfer_fields(body: str) -> dict[str, int | float | str]:
    """`k=v, k=v` of a `KV Transfer metrics:` line (vLLM joins `reduce()`'s dict with ", ")."""
    return {m.group("k"): _number(m.group("v")) for m in _TRANSFER_FIELD.finditer(body)}


def _maxlen_values(error: LogError, whole: str) -> None:
    found = _MAXLEN_VALUES.search(whole)
    if found:
        error.values = {
            "max_model_len": int(found.group("len")),
            "needed_gib": float(found.group("need")),
            "available_gib": float(found.group("avail")),
            "estimated_max_model_len": int(found.group("est")) if found.group("est") else None,
        }
    found = _MAXLEN_V0_VALUES.search(whole)
    if found:
        error.values = {"max_model_len": int(found.group("len")), "kv_cache_tokens": int(found.group("cap"))}
