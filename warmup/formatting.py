"""Plain-text formatting shared by the command line and the status page: durations, sizes, tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def format_duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def format_size(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


# How many characters of a job's id (or a key) are shown; the API takes a job id's unique prefix of 4 or more.
SHORT_ID = 8


def short_id(value: object) -> str:
    """The first characters of an id or key, as the status page and the command line show it."""
    return str(value)[:SHORT_ID]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: set[int] | None = None) -> str:
    """A plain-text table: columns padded to their widest cell, numbers right-aligned."""
    right = right or set()
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)
