"""What eval, extrapolate, sweep, calibrate and compare report: one bucket per difficulty (or rule;
compare: per method and difficulty, mean ± sd over the seeds of each method)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

from ..render import Column, cell_text, sparkline
from ..registry import SHUFFLES
from . import Report, TaskView, describe_model, key_column, make_meta


def per_bucket(buckets: list[dict], inputs: str) -> str:
    """"1000 images per bucket"; buckets of different sizes give the range: "1024–2048 vectors"."""
    sizes = sorted({bucket["images"] for bucket in buckets})
    count = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}–{sizes[-1]}"
    return f"{count} {inputs} per bucket"


def _pair(first: str, second: str, spec: str, sep: str) -> Callable[[dict], str]:
    """A cell of two figures, "4.09 ± 3.50": one column where two would not fit in 80."""
    return lambda row: f"{cell_text(row.get(first), spec)}{sep}{cell_text(row.get(second), spec)}"


def _with_interval(row: dict) -> str:
    """"0.9440 ±0.0131": the accuracy and the half-width of its Wilson 95% interval."""
    if row.get("accuracy_wilson") is None:
        return cell_text(row["accuracy"], ".4f")
    low, high = row["accuracy_wilson"]
    return f"{cell_text(row['accuracy'], '.4f')} ±{cell_text((high - low) / 2, '.4f')}"


def accuracy_column(intervals: bool) -> Column:
    """The accuracy, with the half-width of its Wilson 95% interval where the table has room."""
    if not intervals:
        return Column("accuracy", "accuracy", ".4f")
    return Column("accuracy", "accuracy ± 95%", text=_with_interval, wrap=True)


def best_fixed_accuracy(accuracy_at_step: Sequence[float], mean_steps: float) -> float:
    """The best accuracy a fixed budget, or a mix of two (a share of the inputs stopped at step i,
    the rest at j), reaches in no more than `mean_steps` on average: the upper concave envelope of
    the per-step curve at the mean, or a budget below it alone (two budgets suffice: one
    constraint on a linear objective). Not the two either side of the mean, the best only where
    the curve is concave (0.90, 0.50, 0.95 at 2: that mix 0.50, steps 1 and 3 mixed 0.925)."""
    last = len(accuracy_at_step)
    mean = min(max(mean_steps, 1.0), last)
    best = max(accuracy_at_step[n - 1] for n in range(1, last + 1) if n <= mean)
    for low in range(1, int(mean) + 1):
        for high in range(low + 1, last + 1):
            if high > mean:
                share = (mean - low) / (high - low)
                best = max(best, accuracy_at_step[low - 1] + share * (accuracy_at_step[high - 1] - accuracy_at_step[low - 1]))
    return best


# beside the rule's own accuracy, whether adapting beats every fixed budget of no more steps, in one column
BEST_FIXED_COLUMN = Column("best_fixed_accuracy", "best fixed ≤ steps", ".4f", wrap=True)
BEST_FIXED_CAPTION = "best fixed ≤ steps: best fixed budget, or mix of two, in ≤ the mean steps"
# fixed:N reads step N's own output, while ACT trains and predicts on the p-weighted mean of its steps' outputs
ACT_CAVEAT = "ACT's fixed budget reads step N's y_N, not the mean-field prediction ACT trains on: a weak control"
CONTROL_KEYS = ("shuffled_accuracy", "adapting_minus_shuffled", "adapting_minus_shuffled_se", "premature_halts",
                "late_halts")


def _difference_text(row: dict) -> str:
    """"+0.0125 ±0.0040": adapting minus shuffled and its standard error; "-" where there is none."""
    if row.get("adapting_minus_shuffled") is None:
        return "-"
    se = row.get("adapting_minus_shuffled_se")
    return f"{row['adapting_minus_shuffled']:+.4f}" + (f" ±{se:.4f}" if se is not None else "")


def controls_table(rows: list[dict], first: list[Column], figures: bool = True
                   ) -> tuple[str, list[dict], list[Column], str]:
    """The Controls table (--detail's, compare's), a row per bucket named by the `first` columns:
    the accuracy and best fixed policy (`figures`), the shuffled-halting null and adapting minus
    it, the halts that went wrong; and its caption."""
    columns = [*first, *([Column("accuracy", "accuracy", ".4f"), BEST_FIXED_COLUMN] if figures else []),
               Column("shuffled_accuracy", "shuffled", ".4f"),
               Column("adapting_minus_shuffled", "adapting − shuffled", text=_difference_text),
               Column("premature_halts", "premature", ".4f"), Column("late_halts", "late", ".4f")]
    caption = (f"shuffled: the same halting steps dealt to the inputs at random (mean of {SHUFFLES}\n"
               "permutations), each answered at the step it is dealt · ± its standard error\n"
               "premature / late: wrong where halted, right at the last step / at a step before")
    return "Controls", rows, columns, caption


def _steps_caption(cfg, steps: Optional[dict]) -> tuple[dict, str]:
    """The steps run and trained (api.steps_run; None: as trained) and the caption's line on them."""
    steps = steps or {"max_steps": cfg.method.max_steps, "trained_max_steps": cfg.method.max_steps}
    if steps["max_steps"] == steps["trained_max_steps"]:
        return steps, ""
    return steps, f"\nrun to {steps['max_steps']} steps (--max-steps; trained with {steps['trained_max_steps']})"


def evaluation_report(command: str, checkpoint: str, cfg, buckets: list[dict], rho: Optional[float], *,
                      protocol: Optional[str], seed: int, with_loss: bool, detail: bool,
                      rho_ci: Optional[list[float]] = None, view: TaskView, steps: Optional[dict] = None,
                      difficulty_varies: bool = True, sparkline_column: bool = True) -> Report:
    """eval / extrapolate (and sweep's start): one bucket per difficulty of one checkpoint. Where
    the difficulty did not vary (`eval` at 0°) the caption leaves out Spearman's rho."""
    steps, run_to = _steps_caption(cfg, steps)
    images = sum(b["images"] for b in buckets)
    for bucket in buckets:
        items = list(bucket.items()) if detail else []  # --detail: best_fixed_accuracy after accuracy_at_step
        for key, value in items:
            bucket[key] = bucket.pop(key)
            if key == "accuracy_at_step":
                bucket["best_fixed_accuracy"] = best_fixed_accuracy(value, bucket["mean_steps"])
        bucket.update(checkpoint=checkpoint, method=cfg.method.name, step=cfg.step.name)
        bucket["halting_spark"] = sparkline(bucket["histogram"], width=20)
        for key in CONTROL_KEYS:  # --detail's controls after every key that came before them
            if key in bucket:
                bucket[key] = bucket.pop(key)
    used, repeats, words = buckets[0]["halting"], buckets[0].get("repeats", 1), view.terms
    meta = make_meta(command, [checkpoint], [cfg.method.name], [cfg.step.name], protocol=protocol, halting=used,
                     seed=seed, task=view.name, repeats=repeats, **view.meta, **steps,
                     spearman={"rho": rho, "rho_ci": rho_ci, "images": images, "between": words.between})
    ci = f" (95% interval {rho_ci[0]:+.3f} to {rho_ci[1]:+.3f})" if rho_ci is not None else ""
    name = f"Spearman ρ({words.difficulty}, steps)"
    rho_text = ("" if not difficulty_varies else
                f"\n{name} undefined: steps constant ({images} {words.inputs})" if rho is None else
                f"\n{name} = {rho:+.3f}{ci} over {images} {words.inputs}")
    # the sparkline's legend, where the table shows it (--detail's per-step table gives the counts)
    spark = "" if detail or not sparkline_column else \
        f"\nhalting steps: {words.inputs} halting at each step: █ the most, ▁ a few, blank none"
    draws = f" · mean of {repeats} draws (seeds {seed}–{seed + repeats - 1})" if repeats > 1 else ""
    what = words.test_set if command == "eval" else "extrapolation"
    how = f"protocol {protocol} · " if protocol is not None else ""
    # the image count goes in the caption, so that the table fits 80 columns; with --detail the
    # best fixed budget takes the sparkline's place, which the per-step table shows in full
    columns = [key_column(words, buckets), accuracy_column(not with_loss), *([BEST_FIXED_COLUMN] if detail else []),
               Column("mean_steps", "steps ± sd", text=_pair("mean_steps", "std_steps", ".2f", " ± "), wrap=True),
               Column("steps_correct", "steps ✓ / ✗", text=_pair("steps_correct", "steps_wrong", ".2f", " / "),
                      wrap=True),
               *([] if detail else [Column("halting_spark", f"halting steps 1→{cfg.method.max_steps}", "s",
                                           no_wrap=True)]),
               *([Column("loss", "loss", ".4f")] if with_loss else [])]
    report = Report(
        meta=meta, buckets=buckets, columns=columns, title=f"{cfg.method.name} on the {what} ({checkpoint})",
        caption=f"{describe_model(cfg, view)}{run_to}\n{how}halting {used} · seed {seed}{draws}\n"
                f"{per_bucket(buckets, words.inputs)} · steps ✓ / ✗: on correct / wrong answers"
                f"{spark}{rho_text}"
                + (f"\nloss: cross-entropy of the prediction under halting {used}" if with_loss else "")
                + (f"\n{BEST_FIXED_CAPTION}" if detail else "")
                + (f"\n{ACT_CAVEAT}" if detail and cfg.method.name == "act" else ""),
        plot_series={checkpoint: buckets})
    if detail:
        report.detail = per_step_table(buckets, expected=used == "expected", label=words.label)
        if any(bucket.get("shuffled_accuracy") is not None for bucket in buckets):
            report.controls = controls_table(buckets, [key_column(words, buckets)])
    return report


def per_step_table(buckets: list[dict], *, expected: bool,
                   label: Callable[[dict], str]) -> tuple[str, list[dict], list[Column]]:
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

def least_squares(xs: list[float], ys: list[float]) -> tuple[Optional[float], Optional[float], Optional[float]]:
    """Slope, intercept and r² of the least-squares line; None (undefined, not 0) without two
    distinct x, and r² None where every y is the same."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if not sxx:
        return None, None, None
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    syy = sum((y - my) ** 2 for y in ys)
    slope = sxy / sxx
    return slope, my - slope * mx, (sxy * sxy / (sxx * syy) if syy else None)


def sweep_report(checkpoint: str, cfg, buckets: list[dict], rho: Optional[float], *, seed: int,
                 view: TaskView, steps: Optional[dict] = None, difficulty_varies: bool = True) -> Report:
    """Mean steps and accuracy against the exact difficulty, with the least-squares slope of steps:
    MNIST per 10 degrees (human response times rise about linearly: Shepard & Metzler 1971);
    parity per non-zero count (as ACT's paper saw ponder time rise)."""
    words = view.terms
    report = evaluation_report("sweep", checkpoint, cfg, buckets, rho,
                               protocol="fixed" if view.protocol is not None else None, seed=seed,
                               with_loss=False, detail=False, view=view, steps=steps,
                               difficulty_varies=difficulty_varies, sparkline_column=False)
    slope, intercept, r2 = least_squares([b[words.sweep_key] for b in buckets], [b["mean_steps"] for b in buckets])
    report.meta["fit"] = {words.sweep_fit: None if slope is None else words.sweep_scale * slope,
                          "steps_at_0": intercept, "r2": r2}
    report.columns = [Column(words.sweep_key, words.sweep_header, "g"), accuracy_column(True),
                      Column("mean_steps", "steps", ".2f"), Column("steps_correct", "steps ✓", ".2f"),
                      Column("steps_wrong", "steps ✗", ".2f"),
                      Column("images", "images" if words.sweep_key == "rotation" else "inputs")]
    report.title = f"{cfg.method.name} {words.sweep_name} sweep ({checkpoint})"
    if slope is None:
        report.caption += f"\nleast squares: undefined (one {words.sweep_header} only; a slope needs two)"
    else:
        report.caption += (f"\nleast squares: steps = {intercept:.2f} {'-' if slope < 0 else '+'} "
                           f"{abs(words.sweep_scale * slope):.3f} per {words.sweep_unit}"
                           + (f" (r² {r2:.2f})" if r2 is not None else ""))
    report.plot_kind = "sweep"
    return report


# calibrate: by agreement (--tolerance), or by a bounded loss (--max-loss --risk) ------------------

def confidence_text(risk: float) -> str:
    """1 - risk as a percentage: 0.1 -> "90%", 0.025 -> "97.5%", 0.1 / 3 -> "96.67%"."""
    return f"{(1 - risk) * 100:.4g}%"


def _verdict(row: dict) -> str:
    if "admitted" in row:
        return "chosen" if row["chosen"] else "ok" if row["admitted"] else ""
    return "chosen" if row["chosen"] else "pass" if row["passed"] else "fail" if row["tested"] else "not tested"


def calibration_report(checkpoint: str, cfg, results: list, chosen: Optional[str], *, sets: list[dict],
                       protocol: Optional[str], seed: int, view: TaskView, data: str = "validation",
                       steps: Optional[dict] = None, repeats: int = 1, tolerance: Optional[float] = None,
                       more: str = "--repeats N (more draws pooled)", max_loss: Optional[float] = None,
                       risk: Optional[float] = None) -> Report:
    """calibrate: one bucket per candidate, `chosen` the cheapest admitted (None: none). By
    agreement (`tolerance`; results: evaluate.RuleOutcomes): admitted where its agreement's lower
    bound clears 1 - tolerance. By risk (`max_loss`, `risk`; results: evaluate.RiskTests, in the
    order tested): where it passed. gap: the last step's accuracy minus the halting step's;
    `more`: how to calibrate on more inputs, for the advice."""
    words, (steps, run_to) = view.terms, _steps_caption(cfg, steps)
    buckets = [{**asdict(result), **({"agreement_lower": result.agreement_lower} if risk is None else {}),
                "gap": result.accuracy_last - result.accuracy} for result in results]
    images, labels = buckets[0]["images"], ", ".join(words.label(s) for s in sets)
    how = f"protocol {protocol} · " if protocol is not None else ""
    head = f"{describe_model(cfg, view)}{run_to}\n{images} {data} {words.inputs} ({how}{labels})"
    shared = dict(protocol=protocol, halting=None, seed=seed, task=view.name, **view.meta, **steps, data=data,
                  sets=sets, images=images)
    if risk is None:
        floor = 1 - tolerance
        for bucket in buckets:
            bucket.update(within_tolerance=bucket["agreement"] >= floor - 1e-12,
                          admitted=bucket["agreement_lower"] >= floor - 1e-12, chosen=bucket["halting"] == chosen)
        meta = make_meta("calibrate", [checkpoint], [cfg.method.name], [cfg.step.name], repeats=repeats, **shared,
                         tolerance=tolerance, criterion="agreement", bound="wilson one-sided 95%", chosen=chosen)
        draws = f" · {repeats} draws pooled (seeds {seed}–{seed + repeats - 1})" if repeats > 1 else f" · seed {seed}"
        footer = (f"chosen: {chosen} (fewest steps with bound ≥ {floor:.1%}): --halting {chosen}" if chosen else
                  f"chosen: none (no rule's bound reaches {floor:.1%} on {images} {words.inputs}): raise "
                  f"--tolerance, or calibrate on more: {more}")
        title = f"Exit rules on the {data} set ({checkpoint})"
        own = [Column("gap", "gap", "+.4f"), Column("agreement", "agrees", ".4f"),
               Column("agreement_lower", "bound", ".4f")]
        caption = (f"{head}{draws}\n"
                   f"accuracy at the last step: {buckets[0]['accuracy_last']:.4f} · gap: it minus accuracy\n"
                   f"agrees: share whose class is the last step's · bound: its\n"
                   f"one-sided 95% lower bound (Wilson) · ok: bound ≥ {floor:.1%}")
    else:
        for bucket in buckets:
            bucket["chosen"] = bucket["halting"] == chosen
        families, level = len({bucket["family"] for bucket in buckets}), buckets[0]["level"]
        picked = next((b for b in buckets if b["chosen"]), None)
        meta = make_meta("calibrate", [checkpoint], [cfg.method.name], [cfg.step.name], repeats=1, **shared,
                         criterion="risk", max_loss=max_loss, risk=risk, bound="clopper-pearson upper",
                         test="fixed sequence", families=families, level=level, chosen=chosen,
                         chosen_bound=picked["bound"] if picked else None,
                         chosen_mean_steps=picked["mean_steps"] if picked else None)
        split = (f"{families} families, each at risk {level:.4g} (--risk / {families})" if families > 1
                 else f"at risk {level:g}")
        footer = (f"chosen: {chosen} (loss ≤ {picked['bound']:.4f} at {confidence_text(risk)}, "
                  f"{picked['mean_steps']:.2f} steps): --halting {chosen}" if picked else
                  f"chosen: none (no candidate's bound reaches {max_loss:g})")
        title = f"Bounded-loss exit rules ({checkpoint})"
        own = [Column("losses", "differ", "d"), Column("loss", "loss", ".4f"), Column("bound", "bound", ".4f")]
        caption = (f"{head} · seed {seed}\n"
                   f"loss: share whose class differs from the last step's ({images} {words.inputs})\n"
                   f"bound: its exact upper {confidence_text(level)} bound (Clopper–Pearson)\n"
                   f"tested family by family from the most steps, {split}:\n"
                   f"a family stops at its first bound above --max-loss {max_loss:g}\n"
                   f"chosen: the fewest mean steps of those that passed")
    columns = [Column("halting", "rule", "s"), Column("mean_steps", "steps", ".2f"),
               Column("accuracy", "accuracy", ".4f"), *own, Column("chosen", "verdict", "s", text=_verdict)]
    return Report(meta=meta, buckets=buckets, title=title, columns=columns, caption=caption, footer=footer)


# compare: checkpoints grouped into methods (those that differ only in the seed) ---------------------

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


def _controls(rows: list[dict]) -> dict:
    """A bucket's controls over a group's models: means and sd over seeds, the standard error of
    the mean difference from each model's own; None where a model has none (ACT, plain)."""
    keys = ("shuffled_accuracy", "shuffled_accuracy_sd", "adapting_minus_shuffled", "adapting_minus_shuffled_sd",
            "adapting_minus_shuffled_se", "premature_halts", "late_halts")
    if any(row.get("shuffled_accuracy") is None for row in rows):
        return dict.fromkeys(keys)
    errors = [row.get("adapting_minus_shuffled_se") for row in rows]
    se = None if None in errors else sum(e * e for e in errors) ** 0.5 / len(errors)
    return dict(zip(keys, (*mean_and_sd([row["shuffled_accuracy"] for row in rows]),
                           *mean_and_sd([row["adapting_minus_shuffled"] for row in rows]), se,
                           statistics.mean(row["premature_halts"] for row in rows),
                           statistics.mean(row["late_halts"] for row in rows))))


# what names a bucket, in the built-in tasks' terms; another task's is its terms' key
DIFFICULTY_KEYS = ("rotation", "band", "counts", "lo", "hi")


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
            first = per_model[0][b]
            bucket = {"method": group.cfg.method.name, "step": group.cfg.step.name, "label": group.label,
                      **{k: v for k, v in first.items() if k in names}, "seeds": len(per_model),
                      "accuracy": accuracy, "accuracy_sd": accuracy_sd, "mean_steps": steps, "mean_steps_sd": steps_sd,
                      "best_fixed_accuracy": best, "best_fixed_accuracy_sd": best_sd,
                      "max_steps": group.cfg.method.max_steps, "halting": first["halting"], "images": first["images"],
                      "checkpoints": [p for p, _ in group.members],
                      "accuracy_text": plus_minus(accuracy, accuracy_sd, ".4f"),
                      "steps_text": plus_minus(steps, steps_sd, ".2f"),
                      "best_fixed_text": "-" if best is None else format(best, ".4f")}
            bucket.update(_controls([r[b] for r in per_model]))
            buckets.append(bucket)
            series[name].append({**bucket, "std_steps": steps_sd or 0.0, "histogram": [
                sum(r[b]["histogram"][k] for r in per_model) for k in range(len(first["histogram"]))]})
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
    named = [Column("label", "method", "s", wrap=True), *([Column("step", "step", "s")] if len(step_names) > 1 else [])]
    controls = (controls_table(rows, [*named, key_column(words, buckets)], figures=False)
                if any(bucket["shuffled_accuracy"] is not None for bucket in buckets) else None)
    columns = [*named, Column("seeds", "seeds"), key_column(words, buckets),
               Column("accuracy_text", "accuracy", "s", wrap=True), Column("steps_text", "steps", "s", wrap=True),
               Column("best_fixed_text", "best fixed ≤ steps", "s", wrap=True)]
    return Report(meta=meta, buckets=buckets, columns=columns, title="Methods compared",
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
