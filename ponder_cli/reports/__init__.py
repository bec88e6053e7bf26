"""What every command reports, as plain data (no torch), and the one output contract: every
command's JSON is one object with the metadata keys `META_KEYS` and a `buckets` array; its CSV
one row per bucket with the metadata as columns. A task names its buckets through its TaskView."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from ..registry import FORMAT_VERSION
from ..render import Column

# device: what the figures were computed on ("cpu", "cuda:0"); null where nothing was (info, models, runs)
META_KEYS = ("command", "task", "checkpoints", "method", "step", "protocol", "halting", "seed", "device")


@dataclass
class Report:
    meta: dict  # META_KEYS first, then anything command-specific (spearman, train_rotation, ...)
    buckets: list[dict]
    columns: list[Column]  # what the table shows of each bucket
    title: str
    caption: str = ""
    detail: Optional[tuple[str, list[dict], list[Column]]] = None  # a second table: title, rows, columns
    controls: Optional[tuple[str, list[dict], list[Column], str]] = None  # one more: title, rows, columns, caption
    footer: str = ""  # a line after the table (table format only)
    plot_series: dict[str, list[dict]] = field(default_factory=dict)  # label -> buckets, for --plot
    table_rows: Optional[list[dict]] = None  # what the table shows, when not the buckets
    plot_kind: str = "buckets"  # plot.py's figure for this report
    keys: Optional[list[str]] = None  # the buckets' keys in one order, for CSV's columns (None: as they come)

    @property
    def rows(self) -> list[dict]:
        return self.buckets if self.table_rows is None else self.table_rows

    def as_json(self) -> dict:
        return {"format_version": FORMAT_VERSION, **self.meta, "buckets": self.buckets}

    def csv_rows(self) -> list[dict]:
        scalars = {k: v for k, v in self.meta.items() if not isinstance(v, dict)}
        if self.keys is not None:  # every row's cells in one order, a key a bucket lacks left empty
            return [{**scalars, **{key: bucket.get(key) for key in self.keys}} for bucket in self.buckets]
        return [{**scalars, **bucket} for bucket in self.buckets]


def make_meta(command: str, checkpoints: list[str], methods: list[str], steps: list[str], *,
              protocol: Optional[str], halting: Optional[str], seed: Optional[int], task: str, **extra) -> dict:
    """The shared metadata; method and step null where the checkpoints differ in them (each bucket
    then carries its own); device set by the api function that computed the figures."""
    def one(values):
        return values[0] if len(set(values)) == 1 else None
    return {"command": command, "task": task, "checkpoints": checkpoints, "method": one(methods),
            "step": one(steps), "protocol": protocol, "halting": halting, "seed": seed, "device": None, **extra}


@dataclass(frozen=True)
class Terms:
    """How a task names its buckets and inputs in tables, captions and JSON."""
    key: str  # the bucket's difficulty key in JSON and the table ("rotation", "counts")
    header: str  # its table column
    spec: str
    difficulty: str  # in "Spearman ρ(..., steps)"
    between: str  # the JSON's words for the same
    inputs: str  # "images", "vectors"
    test_set: str  # what eval measures on
    label: Callable[[dict], str]  # a bucket's name in headers: "±45°", "counts 1-16"
    # sweep: the bucket key on the x axis, its header, the slope's scale and unit, the fit's
    # JSON key and the sweep's name
    sweep_key: str
    sweep_header: str
    sweep_scale: float
    sweep_unit: str
    sweep_fit: str
    sweep_name: str


@dataclass(frozen=True)
class TaskView:
    """What reports say of a run's task (built by the task from the run's config)."""
    name: str
    terms: Terms
    meta: dict  # what it adds to the metadata (MNIST: train_rotation; parity: elems, train_counts)
    trained_on: str  # how captions name the training data
    protocol: Optional[str] = "uniform"
    named_in_titles: bool = True  # not the default task's: "pondernet training (step mlp)"


def band_text(bucket: dict, unit: str = "") -> str:
    """A bucket covering a band of difficulty (MNIST's band protocol) as its edges: `45–90`."""
    return "{:g}–{:g}".format(*bucket["band"]) + unit


def key_column(words: Terms, buckets: list[dict]) -> Column:
    """The column that names each bucket: its difficulty, or its band's edges (under the exact
    difficulty's header, |angle|: the row's |rotation| lies between them)."""
    if any(bucket.get("band") for bucket in buckets):
        return Column(words.key, words.sweep_header, text=lambda row: band_text(row) if row.get("band") else "")
    return Column(words.key, words.header, words.spec)


def describe_model(cfg, view: TaskView) -> str:
    return f"{cfg.method.name} · step {cfg.step.name} · {view.trained_on}"


# each command group's report, and the uncertainty of figures: after the contract, which they import
from .evaluation import (calibration_report, comparison_report, evaluation_report, group_by_configuration,  # noqa: E402, F401
                         least_squares, per_step_table, sweep_report)
from .runs import (diff_report, epoch_record, info_report, prediction_report, runs_report,  # noqa: E402, F401
                   stopped_record, training_report, trash_report)
from .uncertainty import (binomial_cdf, clopper_pearson_upper, combine_draws, mean_ci, standard_error,  # noqa: E402, F401
                          wilson_interval, wilson_lower)
