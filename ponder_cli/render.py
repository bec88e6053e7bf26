"""Results as a rich table, JSON or CSV on stdout. Knows nothing of torch."""

from __future__ import annotations

import codecs
import csv
import errno
import io
import json
import math
import os
import sys
import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import IO, Any, Callable, Optional

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from .registry import FORMATS, TRAIN_FORMATS


OutputFormat = Enum("OutputFormat", {name: name for name in FORMATS}, type=str)
TrainFormat = Enum("TrainFormat", {name: name for name in TRAIN_FORMATS}, type=str)  # `ponder train`'s: + jsonl


def json_line(record: dict, file: IO[str] | None = None) -> None:
    """One strict JSON object on one line (`-f jsonl`), flushed at once for a pipeline to read."""
    file = file or sys.stdout
    file.write(json.dumps(strict_json(record), allow_nan=False, separators=(",", ":")) + "\n")
    file.flush()


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    spec: str = ""  # format spec for the table only; JSON and CSV keep full precision
    wrap: bool = False  # text that may wrap at its spaces to fit the terminal (never inside a figure)
    text: Optional[Callable[[dict], str]] = None  # the cell from the whole row (e.g. "mean ± sd"), for the table
    group: str = ""  # neighbouring columns of one group stay together when a wide table is split
    no_wrap: bool = False  # a cell that must stay on one line, spaces included (a sparkline)


def cell_text(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, spec) if spec else str(value)


SPARK = "▁▂▃▄▅▆▇█"
SPARK_ASCII = ".:-=+*#@"  # the same eight levels where the output's encoding has no block characters

# Our symbols as ASCII, for output whose encoding cannot hold them (PYTHONIOENCODING=ascii, a
# latin-1 locale): characters the encoding holds are kept, anything else not here becomes "?".
ASCII_SPELLINGS = {"±": "+-", "✓": "ok", "✗": "x", "ρ": "rho", "·": "-", "→": "->", "°": " deg", "–": "-",
                   "λ": "lambda", "≥": ">=", "≤": "<=", "²": "^2", "◀": "<", "★": "*", "§": "S", "…": "...",
                   "Σ": "sum", "×": "x", **dict(zip(SPARK, SPARK_ASCII))}
ASCII_ERRORS = "ponder_ascii"  # the codec error handler that spells them


def _spell_in_ascii(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    text = exc.object[exc.start:exc.end]
    return "".join(ASCII_SPELLINGS.get(char, "?") for char in text), exc.end


codecs.register_error(ASCII_ERRORS, _spell_in_ascii)


def spelling_for(stream: IO[str] | None) -> Callable[[str], str]:
    """How text is spelled for `stream`: unchanged in UTF-8, else in ASCII_SPELLINGS' terms."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        if codecs.lookup(encoding).name.startswith("utf"):
            return lambda text: text
    except LookupError:
        encoding = "ascii"
    return lambda text: text.encode(encoding, ASCII_ERRORS).decode(encoding)


def sparkline(values: list[float], width: int | None = None) -> str:
    """A histogram as one line of block characters (empty bins as spaces), merged into at most
    `width` bins of (nearly) equal size."""
    if width is not None and len(values) > width:
        edges = [round(i * len(values) / width) for i in range(width + 1)]
        values = [sum(values[a:b]) for a, b in zip(edges, edges[1:])]
    top = max(values, default=0) or 1
    return "".join(" " if v <= 0 else SPARK[min(int(v / top * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)]
                   for v in values)


def strict_json(value: Any) -> Any:
    """`value` with every NaN and ±inf as None, at any depth: strict JSON (JSON.parse refuses NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    return value


LIST_SEPARATOR = ";"  # between a CSV list cell's items: never the CSV's own comma, so `cut -d,` reads every column


def csv_cell(value: Any, inner: bool = False) -> Any:
    """A value as one CSV cell holding no comma of ours: a list's items joined by `;` (a list
    within one by spaces), a dict as `key=value` pairs joined by spaces, None as an empty cell;
    `inner`: a value within a list or dict, always text."""
    if isinstance(value, dict):
        return " ".join(f"{key}={csv_cell(item, True)}" for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return (" " if inner else LIST_SEPARATOR).join(csv_cell(item, True) for item in value)
    return "" if value is None else str(value) if inner else value


# A rich table with its default box and padding: one border and two spaces of padding around
# every column, and the closing border.
_COLUMN_OVERHEAD, _TABLE_OVERHEAD = 3, 1


def _table_width(widths: list[int]) -> int:
    return sum(widths) + _COLUMN_OVERHEAD * len(widths) + _TABLE_OVERHEAD


# A sign that belongs to the figure after it: a cell wraps before it, never after ("5.91" over
# "± 3.53", "5.76" over "/ 13.50"), so that no line ends in a sign cut off from its figure; and
# the separator of a list, which ends the line it wraps on ("pondernet ·" over "step mlp").
_GLUE, _SEPARATORS = ("±", "/"), ("·",)


def _units(line: str) -> list[str]:
    """A line's unbreakable pieces: its words, a sign (_GLUE) bound to the word after it, a
    separator to the word before it."""
    units: list[str] = []
    for word in line.split():
        if units and (units[-1] in _GLUE or word in _SEPARATORS):
            units[-1] += " " + word
        else:
            units.append(word)
    return units


def _words(text: str) -> int:
    """The width of the widest piece of `text` that may not be broken (_units)."""
    return max((cell_len(unit) for line in text.split("\n") for unit in _units(line)), default=0)


def wrap_text(text: str, width: int) -> str:
    """`text` wrapped at its spaces to `width`, never inside a piece (_units): one wider stands whole."""
    lines = []
    for line in text.split("\n"):
        current = ""
        for unit in _units(line):
            if current and cell_len(current) + 1 + cell_len(unit) > width:
                lines.append(current)
                current = unit
            else:
                current = f"{current} {unit}" if current else unit
        lines.append(current)
    return "\n".join(lines)


def _fit(natural: list[int], floors: list[list[int]], width: int) -> list[int]:
    """Narrow the widest columns that can wrap, a character at a time, until the table fits: each
    floor in turn (first only as far as their headers wrap, then into the cells)."""
    widths = list(natural)
    for floor in floors:
        while _table_width(widths) > width:
            slack = [i for i in range(len(widths)) if widths[i] > floor[i]]
            if not slack:
                break
            widths[max(slack, key=lambda i: widths[i])] -= 1
    return widths


def _chunks(columns: list[Column], narrowest: list[int], width: int) -> list[list[int]]:
    """The tables (column indices) a table too wide is split into: each repeats the first column
    and keeps groups together."""
    if _table_width(narrowest) <= width:
        return [list(range(len(columns)))]
    units: list[list[int]] = []
    for i in range(1, len(columns)):
        if units and columns[i].group and columns[i].group == columns[units[-1][-1]].group:
            units[-1].append(i)
        else:
            units.append([i])
    chunks, current = [], [0]
    for unit in units:
        if len(current) > 1 and _table_width([narrowest[i] for i in current + unit]) > width:
            chunks.append(current)
            current = [0]
        current = current + unit
    return chunks + [current]


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich would exit on its own here; what a reader leaving means is the CLI's to decide
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


PIPE_WIDTH = 80  # the output contract's width for a table that is not shown on a terminal


def render_table(rows: list[dict], columns: list[Column], *, title: str | None = None,
                 caption: str | None = None, file: IO[str] | None = None, width: int | None = None) -> None:
    """A rich table that fits the terminal with every figure whole: headers and wrap columns wrap at
    spaces; one that still does not fit is split into several, each repeating the first column."""
    # the one place that decides a table's width: `width`, else $COLUMNS, else the terminal's;
    # pipes and files get PIPE_WIDTH, the contract's; a COLUMNS that is no width (0, empty, text)
    # is unset: rich would print nothing
    environ = {key: value for key, value in os.environ.items()
               if key != "COLUMNS" or (value.strip().isdigit() and int(value) > 0)}
    console = _Console(file=file or sys.stdout, width=width, _environ=environ)
    if width is None and not console.is_terminal and "COLUMNS" not in environ:
        console.width = PIPE_WIDTH
    width = console.width
    spell = spelling_for(console.file)  # before the widths are measured, so that the columns line up
    cells = [[spell(c.text(row) if c.text else cell_text(row.get(c.key), c.spec)) for c in columns] for row in rows]
    columns = [dataclasses.replace(c, header=spell(c.header)) for c in columns]
    title, caption = (spell(title) if title else title), (spell(caption) if caption else caption)
    # each column's widest cell, natural width and narrowest (only headers and wrap columns wrap,
    # at their spaces)
    widest = [max((cell_len(row[i]) for row in cells), default=0) for i in range(len(columns))]
    natural = [max(longest, cell_len(c.header)) for longest, c in zip(widest, columns)]
    narrowest = [max(max((_words(row[i]) for row in cells), default=0) if c.wrap else widest[i],
                     cell_len(c.header) if c.no_wrap else _words(c.header)) for i, c in enumerate(columns)]
    chunks = _chunks(columns, narrowest, width)
    for n, chunk in enumerate(chunks):
        part_title = title if n == 0 or title is None else f"{title} (continued)"
        widths = _fit([natural[i] for i in chunk], [[max(widest[i], narrowest[i]) for i in chunk],
                                                    [narrowest[i] for i in chunk]], width)
        needed = _table_width(widths)
        if part_title is not None and cell_len(part_title) > needed:
            # wider than the table, which would break it mid-word (a checkpoint's path): a line of
            # its own, wrapped at spaces only where the terminal is too narrow for it, a word wider
            # than the terminal left whole for the terminal to wrap
            for line in wrap_text(part_title, width).split("\n"):
                console.print(line, soft_wrap=True, highlight=False, markup=False)
            part_title = None
        # the caption wrapped as the cells are, to the table's width
        part_caption = wrap_text(caption, needed) if caption and n == len(chunks) - 1 else None
        table = Table(title=part_title, caption=part_caption,
                      show_header=any(c.header for c in columns))  # a table of facts needs no header row
        for i, w in zip(chunk, widths):
            c = columns[i]
            # headers and wrap columns are wrapped here, at spaces and never inside a piece
            # (wrap_text), rather than by rich, which would end a line in "±" or split a path
            table.add_column(c.header if c.no_wrap else wrap_text(c.header, w), width=w, no_wrap=c.no_wrap,
                             justify="left" if c.spec == "s" or c.text is not None else "right", overflow="fold")
        for row in cells:
            table.add_row(*(wrap_text(row[i], w) if columns[i].wrap else row[i] for i, w in zip(chunk, widths)))
        # a table whose unbreakable cells (a model's name, a figure) are wider than the terminal
        # even split is printed wider, for the terminal to wrap whole lines: rich would otherwise
        # squeeze it and break a name to type mid-word
        console.width = max(needed, width)
        console.print(table)
        console.width = width


def render_report(report, fmt: OutputFormat | str, file: IO[str] | None = None, width: int | None = None) -> None:
    """A reports.Report on stdout as a table, one JSON object or CSV (a row per bucket); jsonl
    (`ponder train`'s): the object on one line, `"record": "report"`, after the epochs'."""
    file = file or sys.stdout
    if getattr(fmt, "value", fmt) == "jsonl":
        document = report.as_json()
        json_line({"format_version": document.pop("format_version"), "record": "report", **document}, file)
        return
    fmt = OutputFormat(fmt)
    if fmt is OutputFormat.json:
        # strict JSON (RFC 8259), which has no NaN or Infinity: a non-finite figure (a model
        # with NaN weights) is null; ASCII whatever the text: JSON escapes the rest
        json.dump(strict_json(report.as_json()), file, indent=2, allow_nan=False)
        file.write("\n")
    elif fmt is OutputFormat.csv:
        rows = report.csv_rows()
        # no buckets (`ponder runs` before any run): the header of the metadata alone, not a blank line
        keys = list(dict.fromkeys(key for row in rows for key in row)) or \
            [key for key, value in report.meta.items() if not isinstance(value, dict)]
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=keys, lineterminator="\n")
        writer.writeheader()
        writer.writerows({key: csv_cell(row.get(key)) for key in keys} for row in rows)
        file.write(spelling_for(file)(text.getvalue()))
    else:
        if report.rows or not report.footer:  # a table of no rows says less than its footer alone
            render_table(report.rows, report.columns, title=report.title, caption=report.caption or None,
                         file=file, width=width)
        for extra in (report.controls, report.detail):  # tables of their own: title, rows, columns (, caption)
            if extra is not None:
                title, rows, columns, *caption = extra
                render_table(rows, columns, title=title, caption=caption[0] if caption else None, file=file, width=width)
        if report.footer:
            file.write(spelling_for(file)(report.footer) + "\n")


def epoch_line(stats, epochs: int) -> str:
    return (f"epoch {stats.epoch:>2}/{epochs}  loss {stats.train_loss:.4f}  acc {stats.train_accuracy:.4f}  "
            f"steps {stats.train_steps:.2f}  |  val acc {stats.val_accuracy:.4f}  steps {stats.val_steps:.2f}  |  "
            f"lr {stats.lr:.0e}  {stats.seconds:.1f}s{'  *' if stats.improved else ''}"
            f"{f'  ({stats.skipped_batches} non-finite batches skipped)' if stats.skipped_batches else ''}"
            # fp16 overflows the GradScaler absorbed by lowering its scale: normal, not lost data
            f"{f'  ({stats.scaler_backoffs} fp16 back-offs)' if stats.scaler_backoffs else ''}")


def value_text(value: Any) -> str:
    """A config value as the user would type it: 0.001, 12, state+turn, none."""
    if value is None:
        return "none"
    if value == "":  # an empty text setting as a file or the shell spells it
        return '""'
    return f"{value:g}" if isinstance(value, float) else str(value)


def config_lines(values: dict, sources: dict, shown: list[str], width: int = 80) -> list[str]:
    """The configuration `ponder train` states on stderr, grouped by where each value came from,
    as `max-steps 12` items wrapped at `width` columns."""
    groups: dict[str, list[str]] = {}
    for name in shown:  # `max-steps 12`; a switch as its flag: `gru-layer-norm`, `no-gru-layer-norm`
        option, value = name.replace("_", "-"), values[name]
        item = (option if value else f"no-{option}") if isinstance(value, bool) else f"{option} {value_text(value)}"
        groups.setdefault(sources[name], []).append(item)
    order = sorted(groups, key=lambda source: (source != "given", source == "default", source))
    lines = ["configuration:"]
    for source in order:
        label = {"default": "defaults", "checkpoint": "from the checkpoint"}.get(source, source)
        line = f"  {label}: "
        for i, item in enumerate(groups[source]):
            piece = item if i == 0 else f" · {item}"
            if i and cell_len(line + piece) > width:
                lines.append(line)
                line, piece = "    ", item
            line += piece
        lines.append(line)
    return lines
