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

from .registry import FORMATS


OutputFormat = Enum("OutputFormat", {name: name for name in FORMATS}, type=str)


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


def sparkline(values: list[float], width: int | None = None) -> str:
    """A histogram as one line of block characters (empty bins as spaces), at most `width`
    characters: longer histograms are merged into width bins of (nearly) equal size."""
    if width is not None and len(values) > width:
        edges = [round(i * len(values) / width) for i in range(width + 1)]
        values = [sum(values[a:b]) for a, b in zip(edges, edges[1:])]
    top = max(values, default=0) or 1
    return "".join(" " if v <= 0 else SPARK[min(int(v / top * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)]
                   for v in values)


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return value


def render_table(rows: list[dict], columns: list[Column], *, title: str | None = None,
                 caption: str | None = None, file: IO[str] | None = None) -> None:
    """A rich table of `columns`; text columns (spec "s") are never wrapped or cut."""
    file = file or sys.stdout
    table = Table(title=title, caption=caption)
    cells = [[_cell(row.get(c.key), c.spec) for c in columns] for row in rows]
    for i, c in enumerate(columns):
        if c.spec == "s":
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


def render_report(report, fmt: OutputFormat | str, file: IO[str] | None = None) -> None:
    """Write a reports.Report to stdout as a table, one JSON object, or CSV (one row per bucket)."""
    fmt = OutputFormat(fmt)
    file = file or sys.stdout
    if fmt is OutputFormat.json:
        json.dump(report.as_json(), file, indent=2)
        file.write("\n")
    elif fmt is OutputFormat.csv:
        rows = report.csv_rows()
        keys = list(dict.fromkeys(key for row in rows for key in row))
        writer = csv.DictWriter(file, fieldnames=keys, lineterminator="\n")
        writer.writeheader()
        writer.writerows({key: _csv_cell(row.get(key)) for key in keys} for row in rows)
    else:
        render_table(report.rows, report.columns, title=report.title, caption=report.caption or None, file=file)
        if report.detail is not None:
            title, rows, columns = report.detail
            render_table(rows, columns, title=title, file=file)
        if report.footer:
            file.write(report.footer + "\n")


def epoch_line(stats, epochs: int) -> str:
    """The per-epoch progress line of `ponder train` (stderr)."""
    return (f"epoch {stats.epoch:>2}/{epochs}  loss {stats.train_loss:.4f}  acc {stats.train_accuracy:.4f}  "
            f"steps {stats.train_steps:.2f}  |  val acc {stats.val_accuracy:.4f}  steps {stats.val_steps:.2f}  |  "
            f"lr {stats.lr:.0e}  {stats.seconds:.1f}s{'  *' if stats.improved else ''}"
            f"{f'  ({stats.skipped_batches} non-finite batches skipped)' if stats.skipped_batches else ''}")
