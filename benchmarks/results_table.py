"""Print the README's extrapolation results as Markdown: every protocol x halting rule.

    python benchmarks/results_table.py [CHECKPOINT] [--angles 22.5 45 67.5 90]

Runs `ponder extrapolate --format json` for each combination (full test set, default seed) and
prints one table per halting rule with accuracy / mean steps per bucket, steps on correct and
wrong images, and Spearman's rho between |angle| and steps.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint", nargs="?", default="checkpoints/best.pt")
    parser.add_argument("--angles", nargs="+", default=["22.5", "45", "67.5", "90"])
    parser.add_argument("--protocols", nargs="+", default=["uniform", "band", "fixed"])
    parser.add_argument("--halting", nargs="+", default=["sample", "median", "expected"])
    args = parser.parse_args()
    for rule in args.halting:
        print(f"\nhalting `{rule}`:\n")
        print("| protocol | " + " | ".join(f"±{a}°" for a in args.angles) + " | steps ✓ / ✗ (all buckets) | Spearman ρ |")
        print("|---" * (len(args.angles) + 3) + "|")
        for protocol in args.protocols:
            done = subprocess.run(
                [sys.executable, "-m", "ponder_cli", "extrapolate", args.checkpoint, "--angles", *args.angles,
                 "--protocol", protocol, "--halting", rule, "--format", "json"],
                capture_output=True, text=True)
            if done.returncode:
                sys.exit(done.stderr.strip().splitlines()[-1])
            data = json.loads(done.stdout)
            cells = [f"{b['accuracy']:.4f} / {b['mean_steps']:.2f}" for b in data["buckets"]]
            n = sum(b["images"] for b in data["buckets"])
            right = sum(b["accuracy"] * b["images"] for b in data["buckets"])
            steps_right = sum((b["steps_correct"] or 0) * b["accuracy"] * b["images"] for b in data["buckets"])
            steps_wrong = sum((b["steps_wrong"] or 0) * (1 - b["accuracy"]) * b["images"] for b in data["buckets"])
            rho = data["spearman"]["rho"]
            print(f"| {protocol} | " + " | ".join(cells) +
                  f" | {steps_right / right:.2f} / {steps_wrong / (n - right):.2f} | "
                  f"{'n/a' if rho is None else f'{rho:+.3f}'} |")


if __name__ == "__main__":
    main()
