"""Every exit rule on the MNIST test digits at exactly each angle, from one forward pass per batch.

    python benchmarks/exit_rules.py CHECKPOINT [--angles 0 22.5 45 67.5 90] [--repeats 1] \\
        [--rules median quantile:0.9 confidence:0.99 ...] [--limit N] [-f json]

For each rule and angle: accuracy at the rule's halting step, mean steps, and the gap (accuracy at
the last step minus accuracy at the halting step, in points). The rules see the same draws of
rotations (`ponder extrapolate --protocol fixed`'s: seeds seed, seed + 1, ... for the repeats) and
the same forward pass over every step, so a rule costs no extra pass; each halting rule is the one
`ponder extrapolate --halting RULE` applies (calibrate.rule_outcomes, per angle). Deterministic
rules only (the sample rule's coins are drawn too, but one draw of them is noisy).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ponder_cli.api import EvalOptions  # noqa: E402
from ponder_cli.calibrate import rule_outcomes  # noqa: E402
from ponder_cli.checkpoint import load_model  # noqa: E402
from ponder_cli.halting_rules import CALIBRATION_RULES  # noqa: E402
from ponder_cli.runs import resolve_checkpoint  # noqa: E402
from ponder_cli.tasks import get_task  # noqa: E402

DEFAULT_RULES = ["median", *CALIBRATION_RULES[1:]]  # quantile:0.5 is the median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--angles", type=float, nargs="+", default=[0, 22.5, 45, 67.5, 90])
    parser.add_argument("--rules", nargs="+", default=DEFAULT_RULES)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--limit", type=int, default=0, help="only the first N test digits (0: all)")
    parser.add_argument("-f", "--format", choices=("table", "json"), default="table")
    args = parser.parse_args()

    path = resolve_checkpoint(args.checkpoint).path
    model, cfg, _ = load_model(path, "cpu")
    task = get_task(cfg)
    test = task.test_data(EvalOptions(limit=args.limit), "cpu")
    rows = []
    for angle in args.angles:
        buckets = [lambda k=k: task.bucket(test, angle, args.angles, model.max_steps, cfg.seed + k, "fixed")
                   for k in range(args.repeats)]
        for outcome in rule_outcomes(model, buckets, args.rules):
            rows.append({"rotation": angle, "halting": outcome.halting, "accuracy": outcome.accuracy,
                         "accuracy_last": outcome.accuracy_last, "mean_steps": outcome.mean_steps,
                         "gap": 100 * (outcome.accuracy_last - outcome.accuracy), "images": outcome.images})
    if args.format == "json":
        print(json.dumps({"checkpoint": str(path), "protocol": "fixed", "seed": cfg.seed, "repeats": args.repeats,
                          "buckets": rows}))
        return
    print(f"{path}: gap (points) / mean steps at exactly each angle, {args.repeats} draw(s)")
    print("| `--halting` | " + " | ".join(f"±{a:g}°" for a in args.angles) + " |")
    print("|---|" + "---|" * len(args.angles))
    for rule in args.rules:
        cells = [f"{r['gap']:+.2f} / {r['mean_steps']:.2f}" for r in rows if r["halting"] == rule]
        print(f"| {rule} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
