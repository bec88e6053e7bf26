"""What every command reports, as plain data: metadata, a list of buckets and how to show them.

The one output contract: every command's JSON is one object with the same metadata keys
(`META_KEYS`) and a `buckets` array; its CSV has one row per bucket with the metadata as columns.
Also here, as plain Python with no torch: the grouping of `compare`'s checkpoints into methods
and their statistics over seeds.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

from .render import Column, cell_text, sparkline, value_text

META_KEYS = ("command", "task", "checkpoints", "method", "step", "protocol", "halting", "seed")


@dataclass
class Report:
    meta: dict  # META_KEYS first, then anything command-specific (spearman, train_rotation, ...)
    buckets: list[dict]
    columns: list[Column]  # what the table shows of each bucket
    title: str
    caption: str = ""
    detail: Optional[tuple[str, list[dict], list[Column]]] = None  # a second table: title, rows, columns
    footer: str = ""  # a line after the table (table format only)
    plot_series: dict[str, list[dict]] = field(default_factory=dict)  # label -> buckets, for --plot
    table_rows: Optional[list[dict]] = None  # what the table shows, when not the buckets
    plot_kind: str = "buckets"  # plot.py's figure for this report

    @property
    def rows(self) -> list[dict]:
        return self.buckets if self.table_rows is None else self.table_rows

    def as_json(self) -> dict:
        return {**self.meta, "buckets": self.buckets}

    def csv_rows(self) -> list[dict]:
        """One row per bucket, the scalar metadata in the first columns."""
        scalars = {k: v for k, v in self.meta.items() if not isinstance(v, dict)}
        return [{**scalars, **bucket} for bucket in self.buckets]


def make_meta(command: str, checkpoints: list[str], methods: list[str], steps: list[str], *,
              protocol: Optional[str], halting: Optional[str], seed: Optional[int], task: str,
              **extra) -> dict:
    """The shared metadata; method and step are null when the checkpoints differ in them (every
    bucket then carries its own). protocol: MNIST's rotation protocol, null for parity."""
    def one(values):
        distinct = sorted(set(values))
        return distinct[0] if len(distinct) == 1 else None
    return {"command": command, "task": task, "checkpoints": checkpoints, "method": one(methods),
            "step": one(steps), "protocol": protocol, "halting": halting, "seed": seed, **extra}


@dataclass(frozen=True)
class Terms:
    """How a task names its buckets and inputs in tables, captions and JSON (each task module
    holds its own; see tasks/)."""
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
    """What reports say of a run's task (built by the task from the run's config): its name, its
    terms, the metadata it adds (MNIST: train_rotation; parity: elems, train_counts), how
    captions name the training data, and its protocol when it has one."""
    name: str
    terms: Terms
    meta: dict
    trained_on: str
    protocol: Optional[str] = "uniform"


def describe_model(cfg, view: TaskView) -> str:
    """How captions and titles name a model: method, step function, what it was trained on."""
    return f"{cfg.method} · step {cfg.step} · {view.trained_on}"


# repeated draws ---------------------------------------------------------------------------------

# Student's t, 97.5% quantile, for 1..30 degrees of freedom (a 95% two-sided interval)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042)


def mean_ci(values: list[float], bounds: tuple[float, float] = (-math.inf, math.inf)
            ) -> tuple[float, Optional[list[float]]]:
    """Mean and its 95% confidence interval [low, high] from independent draws (Student's t
    with n - 1 degrees of freedom), kept within `bounds` (an accuracy: 0 to 1); no interval
    from a single draw."""
    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, None
    t = _T975[len(values) - 2] if len(values) - 1 <= len(_T975) else 1.960
    half = t * statistics.stdev(values) / len(values) ** 0.5
    return mean, [max(mean - half, bounds[0]), min(mean + half, bounds[1])]


def combine_draws(draws: list[dict]) -> dict:
    """One bucket from K independent draws of rotations and coins: every figure is the mean over
    draws; accuracy and mean steps also get a 95% interval (`accuracy_ci`, `mean_steps_ci`), and
    the histogram is the mean count per draw. Means are floats even where every draw gave a
    whole count, so that a figure's type never depends on the draws' luck."""
    first = draws[0]
    if len(draws) == 1:
        return {**first, "repeats": 1, "accuracy_ci": None, "mean_steps_ci": None}
    combined = dict(first)
    for key, value in first.items():
        values = [d[key] for d in draws]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "images" \
                and all(v is not None for v in values):
            combined[key] = statistics.fmean(values)
        elif isinstance(value, list) and value and isinstance(value[0], (int, float)):
            combined[key] = [statistics.fmean(column) for column in zip(*values)]
        elif value is None or any(v is None for v in values):
            present = [v for v in values if v is not None]
            combined[key] = statistics.fmean(present) if present and isinstance(present[0], float) else value
    combined["accuracy"], combined["accuracy_ci"] = mean_ci([d["accuracy"] for d in draws], bounds=(0.0, 1.0))
    combined["mean_steps"], combined["mean_steps_ci"] = mean_ci([d["mean_steps"] for d in draws])
    combined["repeats"] = len(draws)
    return combined


# eval and extrapolate --------------------------------------------------------------------------

def per_bucket(buckets: list[dict], inputs: str) -> str:
    """The captions' "1000 images per bucket"; buckets of different sizes (parity's count ranges
    of different widths) give the range: "1024–2048 vectors per bucket"."""
    sizes = sorted({bucket["images"] for bucket in buckets})
    count = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}–{sizes[-1]}"
    return f"{count} {inputs} per bucket"


def _pair(first: str, second: str, spec: str, sep: str) -> Callable[[dict], str]:
    """A table cell of two figures, e.g. "4.09 ± 3.50": one column where two would not fit in 80."""
    return lambda row: f"{cell_text(row.get(first), spec)}{sep}{cell_text(row.get(second), spec)}"


def _with_interval(key: str, interval: str, spec: str) -> Callable[[dict], str]:
    """"0.9440 ±0.0131": a figure and the half-width of its 95% interval (the `interval` key)."""
    def text(row: dict) -> str:
        if row.get(interval) is None:
            return cell_text(row[key], spec)
        low, high = row[interval]
        return f"{cell_text(row[key], spec)} ±{cell_text((high - low) / 2, spec)}"
    return text


def accuracy_column(intervals: bool) -> Column:
    """The accuracy, with the half-width of its Wilson 95% interval over every input evaluated
    (every draw's) where the table has room for it."""
    if not intervals:
        return Column("accuracy", "accuracy", ".4f")
    return Column("accuracy", "accuracy ± 95%", text=_with_interval("accuracy", "accuracy_wilson", ".4f"), wrap=True)


def bucket_columns(max_steps: int, with_loss: bool, intervals: bool, words: Terms) -> list[Column]:
    """What eval and extrapolate tables show of a bucket; the image count, the same in every
    bucket, goes in the caption so that the table fits an 80-column terminal. The accuracy
    carries its interval's half-width where that fits (not beside eval's loss)."""
    accuracy = accuracy_column(intervals)
    columns = [
        Column(words.key, words.header, words.spec), accuracy,
        Column("mean_steps", "steps ± sd", text=_pair("mean_steps", "std_steps", ".2f", " ± "), wrap=True),
        Column("steps_correct", "steps ✓ / ✗", text=_pair("steps_correct", "steps_wrong", ".2f", " / "), wrap=True),
        Column("halting_spark", f"halting steps 1→{max_steps}", "s", no_wrap=True),
    ]
    return columns + ([Column("loss", "loss", ".4f")] if with_loss else [])


def evaluation_report(command: str, checkpoint: str, cfg, buckets: list[dict], rho: Optional[float], *,
                      protocol: Optional[str], halting: str, seed: int, with_loss: bool, detail: bool,
                      rho_ci: Optional[list[float]] = None, view: TaskView) -> Report:
    """eval / extrapolate: one bucket per rotation angle of one checkpoint."""
    images = sum(b["images"] for b in buckets)
    for bucket in buckets:
        bucket.update(checkpoint=checkpoint, method=cfg.method, step=cfg.step)
        bucket["halting_spark"] = sparkline(bucket["histogram"], width=20)
    used = buckets[0]["halting"]
    repeats = buckets[0].get("repeats", 1)
    words = view.terms
    meta = make_meta(command, [checkpoint], [cfg.method], [cfg.step], protocol=protocol, halting=used, seed=seed,
                     task=view.name, repeats=repeats, **view.meta,
                     spearman={"rho": rho, "rho_ci": rho_ci, "images": images, "between": words.between})
    ci = f" (95% interval {rho_ci[0]:+.3f} to {rho_ci[1]:+.3f})" if rho_ci is not None else ""
    name = f"Spearman ρ({words.difficulty}, steps)"
    rho_text = (f"{name} undefined: {words.difficulty.strip('|')} or steps constant ({images} {words.inputs})"
                if rho is None else f"{name} = {rho:+.3f}{ci} over {images} {words.inputs}")
    draws = f" · mean of {repeats} draws (seeds {seed}–{seed + repeats - 1})" if repeats > 1 else ""
    what = words.test_set if command == "eval" else "extrapolation"
    how = f"protocol {protocol} · " if protocol is not None else ""
    report = Report(
        meta=meta, buckets=buckets, columns=bucket_columns(cfg.max_steps, with_loss, not with_loss, words),
        title=f"{cfg.method} on the {what} ({checkpoint})",
        caption=f"{describe_model(cfg, view)}\n{how}halting {used} · seed {seed}{draws}\n"
                f"{per_bucket(buckets, words.inputs)} · steps ✓ / ✗: on correct / wrong answers\n"
                f"{rho_text}",
        plot_series={checkpoint: buckets})
    if detail:
        report.detail = per_step_table(buckets, expected=used == "expected", label=words.label)
    return report


def per_step_table(buckets: list[dict], *, expected: bool,
                   label: Callable[[dict], str]) -> tuple[str, list[dict], list[Column]]:
    """Per halting step: images that halted there and the accuracy if every image stopped there."""
    columns = [Column("step", "step")]
    rows = [{"step": k + 1} for k in range(len(buckets[0]["histogram"]))]
    # whole counts from one draw of the sample or median rule; fractions when the expected rule
    # spreads an image over steps or --repeats averages draws (combine_draws)
    whole = not expected and all(isinstance(n, int) for b in buckets for n in b["histogram"])
    for i, bucket in enumerate(buckets):
        for k, row in enumerate(rows):
            row[f"n{i}"] = bucket["histogram"][k]
            row[f"a{i}"] = bucket["accuracy_at_step"][k]
        columns += [Column(f"n{i}", f"{label(bucket)} halted", "d" if whole else ".1f", group=f"b{i}"),
                    Column(f"a{i}", f"{label(bucket)} acc if stop", ".4f", group=f"b{i}")]
    return "Per halting step", rows, columns


# sweep: the "mental rotation" view -------------------------------------------------------------

def least_squares(xs: list[float], ys: list[float]) -> tuple[float, float, Optional[float]]:
    """Slope, intercept and r^2 of the least-squares line y = slope * x + intercept."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    syy = sum((y - my) ** 2 for y in ys)
    slope = sxy / sxx if sxx else 0.0
    return slope, my - slope * mx, (sxy * sxy / (sxx * syy) if sxx and syy else None)


def sweep_columns(first: Column) -> list[Column]:
    return [first, accuracy_column(True), Column("mean_steps", "steps", ".2f"),
            Column("steps_correct", "steps ✓", ".2f"), Column("steps_wrong", "steps ✗", ".2f"),
            Column("images", "images" if first.key == "rotation" else "inputs")]


SWEEP_COLUMNS = sweep_columns(Column("rotation", "|angle|", "g"))


def sweep_report(checkpoint: str, cfg, buckets: list[dict], rho: Optional[float], *, halting: str, seed: int,
                 view: TaskView) -> Report:
    """Mean steps and accuracy against the exact difficulty, with the least-squares slope of steps:
    MNIST per 10 degrees of rotation (human response times rise about linearly: Shepard & Metzler
    1971); parity per non-zero count (ACT's paper saw ponder time rise about linearly)."""
    words = view.terms
    report = evaluation_report("sweep", checkpoint, cfg, buckets, rho,
                               protocol="fixed" if view.protocol is not None else None, halting=halting, seed=seed,
                               with_loss=False, detail=False, view=view)
    slope, intercept, r2 = least_squares([b[words.sweep_key] for b in buckets], [b["mean_steps"] for b in buckets])
    report.meta["fit"] = {words.sweep_fit: words.sweep_scale * slope, "steps_at_0": intercept, "r2": r2}
    report.columns = sweep_columns(Column(words.sweep_key, words.sweep_header, "g"))
    report.title = f"{cfg.method} {words.sweep_name} sweep ({checkpoint})"
    report.caption += (f"\nleast squares: steps = {intercept:.2f} {'-' if slope < 0 else '+'} "
                       f"{abs(words.sweep_scale * slope):.3f} per {words.sweep_unit}"
                       + (f" (r² {r2:.2f})" if r2 is not None else ""))
    report.plot_kind = "sweep"
    return report


# calibrate -------------------------------------------------------------------------------------

CALIBRATION_COLUMNS = [
    Column("halting", "rule", "s"), Column("mean_steps", "steps", ".2f"), Column("accuracy", "accuracy", ".4f"),
    Column("gap", "gap", "+.4f"), Column("agreement", "agrees", ".4f"), Column("agreement_lower", "bound", ".4f"),
    Column("chosen", "", "s", text=lambda row: "chosen" if row["chosen"] else "ok" if row["admitted"] else ""),
]


def calibration_report(checkpoint: str, cfg, outcomes: list, chosen: Optional[str], *, tolerance: float,
                       sets: list[dict], protocol: Optional[str], seed: int, repeats: int = 1,
                       view: TaskView, data: str = "validation") -> Report:
    """calibrate: one bucket per candidate rule (calibrate.RuleOutcome) on the calibration data
    (`data`: "calibration", inputs of its own, or "validation"); `chosen` the cheapest rule whose
    agreement's lower bound clears 1 - tolerance (None: none does). gap: the last step's
    accuracy minus the halting step's; within_tolerance: the agreement as measured clears it."""
    words = view.terms
    floor = 1 - tolerance
    buckets = []
    for outcome in outcomes:
        bucket = outcome.as_dict()
        bucket.update(gap=bucket["accuracy_last"] - bucket["accuracy"], within_tolerance=bucket["agreement"] >= floor
                      - 1e-12, admitted=bucket["agreement_lower"] >= floor - 1e-12, chosen=bucket["halting"] == chosen)
        buckets.append(bucket)
    images = buckets[0]["images"]
    meta = make_meta("calibrate", [checkpoint], [cfg.method], [cfg.step], protocol=protocol, halting=None, seed=seed,
                     task=view.name, repeats=repeats, **view.meta, data=data, sets=sets, images=images,
                     tolerance=tolerance, criterion="agreement", bound="wilson, one-sided 95%", chosen=chosen)
    labels = ", ".join(words.label(s) for s in sets)
    draws = f" · {repeats} draws pooled (seeds {seed}–{seed + repeats - 1})" if repeats > 1 else f" · seed {seed}"
    how = f"protocol {protocol} · " if protocol is not None else ""
    if chosen is not None:
        footer = f"chosen: {chosen} (fewest steps with bound ≥ {floor:.1%}): --halting {chosen}"
    else:
        footer = (f"chosen: none (no rule's bound reaches {floor:.1%} on {images} {words.inputs}): raise "
                  f"--tolerance or calibrate on more")
    return Report(meta=meta, buckets=buckets, columns=CALIBRATION_COLUMNS,
                  title=f"Exit rules on the {data} set ({checkpoint})",
                  caption=f"{describe_model(cfg, view)}\n{images} {data} {words.inputs} ({how}{labels}){draws}\n"
                          f"accuracy at the last step: {buckets[0]['accuracy_last']:.4f} · gap: it minus accuracy\n"
                          f"agrees: share whose class is the last step's · bound: its\n"
                          f"one-sided 95% lower bound (Wilson) · ok: bound ≥ {floor:.1%}",
                  footer=footer)


# compare ---------------------------------------------------------------------------------------

@dataclass
class Group:
    """Checkpoints that differ only in their seed: one method configuration."""
    label: str
    cfg: object  # the first member's config
    members: list  # (path, cfg) pairs


def group_by_configuration(models: list[tuple[str, object]]) -> list[Group]:
    """Group (path, cfg) pairs whose configs differ only in the seed, in first-seen order, and
    label each group by its method plus whatever sets it apart from other groups of that method
    and step function."""
    groups: dict[tuple, list] = {}
    for path, cfg in models:
        key = tuple(sorted((k, v) for k, v in cfg.to_dict().items() if k != "seed"))
        groups.setdefault(key, []).append((path, cfg))
    firsts = [members[0][1] for members in groups.values()]
    result = []
    for members in groups.values():
        cfg = members[0][1]
        mine = cfg.to_dict()
        # the step has its own column: compare only with groups of the same method and step
        differing = sorted({k for other in firsts
                            if other is not cfg and (other.method, other.step) == (cfg.method, cfg.step)
                            for k, v in other.to_dict().items() if k != "seed" and mine[k] != v})
        label = cfg.method + (f" ({', '.join(f'{k}={mine[k]}' for k in differing)})" if differing else "")
        result.append(Group(label, cfg, members))
    return result


def mean_and_sd(values: list[float]) -> tuple[float, Optional[float]]:
    """Mean and sample standard deviation over seeds; the sd is None for a single seed."""
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def plus_minus(mean: float, sd: Optional[float], spec: str) -> str:
    return format(mean, spec) if sd is None else f"{format(mean, spec)} ± {format(sd, spec)}"


DIFFICULTY_KEYS = ("rotation", "counts", "lo", "hi")  # what names a bucket, in either task's terms


def compare_columns(steps_differ: bool, words: Terms) -> list[Column]:
    """The compare table: labels wrap (`pondernet (train_rotation=22.5)`), figures never do."""
    return [Column("label", "method", "s", wrap=True)] + ([Column("step", "step", "s")] if steps_differ else []) + [
        Column("seeds", "seeds"), Column(words.key, words.header, words.spec),
        Column("accuracy_text", "accuracy", "s", wrap=True),
        Column("steps_text", "steps", "s", wrap=True)]


def comparison_report(groups: list[Group], results: list[list[list[dict]]], angles: list, *,
                      protocol: Optional[str], halting: str, seed: int, repeats: int = 1,
                      view: TaskView) -> Report:
    """results[g][m][b]: the bucket dict of member m of group g in bucket b (an angle, or a
    non-zero-count range for parity); every checkpoint is of one task."""
    buckets, series = [], {}
    words = view.terms
    step_names = sorted({g.cfg.step for g in groups})
    for group, per_model in zip(groups, results):
        # the plot's legend: a group's label names what sets it apart within its method and
        # step, so where steps differ the step goes with it, as the table's step column does
        name = f"{group.label} · step {group.cfg.step}" if len(step_names) > 1 else group.label
        series[name] = []
        for b, _ in enumerate(angles):
            accuracy, accuracy_sd = mean_and_sd([r[b]["accuracy"] for r in per_model])
            steps, steps_sd = mean_and_sd([r[b]["mean_steps"] for r in per_model])
            bucket = {"method": group.cfg.method, "step": group.cfg.step, "label": group.label,
                      **{k: v for k, v in per_model[0][b].items() if k in DIFFICULTY_KEYS}, "seeds": len(per_model), "accuracy": accuracy, "accuracy_sd": accuracy_sd,
                      "mean_steps": steps, "mean_steps_sd": steps_sd, "halting": per_model[0][b]["halting"],
                      "images": per_model[0][b]["images"], "checkpoints": [p for p, _ in group.members],
                      "accuracy_text": plus_minus(accuracy, accuracy_sd, ".4f"),
                      "steps_text": plus_minus(steps, steps_sd, ".2f")}
            buckets.append(bucket)
            series[name].append({**bucket, "std_steps": steps_sd or 0.0, "histogram": [
                sum(r[b]["histogram"][k] for r in per_model) for k in range(len(per_model[0][b]["histogram"]))]})
    meta = make_meta("compare", [p for g in groups for p, _ in g.members], [g.cfg.method for g in groups],
                     [g.cfg.step for g in groups], protocol=protocol, halting=halting, seed=seed,
                     task=view.name, repeats=repeats)
    draws = f" · each the mean of {repeats} draws" if repeats > 1 else ""
    # each method's own halting rule (ACT's, one step) or the one asked for: one per method
    rules = {bucket["method"]: bucket["halting"] for bucket in buckets}
    # the table names each group once, on its first row: long labels wrap over several lines
    rows = [{**bucket, "label": bucket["label"] if i == 0 or buckets[i - 1]["label"] != bucket["label"] else ""}
            for i, bucket in enumerate(buckets)]
    how = f"protocol {protocol} · " if protocol is not None else ""
    return Report(meta=meta, buckets=buckets, columns=compare_columns(len(step_names) > 1, words), title="Methods compared",
                  table_rows=rows,
                  caption=f"accuracy and steps: mean ± sd over seeds{draws}\nhalting: "
                          f"{' · '.join(f'{method} → {rule}' for method, rule in rules.items())}\n"
                          f"{'step ' + step_names[0] + ' · ' if len(step_names) == 1 else ''}{how}"
                          f"seed {seed}\n{per_bucket(buckets, 'test ' + words.inputs)}",
                  plot_series=series)


# train -----------------------------------------------------------------------------------------

TRAIN_COLUMNS = [
    Column("epochs", "epochs"), Column("best_epoch", "best epoch"), Column("val_accuracy", "val accuracy", ".4f"),
    Column("val_steps", "val steps", ".2f"), Column("stopped_early", "stopped early"),
    Column("seconds", "seconds", ".1f"),
]


def training_report(cfg, result, seconds: float, view: TaskView) -> Report:
    """The summary of a run; its buckets are the epochs (the JSON and CSV give all of them)."""
    epochs = [asdict(h) for h in result.history]
    best = next((h for h in epochs if h["epoch"] == result.best_epoch), None)
    summary = {"epochs": result.last_epoch, "best_epoch": result.best_epoch, "val_accuracy": result.best_accuracy,
               "val_steps": best["val_steps"] if best else None, "stopped_early": result.stopped_early,
               "seconds": seconds, "out_dir": str(result.out_dir)}
    best_file = result.best_path
    meta = make_meta("train", [str(best_file)] if best_file else [], [cfg.method], [cfg.step], protocol=view.protocol,
                     halting="sample", seed=cfg.seed, task=view.name, **view.meta, **summary, config=cfg.to_dict())
    return Report(meta=meta, buckets=epochs, columns=TRAIN_COLUMNS, table_rows=[summary],
                  title=f"{cfg.method} training (step {cfg.step}{'' if view.name == 'mnist' else ', ' + view.name})",
                  footer=f"best checkpoint: {best_file}" if best_file else
                  f"no best checkpoint in {result.out_dir}: no epoch of this run beat epoch {result.best_epoch}, "
                  f"whose weights were not found beside the checkpoint resumed")


# predict ---------------------------------------------------------------------------------------

PREDICT_COLUMNS = [Column("input", "input", "s", wrap=True), Column("prediction", "prediction"),
                   Column("probability", "probability", ".4f"),
                   Column("halting_step", "halting step", text=lambda row: cell_text(
                       row["halting_step"], "d" if isinstance(row["halting_step"], int) else ".2f"))]


def _step_rows(buckets: list[dict]) -> tuple[list[dict], list[str]]:
    """The per-step table's rows (the input named on its first step only) and the step
    function's own keys (align: turn_deg)."""
    rows, own = [], []
    for bucket in buckets:
        for step in bucket["steps"]:
            own += [key for key in step if key not in ("step", "class", "probability", "lambda", "p")
                    and key not in own]
            halts = isinstance(bucket["halting_step"], int) and step["step"] == bucket["halting_step"]
            rows.append({**step, "input": bucket["input"] if step["step"] == 1 else "", "halts": "◀" if halts else ""})
    return rows, own


def prediction_report(checkpoint: str, cfg, buckets: list[dict], *, halting: str, seed: int, steps: bool,
                      views: list, view: TaskView, **extra) -> Report:
    """predict: one bucket per input (its prediction, probability and halting step; with
    `steps`, each step's figures); `views` (per input: each step's view, nested lists) feed --plot."""
    meta = make_meta("predict", [checkpoint], [cfg.method], [cfg.step], protocol=None, halting=halting, seed=seed,
                     task=view.name, **view.meta, **extra, inputs=len(buckets))
    sampled = halting == "sample"
    report = Report(meta=meta, buckets=buckets if steps else [{k: v for k, v in b.items() if k != "steps"}
                                                              for b in buckets],
                    columns=PREDICT_COLUMNS, title=f"{cfg.method} predictions ({checkpoint})",
                    caption=f"{describe_model(cfg, view)}\nhalting {halting}" + (f" · seed {seed}" if sampled else ""),
                    plot_series={"inputs": [{**b, "views": v} for b, v in zip(buckets, views)]}, plot_kind="predict")
    if steps:
        rows, own = _step_rows(buckets)
        columns = [Column("input", "input", "s", wrap=True), Column("step", "step"), Column("class", "class"),
                   Column("probability", "probability", ".4f"), Column("lambda", "λ_n", ".4f"),
                   Column("p", "p_n", ".4f"), *[Column(key, key, "+.1f") for key in own],
                   Column("halts", "halts", "s")]
        report.detail = ("Each step: its top class and probability, the halting probability λ_n and the halting "
                         "distribution p_n", rows, columns)
    return report


# info ------------------------------------------------------------------------------------------

HISTORY_COLUMNS = [
    Column("epoch", "epoch"), Column("train_loss", "train loss", ".4f"), Column("train_accuracy", "train acc", ".4f"),
    Column("train_steps", "train steps", ".2f"), Column("val_accuracy", "val acc", ".4f"),
    Column("val_steps", "val steps", ".2f"), Column("lr", "lr", ".0e"), Column("seconds", "secs", ".0f"),
    Column("best", "best", "s"),
]


def info_report(checkpoint: str, cfg, history: list[dict], summary: dict, *, shown: list[str], sources: dict,
                view: TaskView) -> Report:
    """info: what a checkpoint holds, as a table of facts, and its history, one bucket per epoch."""
    meta = make_meta("info", [checkpoint], [cfg.method], [cfg.step], protocol=view.protocol, halting=None,
                     seed=cfg.seed, task=view.name, **view.meta, **summary, config=cfg.to_dict(), sources=sources)
    values = cfg.to_dict()
    configuration = " · ".join(f"{name.replace('_', '-')} {value_text(values[name])}"
                               + ("" if sources.get(name, "default") == "default" else f" ({sources[name]})")
                               for name in shown)
    best = summary["best_epoch"]
    facts = [("task", view.name + (f" ({view.trained_on})" if view.trained_on else "")),
             ("method", cfg.method), ("step", cfg.step), ("status", summary["status"]),
             ("epochs", f"{summary['epochs_trained']} of {summary['epochs_planned']}"),
             ("best epoch", "-" if best is None else
              f"{best}: val accuracy {cell_text(summary['best_val_accuracy'], '.4f')}, "
              f"val steps {cell_text(summary['best_val_steps'], '.2f')}"),
             ("configuration", configuration)]
    rows = [{"what": what, "value": value} for what, value in facts]
    table = [{**h, "best": "★" if h.get("epoch") == best else ""} for h in history]
    facts_columns = [Column("what", "", "s"), Column("value", "", "s", wrap=True)]  # no headers: no header row
    return Report(meta=meta, buckets=history, columns=facts_columns, table_rows=rows, title=checkpoint,
                  detail=("History", table, HISTORY_COLUMNS) if history else None,
                  footer="" if history else "no per-epoch history in this checkpoint",
                  plot_series={"history": history, "best": [{"epoch": best}]}, plot_kind="history")
