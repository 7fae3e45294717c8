"""Plain-text tables the CLI and the playbooks print (the fleet table, the load-test table)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def fmt(value: Any, scale: float = 1.0, digits: int = 0, suffix: str = "") -> str:
    """A cell: "-" for None, a number scaled and rounded with thousands separators, anything else as text."""
    if value is None:
        return "-"
    if isinstance(value, (int, float)):
        return f"{value * scale:,.{digits}f}{suffix}"
    return str(value)


def text_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The header, a rule and the rows, each column as wide as its widest cell, trailing blanks cut."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(columns)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(columns, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
    return lines
