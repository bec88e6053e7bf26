"""The halting study's tables (docs/halting.md): for each variant, its checkpoints (one per seed)
evaluated on the same rotations and coins.

    python tools/figures/halting_study.py NAME=CHECKPOINT[,CHECKPOINT...] ... [--limit N] [--seed S] [--draws K]

Several checkpoints: each figure the mean over them ± half its 95% interval (Student's t).
One checkpoint and `--draws K`: K evaluation draws (seeds S, S + 1, ...: rotations and coins),
each figure the mean over them ± its standard error; with several checkpoints too, each
checkpoint's figures are first averaged over the draws.

Per bucket (MNIST test digits rotated within ±angle, the uniform protocol) and variant:
- the sampled rule (PonderNet's coins; ACT: its own rule): accuracy and mean steps;
- the median rule's accuracy and mean steps (PonderNet only);
- the last trained step's accuracy and the gap to it (last − sampled): what halting leaves;
- the best fixed budget, or mix of two, in no more than the sampled rule's mean steps
  (`best_fixed_accuracy`): adapting against not;
- run to twice the trained steps N (`--max-steps 2N`): the sampled rule, the last step's accuracy
  and its gain over the last trained step's (what more steps than trained give);
- Spearman's ρ between |angle| and the sampled steps, over every bucket's digits.

Each figure is one of `ponder extrapolate CHECKPOINT --seed S --detail [--halting median]
[--max-steps 2N]`'s, through the library (`api.evaluate_checkpoint`), so the study can be
rerun from the commands the docs give.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ponder_cli.api import EvalOptions, evaluate_checkpoint  # noqa: E402
from ponder_cli.reports.uncertainty import mean_ci  # noqa: E402
from ponder_cli.tasks.mnist import parse_angles  # noqa: E402

ANGLES = ["22.5", "45", "67.5", "90"]


def figures(checkpoint: str, angles, options: dict) -> dict:
    """Every figure of one checkpoint: {figure: [per bucket]} and "rho"."""
    run = lambda **more: evaluate_checkpoint("extrapolate", checkpoint, angles,  # noqa: E731
                                             EvalOptions(detail=True, **options, **more))
    sampled = run()
    pondernet = sampled.meta["method"] == "pondernet"
    trained = sampled.meta["max_steps"]
    median = run(halting="median") if pondernet else None
    longer = run(max_steps=2 * trained)
    out = {"rho": [sampled.meta["spearman"]["rho"]]}
    for index, bucket in enumerate(sampled.buckets):
        row = {"accuracy": bucket["accuracy"], "steps": bucket["mean_steps"],
               "last": bucket["accuracy_at_step"][-1],
               "gap": bucket["accuracy_at_step"][-1] - bucket["accuracy"],
               "budget": bucket["best_fixed_accuracy"],
               "adapting": bucket["accuracy"] - bucket["best_fixed_accuracy"],
               "twice": longer.buckets[index]["accuracy"], "twice_last": longer.buckets[index]["accuracy_at_step"][-1],
               "twice_gain": longer.buckets[index]["accuracy_at_step"][-1] - bucket["accuracy_at_step"][-1]}
        if median is not None:
            row.update(median=median.buckets[index]["accuracy"], median_steps=median.buckets[index]["mean_steps"])
        for key, value in row.items():
            out.setdefault(key, []).append(value)
    return out


def cell(values: list[float], digits: int = 4, signed: bool = False, se: bool = False) -> str:
    """The mean of `values`, ± half its 95% interval over seeds, or ± its standard error (`se`)."""
    mean, ci = mean_ci(values)
    text = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    if ci is None:
        return text
    spread = statistics.stdev(values) / math.sqrt(len(values)) if se else (ci[1] - ci[0]) / 2
    return f"{text} ±{spread:.{digits}f}"


def averaged(draws: list[dict]) -> dict:
    """One checkpoint's figures averaged over its draws."""
    return {key: [statistics.fmean(values) for values in zip(*(draw[key] for draw in draws))] for key in draws[0]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", metavar="NAME=CHECKPOINT[,CHECKPOINT...]")
    parser.add_argument("--angles", nargs="+", default=ANGLES)
    parser.add_argument("--limit", type=int, default=0, help="first N test digits per bucket (0: all 10,000)")
    parser.add_argument("--seed", type=int, default=1234, help="the rotations and coins, the same for every model")
    parser.add_argument("--draws", type=int, default=1, help="evaluation draws per checkpoint (seeds seed, seed + 1, ...)")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write every figure per checkpoint here")
    args = parser.parse_args(argv)
    angles = parse_angles(args.angles)
    options = dict(limit=args.limit, data_dir=args.data_dir)
    per_variant, raw, by_draw = {}, {}, {}
    for spec in args.variants:
        name, _, checkpoints = spec.partition("=")
        draws = {checkpoint: [figures(checkpoint, angles, {**options, "seed": args.seed + k}) for k in range(args.draws)]
                 for checkpoint in checkpoints.split(",")}
        raw[name] = draws
        # one checkpoint: the spread is the draws'; several: the seeds', each averaged over its draws
        by_draw[name] = len(draws) == 1 and args.draws > 1
        runs = next(iter(draws.values())) if by_draw[name] else [averaged(d) for d in draws.values()]
        per_variant[name] = {key: [[run[key][i] for run in runs] for i in range(len(runs[0][key]))]
                             for key in runs[0]}
        print(f"{name}: {len(draws)} checkpoint(s) evaluated, {args.draws} draw(s) each", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps(raw, indent=1))
    spreads = "; ".join(f"{name}: {len(raw[name])} checkpoint(s)" + (" ± SE over draws" if by_draw[name] else "")
                        for name in per_variant)
    seeds = f"seeds {args.seed}–{args.seed + args.draws - 1}" if args.draws > 1 else f"seed {args.seed}"
    print(f"\nMeans ± half the 95% interval over checkpoints (Student's t), or ± the standard error over "
          f"draws: {spreads}. Evaluation {seeds}"
          + (f", first {args.limit} digits per bucket" if args.limit else "") + ".\n")
    header = ("| variant | ±deg | sampled acc | steps | median acc / steps | last step | gap (last − sampled) | "
              "best fixed ≤ steps | adapting − best fixed | sampled at 2N | last step 2N | 2N − N (last steps) |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for name, v in per_variant.items():
        se = by_draw[name]
        for i, angle in enumerate(angles):
            median = (f"{cell(v['median'][i], se=se)} / {cell(v['median_steps'][i], 2, se=se)}" if "median" in v
                      else "n/a")
            print(f"| {name} | {angle:g} | {cell(v['accuracy'][i], se=se)} | {cell(v['steps'][i], 2, se=se)} | "
                  f"{median} | {cell(v['last'][i], se=se)} | {cell(v['gap'][i], signed=True, se=se)} | "
                  f"{cell(v['budget'][i], se=se)} | {cell(v['adapting'][i], signed=True, se=se)} | "
                  f"{cell(v['twice'][i], se=se)} | {cell(v['twice_last'][i], se=se)} | "
                  f"{cell(v['twice_gain'][i], signed=True, se=se)} |")
    print("\n| variant | Spearman ρ(|angle|, sampled steps) |\n|---|---|")
    for name, v in per_variant.items():
        print(f"| {name} | {cell(v['rho'][0], 3, signed=True, se=by_draw[name])} |")


if __name__ == "__main__":
    main()
