"""Results as a rich table, JSON or CSV on stdout. Knows nothing of torch."""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import dataclass
from enum import Enum
from typing import IO, Any

from rich.console import Console
from rich.table import Table


class OutputFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    spec: str = ""  # format spec for the table only; JSON and CSV keep full precision


def _cell(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, spec) if spec else str(value)


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """A histogram as one line of block characters (empty bins as spaces)."""
    top = max(values, default=0) or 1
    return "".join(" " if v <= 0 else SPARK[min(int(v / top * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)]
                   for v in values)


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return value


def render(rows: list[dict], columns: list[Column], fmt: OutputFormat | str, *, title: str | None = None,
           caption: str | None = None, single: bool = False, meta: dict | None = None,
           list_key: str = "buckets", file: IO[str] | None = None) -> None:
    """Write results to stdout.

    The table shows `columns`; JSON and CSV carry every key of every row at full precision
    (lists as JSON inside a CSV cell). JSON is an array of rows, one object when `single`, or
    `{**meta, list_key: rows}` when meta is given (merged into the object when `single`).
    """
    fmt = OutputFormat(fmt)
    file = file or sys.stdout
    if fmt is OutputFormat.json:
        if single:
            data: Any = {**rows[0], **(meta or {})}
        else:
            data = {**meta, list_key: rows} if meta is not None else rows
        json.dump(data, file, indent=2)
        file.write("\n")
    elif fmt is OutputFormat.csv:
        keys = list(dict.fromkeys(key for row in rows for key in row))
        writer = csv.DictWriter(file, fieldnames=keys, lineterminator="\n")
        writer.writeheader()
        writer.writerows({key: _csv_cell(row.get(key)) for key in keys} for row in rows)
    else:
        table = Table(title=title, caption=caption)
        cells = [[_cell(row.get(c.key), c.spec) for c in columns] for row in rows]
        for i, c in enumerate(columns):
            if c.spec == "s":  # text such as a sparkline: never wrapped or cut
                width = max((len(r[i]) for r in cells), default=0)
                table.add_column(c.header, justify="left", no_wrap=True, min_width=width)
            else:
                table.add_column(c.header, justify="right")
        for row_cells in cells:
            table.add_row(*row_cells)
        console = Console(file=file)
        if not console.is_terminal:
            console = Console(file=file, width=200)  # pipes and files: no wrapping at 80 columns
        console.print(table)
