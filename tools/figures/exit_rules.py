"""Every exit rule on the MNIST test digits at exactly each angle, from one forward pass per batch.

    python tools/figures/exit_rules.py CHECKPOINT [--angles 0 22.5 45 67.5 90] [--repeats 1] \\
        [--rules median quantile:0.9 confidence:0.99 ...] [--limit N] [-f json]
    python tools/figures/exit_rules.py rules-*.json     # several checkpoints' -f json: mean and sd

For each rule and angle: accuracy at the rule's halting step, mean steps, and the gap (accuracy at
the last step minus accuracy at the halting step, in points). The rules see the same draws of
rotations (`ponder extrapolate --protocol fixed`'s: seeds seed, seed + 1, ... for the repeats) and
the same forward pass over every step, so a rule costs no extra pass; each halting rule is the one
`ponder extrapolate --halting RULE` applies (evaluate.rule_outcomes, per angle). Deterministic
rules only (the sample rule's coins are drawn too, but one draw of them is noisy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ponder_cli.api import EvalOptions  # noqa: E402
from ponder_cli.evaluate import rule_outcomes  # noqa: E402
from ponder_cli.checkpoint import load_model  # noqa: E402
from ponder_cli.registry import CALIBRATION_RULES  # noqa: E402
from ponder_cli.folders import resolve_checkpoint  # noqa: E402
from ponder_cli.tasks import get_task  # noqa: E402

DEFAULT_RULES = ["median", *CALIBRATION_RULES[1:]]  # quantile:0.5 is the median


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="+", help="a checkpoint, or reports of this script's -f json")
    parser.add_argument("--angles", type=float, nargs="+", default=[0, 22.5, 45, 67.5, 90])
    parser.add_argument("--rules", nargs="+", default=DEFAULT_RULES)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--limit", type=int, default=0, help="only the first N test digits (0: all)")
    parser.add_argument("-f", "--format", choices=("table", "json"), default="table")
    parser.add_argument("--data-dir", type=Path, default=None, help="the MNIST folder (default: PONDER_DATA_DIR)")
    args = parser.parse_args(argv)
    if all(name.endswith(".json") for name in args.checkpoint):
        summarise([json.loads(Path(name).read_text()) for name in args.checkpoint])
        return
    if len(args.checkpoint) > 1:
        parser.error("one checkpoint at a time (or only .json reports, to summarise them)")

    path = resolve_checkpoint(args.checkpoint[0]).path
    model, cfg, _ = load_model(path, "cpu")
    task = get_task(cfg)
    test = task.test_data(EvalOptions(limit=args.limit, data_dir=args.data_dir), "cpu")
    rows = []
    for angle in args.angles:
        buckets = [lambda k=k: task.bucket(test, angle, args.angles, model.max_steps, cfg.training.seed + k, "fixed")
                   for k in range(args.repeats)]
        for outcome in rule_outcomes(model, buckets, args.rules):
            rows.append({"rotation": angle, "halting": outcome.halting, "accuracy": outcome.accuracy,
                         "accuracy_last": outcome.accuracy_last, "mean_steps": outcome.mean_steps,
                         "gap": 100 * (outcome.accuracy_last - outcome.accuracy), "images": outcome.images})
    if args.format == "json":
        print(json.dumps({"checkpoint": str(path), "protocol": "fixed", "seed": cfg.training.seed,
                          "repeats": args.repeats,
                          "buckets": rows}))
        return
    print(f"{path}: gap (points) / mean steps at exactly each angle, {args.repeats} draw(s)")
    print("| `--halting` | " + " | ".join(f"±{a:g}°" for a in args.angles) + " |")
    print("|---|" + "---|" * len(args.angles))
    for rule in args.rules:
        cells = [f"{r['gap']:+.2f} / {r['mean_steps']:.2f}" for r in rows if r["halting"] == rule]
        print(f"| {rule} | " + " | ".join(cells) + " |")


def summarise(reports: list[dict]) -> None:
    """Mean (and sd over the reports, when several) of each rule's gap and steps per angle."""
    cells: dict = {}
    for report in reports:
        for row in report["buckets"]:
            cells.setdefault(row["halting"], {}).setdefault(row["rotation"], []).append(row)
    angles = sorted({row["rotation"] for report in reports for row in report["buckets"]})
    print(f"{len(reports)} checkpoint(s): gap (points, mean ± sd) / mean steps at exactly each angle")
    print("| `--halting` | " + " | ".join(f"±{a:g}°" for a in angles) + " |")
    print("|---|" + "---|" * len(angles))
    for rule, by_angle in cells.items():
        line = []
        for a in angles:
            gaps, steps = [r["gap"] for r in by_angle[a]], [r["mean_steps"] for r in by_angle[a]]
            spread = f" ± {statistics.stdev(gaps):.2f}" if len(gaps) > 1 else ""
            line.append(f"{statistics.mean(gaps):+.2f}{spread} / {statistics.mean(steps):.2f}")
        print(f"| {rule} | " + " | ".join(line) + " |")


if __name__ == "__main__":
    main()
