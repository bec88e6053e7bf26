"""The risk-controlled calibration study (docs/halting.md): each head's exit rule chosen by
`ponder calibrate --max-loss E --risk D` on validation digits rotated within ±22.5° and within
±90°, then tested on MNIST's test digits at ±22.5°, ±45°, ±67.5° and ±90°, over draws.

    python tools/figures/risk_study.py NAME=CHECKPOINT[,CHECKPOINT...] ... [--control NAME=CHECKPOINT ...]
        [--draws K] [--draws-upright K22] [--calibrate-at 90 22.5] [--rules RULE ...] [--max-loss E] [--risk D]
        [--limit N] [--json FILE] [--tables FILE]

For each checkpoint, calibration angle A (90 and 22.5) and draw d (seeds 1 .. K; `--draws-upright`
draws for A = 22.5, the first to cut where time is short):
1. `ponder calibrate CHECKPOINT --max-loss E --risk D --angles A --seed d`: the chosen rule, its
   bound, its loss (the share of calibration digits whose answer differs from the last step's)
   and its accuracy gap on the calibration digits (at most the loss).
2. `ponder extrapolate CHECKPOINT --halting RULE --seed d --detail` (all 10,000 test digits unless
   `--limit`): per bucket the gap to the last step (accuracy at the last step − the rule's), the
   mean steps, adapting − shuffled (the shuffled-halting null) with its standard error, the
   premature and the late halts. The gap is at most the premature share (premature − the halts
   right where they stopped and wrong at the last step), which is at most the loss.
Controls (`--control`): the same test draws under the model's own rule, for the null.

Per head and calibration angle, over the draws: the gap's mean ± its standard error and its
largest, how many draws' gap exceeded 0.3 points (`--exceed`), the mean steps, adapting −
shuffled (mean over draws, ± the mean of each draw's standard error over the digits), the
premature and late halts; then the exceedances pooled over heads and the target's verdict.
`--tables FILE` prints the tables again from an earlier run's `--json FILE`, computing nothing.
Every figure is a command's, through the library (api.calibrate_checkpoint, api.evaluate_checkpoint).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ponder_cli import PonderError  # noqa: E402
from ponder_cli.api import EvalOptions, calibrate_checkpoint, evaluate_checkpoint  # noqa: E402

TEST_ANGLES = ["22.5", "45", "67.5", "90"]
CALIBRATION_ANGLES = ["90", "22.5"]  # the target's first
TARGET = dict(gap=0.003, share=0.9, steps=4.66)  # at ±90°, calibrated at ±90°: gap ≤ 0.3 points in ≥ 90% of draws


def calibrated(checkpoint: str, angle: str, seed: int, args) -> dict:
    """calibrate --max-loss --risk --angles angle --seed seed: the chosen rule and its figures (rule
    None: no candidate's bound reached --max-loss)."""
    try:
        report = calibrate_checkpoint(checkpoint, {"--angles": [angle]}, EvalOptions(seed=seed, data_dir=args.data_dir),
                                      max_loss=args.max_loss, risk=args.risk, rules=args.rules)
    except PonderError as exc:
        return {"rule": None, "refused": str(exc)}
    chosen = next(bucket for bucket in report.buckets if bucket["chosen"])
    return {"rule": report.meta["chosen"], "bound": chosen["bound"], "loss": chosen["loss"], "gap": chosen["gap"],
            "steps": chosen["mean_steps"], "images": chosen["images"]}


def tested(checkpoint: str, rule, seed: int, args) -> dict:
    """extrapolate --halting rule --seed seed --detail: {figure: [per test bucket]} (rule None: the model's own)."""
    report = evaluate_checkpoint("extrapolate", checkpoint, {"--angles": TEST_ANGLES},
                                 EvalOptions(halting=rule, seed=seed, detail=True, limit=args.limit,
                                             data_dir=args.data_dir))
    out = {"halting": report.meta["halting"]}
    for bucket in report.buckets:
        row = {"accuracy": bucket["accuracy"], "steps": bucket["mean_steps"], "last": bucket["accuracy_at_step"][-1],
               "gap": bucket["accuracy_at_step"][-1] - bucket["accuracy"],
               "null": bucket["adapting_minus_shuffled"], "null_se": bucket["adapting_minus_shuffled_se"],
               "premature": bucket["premature_halts"], "late": bucket["late_halts"]}
        for key, value in row.items():
            out.setdefault(key, []).append(value)
    return out


def mean_se(values: list[float], scale: float = 1.0, digits: int = 2, signed: bool = False) -> str:
    mean = statistics.fmean(values) * scale
    text = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    if len(values) < 2:
        return text
    return f"{text} ±{statistics.stdev(values) / math.sqrt(len(values)) * scale:.{digits}f}"


def null_cell(draws: list[dict], b: int) -> str:
    """adapting − shuffled in points: the mean over draws ± the mean of the draws' standard errors."""
    return (f"{statistics.fmean(d['null'][b] for d in draws) * 100:+.2f} "
            f"±{statistics.fmean(d['null_se'][b] for d in draws) * 100:.2f}")


def head_table(name: str, angle: str, runs: list[list[dict]], args) -> tuple[list[str], dict]:
    """One head (its checkpoints' draws pooled) calibrated at ±angle: a row per test bucket."""
    draws = [draw for run in runs for draw in run if draw["calibration"]["rule"] is not None]
    refused = sum(draw["calibration"]["rule"] is None for run in runs for draw in run)
    rules: dict[str, int] = {}
    for draw in draws:
        rules[draw["calibration"]["rule"]] = rules.get(draw["calibration"]["rule"], 0) + 1
    lines = [f"### {name}, calibrated at ±{angle}° ({len(draws)} draws"
             + (f", {refused} refused: no candidate reached the bound" if refused else "") + ")", "",
             "rules chosen: " + ", ".join(f"{rule} ×{count}" for rule, count in sorted(rules.items())), ""]
    if not draws:
        return lines, {}
    cal = [draw["calibration"] for draw in draws]
    lines += [f"calibration digits: bound {statistics.fmean(c['bound'] for c in cal):.4f}, loss "
              f"{statistics.fmean(c['loss'] for c in cal) * 100:.2f} points, "
              f"gap {statistics.fmean(c['gap'] for c in cal) * 100:+.2f} points (gap ≤ loss in {sum(c['gap'] <= c['loss'] + 1e-12 for c in cal)} of {len(cal)}), "
              f"{statistics.fmean(c['steps'] for c in cal):.2f} steps", "",
              f"| ±deg | gap (points) | largest | gap > {args.exceed * 100:g} points | steps | adapting − shuffled "
              "(points) | premature | late |", "|---|---|---|---|---|---|---|---|"]
    counts = {}
    for b, test_angle in enumerate(TEST_ANGLES):
        gaps = [draw["test"]["gap"][b] for draw in draws]
        over = sum(gap > args.exceed for gap in gaps)
        counts[test_angle] = (over, len(gaps))
        tests = [draw["test"] for draw in draws]
        lines.append(f"| {test_angle} | {mean_se(gaps, 100, signed=True)} | {max(gaps) * 100:+.2f} | "
                     f"{over} of {len(gaps)} | {mean_se([t['steps'][b] for t in tests])} | {null_cell(tests, b)} | "
                     f"{statistics.fmean(t['premature'][b] for t in tests):.4f} | "
                     f"{statistics.fmean(t['late'][b] for t in tests):.4f} |")
    held = sum(draw["test"]["gap"][b] <= draw["test"]["premature"][b] + 1e-12 for draw in draws
               for b in range(len(TEST_ANGLES)))
    lines += ["", f"gap ≤ premature share on the test digits in {held} of {len(draws) * len(TEST_ANGLES)} buckets"]
    if len(runs) > 1:  # each checkpoint's own draws at ±90°
        for run in runs:
            own = [draw for draw in run if draw["calibration"]["rule"] is not None]
            lines.append(f"- {run[0]['checkpoint']}: " + (", ".join(
                f"{draw['calibration']['rule']} {draw['test']['gap'][-1] * 100:+.2f} points at "
                f"{draw['test']['steps'][-1]:.2f} steps" for draw in own) + " (±90°)" if own else "every draw refused"))
    lines.append("")
    steps90 = statistics.fmean(draw["test"]["steps"][-1] for draw in draws)
    kept = sum(draw["test"]["gap"][-1] <= TARGET["gap"] for draw in draws) / len(draws)
    return lines, {"counts": counts, "kept90": kept, "steps90": steps90, "draws": len(draws)}


def control_table(controls: dict) -> list[str]:
    lines = ["### Controls: each model's own rule, the same test draws", "",
             "| model | ±deg | accuracy | steps | gap (points) | adapting − shuffled (points) | premature | late |",
             "|---|---|---|---|---|---|---|---|"]
    for name, draws in controls.items():
        for b, angle in enumerate(TEST_ANGLES):
            lines.append(f"| {name} ({draws[0]['halting']}) | {angle} | "
                         f"{mean_se([d['accuracy'][b] for d in draws], digits=4)} | "
                         f"{mean_se([d['steps'][b] for d in draws])} | {mean_se([d['gap'][b] for d in draws], 100, signed=True)} | "
                         f"{null_cell(draws, b)} | {statistics.fmean(d['premature'][b] for d in draws):.4f} | "
                         f"{statistics.fmean(d['late'][b] for d in draws):.4f} |")
    return lines + [""]


def summary(verdicts: dict, args) -> list[str]:
    lines = [f"### Draws whose test gap exceeded {args.exceed * 100:g} points, pooled over heads", "",
             "| calibrated at | " + " | ".join(f"±{a}°" for a in TEST_ANGLES) + " |", "|---|" + "---|" * len(TEST_ANGLES)]
    for angle in args.calibrate_at:
        cells = []
        for test_angle in TEST_ANGLES:
            over = sum(v[angle]["counts"][test_angle][0] for v in verdicts.values() if v.get(angle))
            total = sum(v[angle]["counts"][test_angle][1] for v in verdicts.values() if v.get(angle))
            cells.append(f"{over} of {total}")
        lines.append(f"| ±{angle}° | " + " | ".join(cells) + " |")
    lines += ["", f"Target (calibrated at ±90°, tested at ±90°: gap ≤ {TARGET['gap'] * 100:g} points in ≥ "
              f"{TARGET['share']:.0%} of draws at ≤ {TARGET['steps']} mean steps):"]
    for name, v in verdicts.items():
        if v.get("90"):
            met = v["90"]["kept90"] >= TARGET["share"] and v["90"]["steps90"] <= TARGET["steps"]
            lines.append(f"- {name}: gap kept in {v['90']['kept90']:.0%} of {v['90']['draws']} draws at "
                         f"{v['90']['steps90']:.2f} steps: {'met' if met else 'missed'}")
    return lines + [""]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("heads", nargs="+", metavar="NAME=CHECKPOINT[,CHECKPOINT...]")
    parser.add_argument("--control", action="append", default=[], metavar="NAME=CHECKPOINT",
                        help="also test this model under its own rule (the null's control)")
    parser.add_argument("--draws", type=int, default=5, help="evaluation seeds 1 .. K, calibration and test alike")
    parser.add_argument("--draws-upright", type=int, default=None, help="draws for the ±22.5° calibration (default --draws)")
    parser.add_argument("--calibrate-at", nargs="+", default=CALIBRATION_ANGLES, choices=CALIBRATION_ANGLES,
                        help="the calibration angles (both by default)")
    parser.add_argument("--rules", nargs="+", default=None, help="calibrate's candidates (default: its own)")
    parser.add_argument("--max-loss", type=float, default=0.003)
    parser.add_argument("--risk", type=float, default=0.1)
    parser.add_argument("--exceed", type=float, default=0.003, help="the gap counted as exceeded (0.003: 0.3 points)")
    parser.add_argument("--limit", type=int, default=0, help="first N test digits per bucket (0: all 10,000)")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here, as it comes")
    parser.add_argument("--tables", type=Path, default=None,
                        help="tabulate a --json file of an earlier run (the same heads and options) instead")
    args = parser.parse_args(argv)
    upright = args.draws if args.draws_upright is None else args.draws_upright
    results: dict = {"heads": {}, "controls": {}}
    save = (lambda: args.json.write_text(json.dumps(results, indent=1))) if args.json and not args.tables \
        else (lambda: None)
    earlier = json.loads(args.tables.read_text()) if args.tables else None
    verdicts = {}
    for spec in args.heads:
        name, _, checkpoints = spec.partition("=")
        head = results["heads"][name] = {}
        verdicts[name] = {}
        tests: dict = {}  # a rule chosen twice for a checkpoint and draw is tested once
        for angle in args.calibrate_at:
            runs = head[angle] = []
            for checkpoint in checkpoints.split(","):
                runs.append([])
                for seed in range(1, (upright if angle == "22.5" else args.draws) + 1):
                    if earlier is not None:
                        runs[-1] = earlier["heads"][name][angle][len(runs) - 1]
                        break
                    calibration = calibrated(checkpoint, angle, seed, args)
                    draw = {"checkpoint": checkpoint, "seed": seed, "calibration": calibration}
                    if calibration["rule"] is not None:
                        key = (checkpoint, calibration["rule"], seed)
                        draw["test"] = tests[key] = tests.get(key) or tested(checkpoint, calibration["rule"], seed, args)
                    runs[-1].append(draw)
                    save()
            lines, verdicts[name][angle] = head_table(name, angle, runs, args)
            print("\n".join(lines), flush=True)
    for spec in args.control:
        name, _, checkpoint = spec.partition("=")
        results["controls"][name] = (earlier["controls"][name] if earlier is not None else
                                     [tested(checkpoint, None, seed, args) for seed in range(1, args.draws + 1)])
        save()
    if results["controls"]:
        print("\n".join(control_table(results["controls"])), flush=True)
    print("\n".join(summary(verdicts, args)), flush=True)


if __name__ == "__main__":
    main()
