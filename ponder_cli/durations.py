"""Durations, read and written in one place, without torch (--time-limit is read before a
command runs): exact, as --time-limit takes them (90 -> "1m30s"); rough, for estimates (200 ->
"3 min"); ago, for a table's ages (10800 -> "3 h ago").
"""

from __future__ import annotations

import math
import re

from . import BadValue

UNITS = {"h": 3600, "m": 60, "s": 1}  # the exact form's


def parse(text: str, name: str = "--time-limit") -> float:
    """90s, 9m, 2h, 1h30m, 1.5h in seconds; a BadValue naming `name` otherwise."""
    spelled = str(text).strip().lower().replace(" ", "")
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)([hms])", spelled)
    if not spelled or "".join(number + unit for number, unit in parts) != spelled or \
            len({unit for _, unit in parts}) != len(parts):
        raise BadValue(f"{name} must be a duration such as 90s, 9m, 2h or 1h30m (got {text!r})")
    seconds = sum(float(number) * UNITS[unit] for number, unit in parts)
    if not 0 < seconds < math.inf:
        raise BadValue(f"{name} must be longer than 0 s (got {text!r})")
    return seconds


def exact(seconds: float) -> str:
    """Whole seconds as `parse` reads them back: 90 -> 1m30s, 540 -> 9m, 7200 -> 2h."""
    whole, text = round(seconds), ""
    for unit, size in UNITS.items():
        if whole >= size or (unit == "s" and not text):
            count, whole = divmod(whole, size)
            text += f"{count}{unit}" if count else ""
    return text or "0s"


def rough(seconds: float, tenths: bool = False) -> str:
    """45 s, 3 min, 1.5 h, 12 h; with `tenths`, 4.2 s under 10 s (where compared figures are close)."""
    if tenths and seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h" if seconds < 10 * 3600 else f"{round(seconds / 3600)} h"


def ago(seconds: float) -> str:
    """just now, 5 min ago, 3 h ago, 1 day ago, 9 days ago: whole units, cut down."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {'day' if unit == 'days' and count == 1 else unit} ago"
    return "just now"
