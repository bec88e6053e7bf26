"""What every command reports, as plain data: metadata, a list of buckets and how to show them.

The one output contract: every command's JSON is one object with the same metadata keys
(`META_KEYS`) and a `buckets` array; its CSV has one row per bucket with the metadata as columns.
Also here, as plain Python with no torch: the grouping of `compare`'s checkpoints into methods
and their statistics over seeds.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

from .render import Column, cell_text, sparkline

META_KEYS = ("command", "checkpoints", "method", "step", "protocol", "halting", "seed")


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
              protocol: Optional[str], halting: Optional[str], seed: Optional[int], **extra) -> dict:
    """The shared metadata; method and step are null when the checkpoints differ in them (every
    bucket then carries its own)."""
    def one(values):
        distinct = sorted(set(values))
        return distinct[0] if len(distinct) == 1 else None
    return {"command": command, "checkpoints": checkpoints, "method": one(methods), "step": one(steps),
            "protocol": protocol, "halting": halting, "seed": seed, **extra}


def describe_model(cfg) -> str:
    """How captions and titles name a model: method, step function, training rotation."""
    return f"{cfg.method} · step {cfg.step} · trained within ±{cfg.train_rotation:g}°"


# eval and extrapolate --------------------------------------------------------------------------

def _pair(first: str, second: str, spec: str, sep: str) -> Callable[[dict], str]:
    """A table cell of two figures, e.g. "4.09 ± 3.50": one column where two would not fit in 80."""
    return lambda row: f"{cell_text(row.get(first), spec)}{sep}{cell_text(row.get(second), spec)}"


def bucket_columns(max_steps: int, with_loss: bool) -> list[Column]:
    """What eval and extrapolate tables show of a bucket; the image count, the same in every
    bucket, goes in the caption so that the table fits an 80-column terminal."""
    columns = [
        Column("rotation", "±deg", "g"), Column("accuracy", "accuracy", ".4f"),
        Column("mean_steps", "steps ± sd", text=_pair("mean_steps", "std_steps", ".2f", " ± "), wrap=True),
        Column("steps_correct", "steps ✓ / ✗", text=_pair("steps_correct", "steps_wrong", ".2f", " / "), wrap=True),
        Column("halting_spark", f"halting steps 1→{max_steps}", "s", no_wrap=True),
    ]
    return columns + ([Column("loss", "loss", ".4f")] if with_loss else [])


def evaluation_report(command: str, checkpoint: str, cfg, buckets: list[dict], rho: Optional[float], *,
                      protocol: str, halting: str, seed: int, with_loss: bool, detail: bool) -> Report:
    """eval / extrapolate: one bucket per rotation angle of one checkpoint."""
    images = sum(b["images"] for b in buckets)
    for bucket in buckets:
        bucket.update(checkpoint=checkpoint, method=cfg.method, step=cfg.step)
        bucket["halting_spark"] = sparkline(bucket["histogram"], width=20)
    used = buckets[0]["halting"]
    meta = make_meta(command, [checkpoint], [cfg.method], [cfg.step], protocol=protocol, halting=used, seed=seed,
                     train_rotation=cfg.train_rotation,
                     spearman={"rho": rho, "images": images, "between": "|rotation angle| and ponder steps"})
    rho_text = (f"Spearman ρ(|angle|, steps) undefined: angle or steps constant ({images} images)" if rho is None
                else f"Spearman ρ(|angle|, steps) = {rho:+.3f} over {images} images")
    what = "MNIST test set" if command == "eval" else "extrapolation"
    report = Report(
        meta=meta, buckets=buckets, columns=bucket_columns(cfg.max_steps, with_loss),
        title=f"{cfg.method} on the {what} ({checkpoint})",
        caption=f"{describe_model(cfg)}\nprotocol {protocol} · halting {used} · seed {seed}\n"
                f"{buckets[0]['images']} images per bucket · steps ✓ / ✗: on correct / wrong answers\n{rho_text}",
        plot_series={checkpoint: buckets})
    if detail:
        report.detail = per_step_table(buckets, expected=used == "expected")
    return report


def per_step_table(buckets: list[dict], *, expected: bool) -> tuple[str, list[dict], list[Column]]:
    """Per halting step: images that halted there and the accuracy if every image stopped there."""
    columns = [Column("step", "step")]
    rows = [{"step": k + 1} for k in range(len(buckets[0]["histogram"]))]
    for i, bucket in enumerate(buckets):
        for k, row in enumerate(rows):
            row[f"n{i}"] = bucket["histogram"][k]
            row[f"a{i}"] = bucket["accuracy_at_step"][k]
        columns += [Column(f"n{i}", f"±{bucket['rotation']:g}° halted", ".1f" if expected else "d", group=f"b{i}"),
                    Column(f"a{i}", f"±{bucket['rotation']:g}° acc if stop", ".4f", group=f"b{i}")]
    return "Per halting step", rows, columns


# compare ---------------------------------------------------------------------------------------

@dataclass
class Group:
    """Checkpoints that differ only in their seed: one method configuration."""
    label: str
    cfg: object  # the first member's config
    members: list  # (path, cfg) pairs


def group_by_configuration(models: list[tuple[str, object]]) -> list[Group]:
    """Group (path, cfg) pairs whose configs differ only in the seed, in first-seen order, and
    label each group by its method plus whatever sets it apart from other groups of that method."""
    groups: dict[tuple, list] = {}
    for path, cfg in models:
        key = tuple(sorted((k, v) for k, v in cfg.to_dict().items() if k != "seed"))
        groups.setdefault(key, []).append((path, cfg))
    firsts = [members[0][1] for members in groups.values()]
    result = []
    for members in groups.values():
        cfg = members[0][1]
        mine = cfg.to_dict()
        differing = sorted({k for other in firsts if other is not cfg and other.method == cfg.method
                            for k, v in other.to_dict().items() if k != "seed" and mine[k] != v})
        label = cfg.method + (f" ({', '.join(f'{k}={mine[k]}' for k in differing)})" if differing else "")
        result.append(Group(label, cfg, members))
    return result


def mean_and_sd(values: list[float]) -> tuple[float, Optional[float]]:
    """Mean and sample standard deviation over seeds; the sd is None for a single seed."""
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def plus_minus(mean: float, sd: Optional[float], spec: str) -> str:
    return format(mean, spec) if sd is None else f"{format(mean, spec)} ± {format(sd, spec)}"


def compare_columns(steps_differ: bool) -> list[Column]:
    """The compare table: labels wrap (`pondernet (train_rotation=22.5)`), figures never do."""
    return [Column("label", "method", "s", wrap=True)] + ([Column("step", "step", "s")] if steps_differ else []) + [
        Column("seeds", "seeds"), Column("rotation", "±deg", "g"), Column("accuracy_text", "accuracy", "s", wrap=True),
        Column("steps_text", "steps", "s", wrap=True)]


def comparison_report(groups: list[Group], results: list[list[list[dict]]], angles: list[float], *,
                      protocol: str, halting: str, seed: int) -> Report:
    """results[g][m][b]: the bucket dict of member m of group g at angle b."""
    buckets, series = [], {}
    for group, per_model in zip(groups, results):
        series[group.label] = []
        for b, angle in enumerate(angles):
            accuracy, accuracy_sd = mean_and_sd([r[b]["accuracy"] for r in per_model])
            steps, steps_sd = mean_and_sd([r[b]["mean_steps"] for r in per_model])
            bucket = {"method": group.cfg.method, "step": group.cfg.step, "label": group.label,
                      "rotation": angle, "seeds": len(per_model), "accuracy": accuracy, "accuracy_sd": accuracy_sd,
                      "mean_steps": steps, "mean_steps_sd": steps_sd, "halting": per_model[0][b]["halting"],
                      "images": per_model[0][b]["images"], "checkpoints": [p for p, _ in group.members],
                      "accuracy_text": plus_minus(accuracy, accuracy_sd, ".4f"),
                      "steps_text": plus_minus(steps, steps_sd, ".2f")}
            buckets.append(bucket)
            series[group.label].append({**bucket, "std_steps": steps_sd or 0.0, "histogram": [
                sum(r[b]["histogram"][k] for r in per_model) for k in range(len(per_model[0][b]["histogram"]))]})
    meta = make_meta("compare", [p for g in groups for p, _ in g.members], [g.cfg.method for g in groups],
                     [g.cfg.step for g in groups], protocol=protocol, halting=halting, seed=seed)
    # each method's own halting rule (ACT's, one step) or the one asked for: one per method
    rules = {bucket["method"]: bucket["halting"] for bucket in buckets}
    steps = sorted({g.cfg.step for g in groups})
    # the table names each group once, on its first row: long labels wrap over several lines
    rows = [{**bucket, "label": bucket["label"] if i == 0 or buckets[i - 1]["label"] != bucket["label"] else ""}
            for i, bucket in enumerate(buckets)]
    return Report(meta=meta, buckets=buckets, columns=compare_columns(len(steps) > 1), title="Methods compared",
                  table_rows=rows,
                  caption=f"accuracy and steps: mean ± sd over seeds\nhalting: "
                          f"{' · '.join(f'{method} → {rule}' for method, rule in rules.items())}\n"
                          f"{'step ' + steps[0] + ' · ' if len(steps) == 1 else ''}protocol {protocol} · "
                          f"seed {seed}\n{buckets[0]['images']} test images per bucket",
                  plot_series=series)


# train -----------------------------------------------------------------------------------------

TRAIN_COLUMNS = [
    Column("epochs", "epochs"), Column("best_epoch", "best epoch"), Column("val_accuracy", "val accuracy", ".4f"),
    Column("val_steps", "val steps", ".2f"), Column("stopped_early", "stopped early"),
    Column("seconds", "seconds", ".1f"),
]


def training_report(cfg, result, seconds: float) -> Report:
    """The summary of a run; its buckets are the epochs (the JSON and CSV give all of them)."""
    epochs = [asdict(h) for h in result.history]
    best = next((h for h in epochs if h["epoch"] == result.best_epoch), None)
    summary = {"epochs": result.last_epoch, "best_epoch": result.best_epoch, "val_accuracy": result.best_accuracy,
               "val_steps": best["val_steps"] if best else None, "stopped_early": result.stopped_early,
               "seconds": seconds, "out_dir": str(result.out_dir)}
    meta = make_meta("train", [str(result.best_path)], [cfg.method], [cfg.step], protocol="uniform",
                     halting="sample", seed=cfg.seed, train_rotation=cfg.train_rotation, **summary,
                     config=cfg.to_dict())
    return Report(meta=meta, buckets=epochs, columns=TRAIN_COLUMNS, table_rows=[summary],
                  title=f"{cfg.method} training (step {cfg.step})", footer=f"best checkpoint: {result.best_path}")
