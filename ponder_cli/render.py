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


def render(rows: list[dict], columns: list[Column], fmt: OutputFormat | str, *, title: str | None = None,
           caption: str | None = None, single: bool = False, file: IO[str] | None = None) -> None:
    """Write rows to stdout. single: JSON is one object rather than an array of one."""
    fmt = OutputFormat(fmt)
    file = file or sys.stdout
    if fmt is OutputFormat.json:
        data = [{c.key: row.get(c.key) for c in columns} for row in rows]
        json.dump(data[0] if single else data, file, indent=2)
        file.write("\n")
    elif fmt is OutputFormat.csv:
        writer = csv.DictWriter(file, fieldnames=[c.key for c in columns], extrasaction="ignore",
                                lineterminator="\n")
        writer.writeheader()
        writer.writerows({c.key: ("" if row.get(c.key) is None else row.get(c.key)) for c in columns}
                         for row in rows)
    else:
        table = Table(title=title, caption=caption)
        for c in columns:
            table.add_column(c.header, justify="right")
        for row in rows:
            table.add_row(*(_cell(row.get(c.key), c.spec) for c in columns))
        Console(file=file).print(table)
