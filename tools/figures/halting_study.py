"""The halting study's table (docs/halting.md): for each variant, its checkpoints (one per seed)
evaluated on the same rotations and coins, figures averaged over seeds with 95% intervals.

    python benchmarks/halting_study.py NAME=CHECKPOINT[,CHECKPOINT...] ... [--limit N] [--seed S]

Per bucket (MNIST test digits rotated within ±angle, the uniform protocol) and variant:
- the sampled rule (PonderNet's coins; ACT: its own rule): accuracy and mean steps;
- the median rule's accuracy and mean steps (PonderNet only);
- the last trained step's accuracy and the gap to it (last − sampled): what halting leaves;
- a fixed budget at the sampled rule's mean steps (`budget_accuracy`): adapting against not;
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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
               "budget": bucket["budget_accuracy"],
               "adapting": bucket["accuracy"] - bucket["budget_accuracy"],
               "twice": longer.buckets[index]["accuracy"], "twice_last": longer.buckets[index]["accuracy_at_step"][-1],
               "twice_gain": longer.buckets[index]["accuracy_at_step"][-1] - bucket["accuracy_at_step"][-1]}
        if median is not None:
            row.update(median=median.buckets[index]["accuracy"], median_steps=median.buckets[index]["mean_steps"])
        for key, value in row.items():
            out.setdefault(key, []).append(value)
    return out


def cell(values: list[float], digits: int = 4, signed: bool = False) -> str:
    mean, ci = mean_ci(values)
    text = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    return text if ci is None else f"{text} ±{(ci[1] - ci[0]) / 2:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", metavar="NAME=CHECKPOINT[,CHECKPOINT...]")
    parser.add_argument("--angles", nargs="+", default=ANGLES)
    parser.add_argument("--limit", type=int, default=0, help="first N test digits per bucket (0: all 10,000)")
    parser.add_argument("--seed", type=int, default=1234, help="the rotations and coins, the same for every model")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write every figure per checkpoint here")
    args = parser.parse_args()
    angles = parse_angles(args.angles)
    options = dict(seed=args.seed, limit=args.limit, data_dir=args.data_dir)
    per_variant, raw = {}, {}
    for spec in args.variants:
        name, _, checkpoints = spec.partition("=")
        runs = [figures(checkpoint, angles, options) for checkpoint in checkpoints.split(",")]
        raw[name] = dict(zip(checkpoints.split(","), runs))
        per_variant[name] = {key: [[run[key][i] for run in runs] for i in range(len(runs[0][key]))]
                             for key in runs[0]}
        print(f"{name}: {len(runs)} checkpoint(s) evaluated", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps(raw, indent=1))
    seeds = "; ".join(f"{name}: {len(next(iter(v.values()))[0])}" for name, v in per_variant.items())
    print(f"\nMeans over seeds ± half the 95% interval (Student's t; none from one seed). Seeds: {seeds}. "
          f"Evaluation seed {args.seed}" + (f", first {args.limit} digits per bucket" if args.limit else "") + ".\n")
    header = ("| variant | ±deg | sampled acc | steps | median acc / steps | last step | gap (last − sampled) | "
              "fixed at same steps | adapting − fixed | sampled at 2N | last step 2N | 2N − N (last steps) |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for name, v in per_variant.items():
        for i, angle in enumerate(angles):
            median = (f"{cell(v['median'][i])} / {cell(v['median_steps'][i], 2)}" if "median" in v else "n/a")
            print(f"| {name} | {angle:g} | {cell(v['accuracy'][i])} | {cell(v['steps'][i], 2)} | {median} | "
                  f"{cell(v['last'][i])} | {cell(v['gap'][i], signed=True)} | {cell(v['budget'][i])} | "
                  f"{cell(v['adapting'][i], signed=True)} | {cell(v['twice'][i])} | {cell(v['twice_last'][i])} | "
                  f"{cell(v['twice_gain'][i], signed=True)} |")
    print("\n| variant | Spearman ρ(|angle|, sampled steps) |\n|---|---|")
    for name, v in per_variant.items():
        print(f"| {name} | {cell(v['rho'][0], 3, signed=True)} |")


if __name__ == "__main__":
    main()
