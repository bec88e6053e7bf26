"""What compare reports: checkpoints grouped into methods (those that differ only in the seed),
mean ± sd over their seeds, per bucket."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

from ..render import Column
from . import Report, TaskView, Terms, key_column, make_meta
from .evaluation import ACT_CAVEAT, BEST_FIXED_CAPTION, best_fixed_accuracy, controls_table, per_bucket

# compare ---------------------------------------------------------------------------------------


@dataclass
class Group:
    """Checkpoints that differ only in their seed: one method configuration."""
    label: str
    cfg: object  # the first member's config
    members: list  # (path, cfg) pairs


def group_by_configuration(models: list[tuple[str, object]]) -> list[Group]:
    """(path, cfg) pairs grouped by config but the seed, in first-seen order, each labelled by its
    method and what sets it apart from other groups of that method and step."""
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
                            if other is not cfg and other.chosen() == cfg.chosen()
                            for k, v in other.to_dict().items() if k != "seed" and mine[k] != v})
        label = cfg.method.name + (f" ({' '.join(f'{k}={mine[k]}' for k in differing)})" if differing else "")
        result.append(Group(label, cfg, members))
    return result


def mean_and_sd(values: list[float]) -> tuple[float, Optional[float]]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def plus_minus(mean: float, sd: Optional[float], spec: str) -> str:
    """"0.9871 ±0.0007": the sd bound to its sign, so a cell too wide breaks between the figures."""
    return format(mean, spec) if sd is None else f"{format(mean, spec)} ±{format(sd, spec)}"


def _controls(per_model: list[list[dict]], b: int) -> dict:
    """Bucket b's controls over a group's models: means and sd over seeds, the standard error of
    the mean difference from each model's own; None where a model has none (ACT, plain)."""
    rows = [r[b] for r in per_model]
    if any(row.get("shuffled_accuracy") is None for row in rows):
        return dict.fromkeys(("shuffled_accuracy", "shuffled_accuracy_sd", "adapting_minus_shuffled",
                              "adapting_minus_shuffled_sd", "adapting_minus_shuffled_se", "premature_halts",
                              "late_halts"))
    shuffled, shuffled_sd = mean_and_sd([row["shuffled_accuracy"] for row in rows])
    difference, difference_sd = mean_and_sd([row["adapting_minus_shuffled"] for row in rows])
    errors = [row.get("adapting_minus_shuffled_se") for row in rows]
    se = None if None in errors else sum(e * e for e in errors) ** 0.5 / len(errors)
    return {"shuffled_accuracy": shuffled, "shuffled_accuracy_sd": shuffled_sd, "adapting_minus_shuffled": difference,
            "adapting_minus_shuffled_sd": difference_sd, "adapting_minus_shuffled_se": se,
            "premature_halts": statistics.mean(row["premature_halts"] for row in rows),
            "late_halts": statistics.mean(row["late_halts"] for row in rows)}


# what names a bucket, in the built-in tasks' terms; another task's is its terms' key
DIFFICULTY_KEYS = ("rotation", "band", "counts", "lo", "hi")


def compare_columns(steps_differ: bool, words: Terms, buckets: Sequence[dict] = ()) -> list[Column]:
    return [Column("label", "method", "s", wrap=True)] + ([Column("step", "step", "s")] if steps_differ else []) + [
        Column("seeds", "seeds"), key_column(words, list(buckets)),
        Column("accuracy_text", "accuracy", "s", wrap=True),
        Column("steps_text", "steps", "s", wrap=True),
        Column("best_fixed_text", "best fixed ≤ steps", "s", wrap=True)]


def comparison_report(groups: list[Group], results: list[list[list[dict]]], angles: list, *,
                      protocol: Optional[str], halting: Optional[str], seed: int, repeats: int = 1,
                      view: TaskView, max_steps: Optional[int] = None, trained: Optional[dict] = None) -> Report:
    """results[g][m][b]: member m of group g in bucket b, with its accuracy_at_step. max_steps:
    --max-steps (None: each as trained); trained: each checkpoint's trained max_steps by path."""
    buckets, series = [], {}
    words = view.terms
    names = {*DIFFICULTY_KEYS, words.key}
    step_names = sorted({g.cfg.step.name for g in groups})
    for group, per_model in zip(groups, results):
        # the plot's legend: a group's label names what sets it apart within its method and
        # step, so where steps differ the step goes with it, as the table's step column does
        name = f"{group.label} · step {group.cfg.step.name}" if len(step_names) > 1 else group.label
        series[name] = []
        for b, _ in enumerate(angles):
            accuracy, accuracy_sd = mean_and_sd([r[b]["accuracy"] for r in per_model])
            steps, steps_sd = mean_and_sd([r[b]["mean_steps"] for r in per_model])
            curves = [(r[b].get("accuracy_at_step"), r[b]["mean_steps"]) for r in per_model]
            best, best_sd = (None, None) if any(curve is None for curve, _ in curves) \
                else mean_and_sd([best_fixed_accuracy(curve, mean) for curve, mean in curves])
            bucket = {"method": group.cfg.method.name, "step": group.cfg.step.name, "label": group.label,
                      **{k: v for k, v in per_model[0][b].items() if k in names}, "seeds": len(per_model), "accuracy": accuracy, "accuracy_sd": accuracy_sd,
                      "mean_steps": steps, "mean_steps_sd": steps_sd, "best_fixed_accuracy": best,
                      "best_fixed_accuracy_sd": best_sd, "max_steps": group.cfg.method.max_steps,
                      "halting": per_model[0][b]["halting"],
                      "images": per_model[0][b]["images"], "checkpoints": [p for p, _ in group.members],
                      "accuracy_text": plus_minus(accuracy, accuracy_sd, ".4f"),
                      "steps_text": plus_minus(steps, steps_sd, ".2f"),
                      "best_fixed_text": "-" if best is None else format(best, ".4f")}
            bucket.update(_controls(per_model, b))
            buckets.append(bucket)
            series[name].append({**bucket, "std_steps": steps_sd or 0.0, "histogram": [
                sum(r[b]["histogram"][k] for r in per_model) for k in range(len(per_model[0][b]["histogram"]))]})
    meta = make_meta("compare", [p for g in groups for p, _ in g.members], [g.cfg.method.name for g in groups],
                     [g.cfg.step.name for g in groups], protocol=protocol, halting=halting, seed=seed,
                     task=view.name, repeats=repeats, max_steps=max_steps, trained_max_steps=trained or {})
    draws = f" · each the mean of {repeats} draws" if repeats > 1 else ""
    # each method's own halting rule (ACT's, one step) or the one asked for: one per method
    rules = {bucket["method"]: bucket["halting"] for bucket in buckets}
    if len({(b["method"], b["halting"]) for b in buckets}) > len(rules):  # models of one method, rules of their own
        rules = {bucket["label"]: bucket["halting"] for bucket in buckets}
    # the table names each group once, on its first row: long labels wrap over several lines
    rows = [{**bucket, "label": bucket["label"] if i == 0 or buckets[i - 1]["label"] != bucket["label"] else ""}
            for i, bucket in enumerate(buckets)]
    how = f"protocol {protocol} · " if protocol is not None else ""
    seeds = [len(g.members) for g in groups]
    # the sd needs two seeds: with one per method the figures are that checkpoint's own
    spread = ("one checkpoint per method" if max(seeds) == 1 else "mean ± sd over seeds" if min(seeds) > 1
              else "mean ± sd over seeds (a method of one seed: its figure, no sd)")
    controls = None
    if any(bucket["shuffled_accuracy"] is not None for bucket in buckets):
        first = [Column("label", "method", "s", wrap=True), *([Column("step", "step", "s")] if len(step_names) > 1
                                                              else []), key_column(words, buckets)]
        controls = controls_table(rows, first, figures=False)
    return Report(meta=meta, buckets=buckets, columns=compare_columns(len(step_names) > 1, words, buckets), title="Methods compared",
                  table_rows=rows, controls=controls,
                  caption=f"accuracy and steps: {spread}{draws}\nhalting: "
                          f"{' · '.join(f'{method} → {rule}' for method, rule in rules.items())}\n"
                          f"{'step ' + step_names[0] + ' · ' if len(step_names) == 1 else ''}{how}"
                          f"seed {seed}\n{per_bucket(buckets, 'test ' + words.inputs)}\n"
                          f"{BEST_FIXED_CAPTION}"
                          + (" (mean over seeds)" if any(len(g.members) > 1 for g in groups) else "")
                          + (f"\n{ACT_CAVEAT}" if any(b["method"] == "act" for b in buckets) else "")
                          + (f"\nrun to {max_steps} steps (--max-steps; a one-step method keeps its one)"
                             if max_steps is not None else ""),
                  plot_series=series)
