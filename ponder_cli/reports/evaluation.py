"""What eval, extrapolate, sweep and calibrate report: one bucket per difficulty."""

from __future__ import annotations

import statistics
from typing import Callable, Optional, Sequence

from ..render import Column, cell_text, sparkline
from ..registry import SHUFFLES
from . import Report, TaskView, Terms, describe_model, key_column, make_meta

# eval and extrapolate --------------------------------------------------------------------------


def per_bucket(buckets: list[dict], inputs: str) -> str:
    """"1000 images per bucket"; buckets of different sizes give the range: "1024–2048 vectors"."""
    sizes = sorted({bucket["images"] for bucket in buckets})
    count = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}–{sizes[-1]}"
    return f"{count} {inputs} per bucket"


def _pair(first: str, second: str, spec: str, sep: str) -> Callable[[dict], str]:
    """A cell of two figures, "4.09 ± 3.50": one column where two would not fit in 80."""
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
    """The accuracy, with the half-width of its Wilson 95% interval where the table has room."""
    if not intervals:
        return Column("accuracy", "accuracy", ".4f")
    return Column("accuracy", "accuracy ± 95%", text=_with_interval("accuracy", "accuracy_wilson", ".4f"), wrap=True)


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


def _difference_text(key: str, se: str) -> Callable[[dict], str]:
    """"+0.0125 ±0.0040": a difference and its standard error; "-" where there is none."""
    def text(row: dict) -> str:
        if row.get(key) is None:
            return "-"
        return f"{row[key]:+.4f}" + (f" ±{row[se]:.4f}" if row.get(se) is not None else "")
    return text


CONTROL_KEYS = ("shuffled_accuracy", "adapting_minus_shuffled", "adapting_minus_shuffled_se", "premature_halts",
                "late_halts")


def controls_table(rows: list[dict], first: list[Column], figures: bool = True
                   ) -> tuple[str, list[dict], list[Column], str]:
    """The Controls table (--detail's, compare's), a row per bucket named by the `first` columns:
    the accuracy and best fixed policy (`figures`), the shuffled-halting null and adapting minus
    it, the halts that went wrong; and its caption."""
    columns = [*first, *([Column("accuracy", "accuracy", ".4f"), BEST_FIXED_COLUMN] if figures else []),
               Column("shuffled_accuracy", "shuffled", ".4f"),
               Column("adapting_minus_shuffled", "adapting − shuffled",
                      text=_difference_text("adapting_minus_shuffled", "adapting_minus_shuffled_se")),
               Column("premature_halts", "premature", ".4f"), Column("late_halts", "late", ".4f")]
    caption = (f"shuffled: the same halting steps dealt to the inputs at random (mean of {SHUFFLES}\n"
               "permutations), each answered at the step it is dealt · ± its standard error\n"
               "premature / late: wrong where halted, right at the last step / at a step before")
    return "Controls", rows, columns, caption
# fixed:N reads step N's own output, while ACT trains and predicts on the p-weighted mean of its steps' outputs
ACT_CAVEAT = "ACT's fixed budget reads step N's y_N, not the mean-field prediction ACT trains on: a weak control"


def with_best_fixed(bucket: dict) -> None:
    """`best_fixed_accuracy` into a bucket with `accuracy_at_step`, right after it (--detail)."""
    items = list(bucket.items())
    bucket.clear()
    for key, value in items:
        bucket[key] = value
        if key == "accuracy_at_step":
            bucket["best_fixed_accuracy"] = best_fixed_accuracy(value, bucket["mean_steps"])


def bucket_columns(max_steps: int, with_loss: bool, intervals: bool, words: Terms,
                   budget: bool = False, buckets: Sequence[dict] = ()) -> list[Column]:
    """What eval and extrapolate tables show of a bucket (the image count goes in the caption, so
    that the table fits 80 columns); with `budget` (--detail), the best fixed budget's accuracy
    in the place of the sparkline, which the per-step table then shows in full."""
    accuracy = accuracy_column(intervals)
    columns = [
        key_column(words, list(buckets)), accuracy, *([BEST_FIXED_COLUMN] if budget else []),
        Column("mean_steps", "steps ± sd", text=_pair("mean_steps", "std_steps", ".2f", " ± "), wrap=True),
        Column("steps_correct", "steps ✓ / ✗", text=_pair("steps_correct", "steps_wrong", ".2f", " / "), wrap=True),
        *([] if budget else [Column("halting_spark", f"halting steps 1→{max_steps}", "s", no_wrap=True)]),
    ]
    return columns + ([Column("loss", "loss", ".4f")] if with_loss else [])


def steps_of(cfg, steps: Optional[dict]) -> dict:
    return steps or {"max_steps": cfg.method.max_steps, "trained_max_steps": cfg.method.max_steps}


def steps_caption(steps: dict) -> str:
    if steps["max_steps"] == steps["trained_max_steps"]:
        return ""
    return f"\nrun to {steps['max_steps']} steps (--max-steps; trained with {steps['trained_max_steps']})"


def evaluation_report(command: str, checkpoint: str, cfg, buckets: list[dict], rho: Optional[float], *,
                      protocol: Optional[str], seed: int, with_loss: bool, detail: bool,
                      rho_ci: Optional[list[float]] = None, view: TaskView, steps: Optional[dict] = None,
                      difficulty_varies: bool = True, sparkline_column: bool = True) -> Report:
    """eval / extrapolate: one bucket per difficulty of one checkpoint. steps: those run and
    trained (api.steps_run; None: as trained). Where the difficulty did not vary (`eval` at 0°)
    the caption leaves out Spearman's rho, which nobody asked about."""
    steps = steps_of(cfg, steps)
    images = sum(b["images"] for b in buckets)
    for bucket in buckets:
        if detail:
            with_best_fixed(bucket)
        bucket.update(checkpoint=checkpoint, method=cfg.method.name, step=cfg.step.name)
        bucket["halting_spark"] = sparkline(bucket["histogram"], width=20)
        for key in CONTROL_KEYS:  # --detail's controls after every key that came before them
            if key in bucket:
                bucket[key] = bucket.pop(key)
    used = buckets[0]["halting"]
    repeats = buckets[0].get("repeats", 1)
    words = view.terms
    meta = make_meta(command, [checkpoint], [cfg.method.name], [cfg.step.name], protocol=protocol, halting=used,
                     seed=seed,
                     task=view.name, repeats=repeats, **view.meta, **steps,
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
    report = Report(
        meta=meta, buckets=buckets,
        columns=bucket_columns(cfg.method.max_steps, with_loss, not with_loss, words, budget=detail,
                               buckets=buckets),
        title=f"{cfg.method.name} on the {what} ({checkpoint})",
        caption=f"{describe_model(cfg, view)}{steps_caption(steps)}\n{how}halting {used} · seed {seed}{draws}\n"
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


def sweep_columns(first: Column) -> list[Column]:
    return [first, accuracy_column(True), Column("mean_steps", "steps", ".2f"),
            Column("steps_correct", "steps ✓", ".2f"), Column("steps_wrong", "steps ✗", ".2f"),
            Column("images", "images" if first.key == "rotation" else "inputs")]


SWEEP_COLUMNS = sweep_columns(Column("rotation", "|angle|", "g"))


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
    report.columns = sweep_columns(Column(words.sweep_key, words.sweep_header, "g"))
    report.title = f"{cfg.method.name} {words.sweep_name} sweep ({checkpoint})"
    if slope is None:
        report.caption += f"\nleast squares: undefined (one {words.sweep_header} only; a slope needs two)"
    else:
        report.caption += (f"\nleast squares: steps = {intercept:.2f} {'-' if slope < 0 else '+'} "
                           f"{abs(words.sweep_scale * slope):.3f} per {words.sweep_unit}"
                           + (f" (r² {r2:.2f})" if r2 is not None else ""))
    report.plot_kind = "sweep"
    return report


# calibrate -------------------------------------------------------------------------------------

CALIBRATION_COLUMNS = [
    Column("halting", "rule", "s"), Column("mean_steps", "steps", ".2f"), Column("accuracy", "accuracy", ".4f"),
    Column("gap", "gap", "+.4f"), Column("agreement", "agrees", ".4f"), Column("agreement_lower", "bound", ".4f"),
    Column("chosen", "verdict", "s", text=lambda row: "chosen" if row["chosen"] else "ok" if row["admitted"] else ""),
]


def calibration_report(checkpoint: str, cfg, outcomes: list, chosen: Optional[str], *, tolerance: float,
                       sets: list[dict], protocol: Optional[str], seed: int, repeats: int = 1,
                       view: TaskView, data: str = "validation", steps: Optional[dict] = None,
                       more: str = "--repeats N (more draws pooled)") -> Report:
    """calibrate: one bucket per candidate rule (evaluate.RuleOutcome); `chosen` the cheapest whose
    agreement's lower bound clears 1 - tolerance (None: none). gap: the last step's accuracy
    minus the halting step's. `more`: how to calibrate on more inputs, for the advice."""
    words, steps = view.terms, steps_of(cfg, steps)
    floor = 1 - tolerance
    buckets = []
    for outcome in outcomes:
        bucket = outcome.as_dict()
        bucket.update(gap=bucket["accuracy_last"] - bucket["accuracy"], within_tolerance=bucket["agreement"] >= floor
                      - 1e-12, admitted=bucket["agreement_lower"] >= floor - 1e-12, chosen=bucket["halting"] == chosen)
        buckets.append(bucket)
    images = buckets[0]["images"]
    meta = make_meta("calibrate", [checkpoint], [cfg.method.name], [cfg.step.name], protocol=protocol, halting=None,
                     seed=seed,
                     task=view.name, repeats=repeats, **view.meta, **steps, data=data, sets=sets, images=images,
                     tolerance=tolerance, criterion="agreement", bound="wilson one-sided 95%", chosen=chosen)
    labels = ", ".join(words.label(s) for s in sets)
    draws = f" · {repeats} draws pooled (seeds {seed}–{seed + repeats - 1})" if repeats > 1 else f" · seed {seed}"
    how = f"protocol {protocol} · " if protocol is not None else ""
    if chosen is not None:
        footer = f"chosen: {chosen} (fewest steps with bound ≥ {floor:.1%}): --halting {chosen}"
    else:
        footer = (f"chosen: none (no rule's bound reaches {floor:.1%} on {images} {words.inputs}): raise "
                  f"--tolerance, or calibrate on more: {more}")
    return Report(meta=meta, buckets=buckets, columns=CALIBRATION_COLUMNS,
                  title=f"Exit rules on the {data} set ({checkpoint})",
                  caption=f"{describe_model(cfg, view)}{steps_caption(steps)}\n{images} {data} {words.inputs} "
                          f"({how}{labels}){draws}\n"
                          f"accuracy at the last step: {buckets[0]['accuracy_last']:.4f} · gap: it minus accuracy\n"
                          f"agrees: share whose class is the last step's · bound: its\n"
                          f"one-sided 95% lower bound (Wilson) · ok: bound ≥ {floor:.1%}",
                  footer=footer)


# calibrate --max-loss --risk: a rule whose loss is bounded ---------------------------------------

def confidence_text(risk: float) -> str:
    """1 - risk as a percentage: 0.1 -> "90%", 0.025 -> "97.5%", 0.1 / 3 -> "96.67%"."""
    return f"{(1 - risk) * 100:.4g}%"


def _risk_verdict(row: dict) -> str:
    return "chosen" if row["chosen"] else "pass" if row["passed"] else "fail" if row["tested"] else "not tested"


RISK_COLUMNS = [
    Column("halting", "rule", "s"), Column("mean_steps", "steps", ".2f"), Column("accuracy", "accuracy", ".4f"),
    Column("losses", "differ", "d"), Column("loss", "loss", ".4f"), Column("bound", "bound", ".4f"),
    Column("chosen", "verdict", "s", text=_risk_verdict),
]


def risk_calibration_report(checkpoint: str, cfg, tests: list, chosen: Optional[str], *, max_loss: float,
                            risk: float, sets: list[dict], protocol: Optional[str], seed: int, view: TaskView,
                            data: str = "validation", steps: Optional[dict] = None) -> Report:
    """calibrate --max-loss --risk: one bucket per candidate (evaluate.RiskTest) in the order
    tested, with its loss, its Clopper–Pearson bound and whether it passed."""
    words, steps = view.terms, steps_of(cfg, steps)
    buckets = [{**test.as_dict(), "gap": test.accuracy_last - test.accuracy, "chosen": test.halting == chosen}
               for test in tests]
    images, families = buckets[0]["images"], len({test.family for test in tests})
    level = buckets[0]["level"]
    picked = next((b for b in buckets if b["chosen"]), None)
    meta = make_meta("calibrate", [checkpoint], [cfg.method.name], [cfg.step.name], protocol=protocol, halting=None,
                     seed=seed, task=view.name, repeats=1, **view.meta, **steps, data=data, sets=sets, images=images,
                     criterion="risk", max_loss=max_loss, risk=risk, bound="clopper-pearson upper",
                     test="fixed sequence", families=families, level=level, chosen=chosen,
                     chosen_bound=picked["bound"] if picked else None,
                     chosen_mean_steps=picked["mean_steps"] if picked else None)
    labels = ", ".join(words.label(s) for s in sets)
    how = f"protocol {protocol} · " if protocol is not None else ""
    split = (f"{families} families, each at risk {level:.4g} (--risk / {families})" if families > 1
             else f"at risk {level:g}")
    footer = (f"chosen: {chosen} (loss ≤ {picked['bound']:.4f} at {confidence_text(risk)}, "
              f"{picked['mean_steps']:.2f} steps): --halting {chosen}" if picked else
              f"chosen: none (no candidate's bound reaches {max_loss:g})")
    return Report(meta=meta, buckets=buckets, columns=RISK_COLUMNS,
                  title=f"Bounded-loss exit rules ({checkpoint})",
                  caption=f"{describe_model(cfg, view)}{steps_caption(steps)}\n{images} {data} {words.inputs} "
                          f"({how}{labels}) · seed {seed}\n"
                          f"loss: share whose class differs from the last step's ({images} {words.inputs})\n"
                          f"bound: its exact upper {confidence_text(level)} bound (Clopper–Pearson)\n"
                          f"tested family by family from the most steps, {split}:\n"
                          f"a family stops at its first bound above --max-loss {max_loss:g}\n"
                          f"chosen: the fewest mean steps of those that passed",
                  footer=footer)
