"""Print the README's extrapolation results as Markdown: every protocol x halting rule.

    python tools/figures/results_table.py [CHECKPOINT] [--angles 22.5 45 67.5 90]   # default: reference

Evaluates the checkpoint through the library (`api.evaluate_checkpoint`, full test set, the
checkpoint's seed) for each combination and prints one table per halting rule with accuracy /
mean steps per bucket, steps on correct and wrong images, and Spearman's rho between |angle|
and steps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ponder_cli.api import EvalOptions, evaluate_checkpoint
from ponder_cli.tasks.mnist import parse_angles  # noqa: E402
from ponder_cli.registry import HALTING_RULES, PROTOCOLS, RULE_PARAMETERS, parse_halting_rule  # noqa: E402


def halting_rule(text: str) -> str:
    try:
        return parse_halting_rule(text).spelling
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint", nargs="?", default="reference",
                        help="as ponder eval's CHECKPOINT: a file, a run folder, latest or a shipped model's name")
    parser.add_argument("--angles", nargs="+", default=["22.5", "45", "67.5", "90"])
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    # the rules without a parameter by default; quantile:Q and patience:K when named
    parser.add_argument("--halting", nargs="+", type=halting_rule,
                        default=[rule for rule in HALTING_RULES if rule not in RULE_PARAMETERS])
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=0, help="the first N test digits (0: all)")
    args = parser.parse_args(argv)
    angles = parse_angles(args.angles)
    for rule in args.halting:
        print(f"\nhalting `{rule}`:\n")
        print("| protocol | " + " | ".join(f"±{a:g}°" for a in angles) + " | steps ✓ / ✗ (all buckets) | Spearman ρ |")
        print("|---" * (len(angles) + 3) + "|")
        for protocol in args.protocols:
            report = evaluate_checkpoint("extrapolate", args.checkpoint, angles,
                                         EvalOptions(protocol=protocol, halting=rule, data_dir=args.data_dir,
                                                     limit=args.limit))
            buckets = report.buckets
            cells = [f"{b['accuracy']:.4f} / {b['mean_steps']:.2f}" for b in buckets]
            n = sum(b["images"] for b in buckets)
            right = sum(b["accuracy"] * b["images"] for b in buckets)
            steps_right = sum((b["steps_correct"] or 0) * b["accuracy"] * b["images"] for b in buckets)
            steps_wrong = sum((b["steps_wrong"] or 0) * (1 - b["accuracy"]) * b["images"] for b in buckets)
            rho = report.meta["spearman"]["rho"]
            print(f"| {protocol} | " + " | ".join(cells) +
                  f" | {steps_right / right:.2f} / {steps_wrong / (n - right):.2f} | "
                  f"{'n/a' if rho is None else f'{rho:+.3f}'} |")


if __name__ == "__main__":
    main()
