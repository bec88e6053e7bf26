"""The align step's fixed-protocol targets, per training seed and as the mean over seeds.

    for s in 1234 1 2; do
      ponder extrapolate runs/pondernet-align-seed$s/best.pt --angles 0 22.5 45 67.5 90 \\
        --protocol fixed --halting median --detail --repeats 5 -f json > fixed-pondernet-$s.json
    done
    python tools/figures/align_targets.py fixed-*.json

Reads `extrapolate --protocol fixed --detail -f json` reports (any methods and halting rules;
grouped by both) and prints a Markdown table: accuracy at exactly ±45° and ±67.5°, mean steps at
each angle, Spearman's ρ, in how many buckets misclassified digits got more steps than correct
ones, and how far accuracy at the halting step falls below accuracy at the last step (0° to
67.5°). Reports of the uniform protocol (`extrapolate --angles 22.5 45 67.5 90 --repeats 5 -f
json`) among them give a second table: accuracy within ±angle per seed, and mean ± sd.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ANGLES = (0.0, 22.5, 45.0, 67.5, 90.0)
GAP_ANGLES = (0.0, 22.5, 45.0, 67.5)


def figures(report: dict) -> dict:
    """One report's figures, keyed by what the targets name."""
    bucket = {b["rotation"]: b for b in report["buckets"]}
    missing = [a for a in ANGLES if a not in bucket]
    if missing or report["protocol"] != "fixed" or "accuracy_at_step" not in bucket[ANGLES[0]]:
        raise SystemExit(f"{report['checkpoints'][0]}: need --protocol fixed --detail at {ANGLES}")
    steps = [bucket[a]["mean_steps"] for a in ANGLES]
    wrong_more = sum(1 for a in ANGLES
                     if bucket[a]["steps_wrong"] is not None and bucket[a]["steps_wrong"] > bucket[a]["steps_correct"])
    return {
        "acc45": bucket[45.0]["accuracy"], "acc67": bucket[67.5]["accuracy"],
        **{f"steps{a:g}": s for a, s in zip(ANGLES, steps)},
        "rise": steps[-1] - steps[0],
        "strict": all(b > a for a, b in zip(steps, steps[1:])),
        "rho": float("nan") if report["spearman"]["rho"] is None else report["spearman"]["rho"],  # None: constant steps
        "wrong_more": wrong_more,
        # points below the last step's accuracy, the worst angle up to 67.5 degrees
        "gap": max(100 * (bucket[a]["accuracy_at_step"][-1] - bucket[a]["accuracy"]) for a in GAP_ANGLES),
        "gap67": 100 * (bucket[67.5]["accuracy_at_step"][-1] - bucket[67.5]["accuracy"]),
        "halting": report["halting"],
    }


def row(label: str, f: dict, seeds: int = 1) -> str:
    steps = " → ".join(f"{f[f'steps{a:g}']:.2f}" for a in ANGLES)
    strict = "yes" if f["strict"] else "no"
    wrong = f"{f['wrong_more']:g}/{seeds * len(ANGLES)}"
    return (f"| {label} | {f['acc45']:.4f} | {f['acc67']:.4f} | {steps} | {f['rise']:+.2f} ({strict}) | "
            f"{'—' if math.isnan(f['rho']) else format(f['rho'], '+.2f')} | {wrong} | {f['gap']:.2f} ({f['gap67']:.2f}) |")


def uniform_table(reports: list[dict]) -> None:
    by_group: dict[str, list[tuple[str, dict]]] = defaultdict(list)
    for report in reports:
        by_group[f"{report['method']}, {report['halting']}"].append(
            (run_name(report), {b["rotation"]: b["accuracy"] for b in report["buckets"]}))
    angles = sorted({a for members in by_group.values() for _, acc in members for a in acc})
    print("| model | " + " | ".join(f"within ±{a:g}°" for a in angles) + " |")
    print("|---|" + "---|" * len(angles))
    for group, members in by_group.items():
        for label, acc in members:
            print(f"| {label} | " + " | ".join(f"{acc[a]:.4f}" for a in angles) + " |")
        if len(members) > 1:
            cells = []
            for a in angles:
                values = [acc[a] for _, acc in members]
                cells.append(f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}")
            print(f"| **{group}, mean ± sd of {len(members)}** | " + " | ".join(cells) + " |")


def run_name(report: dict) -> str:
    return Path(report["checkpoints"][0]).parent.name  # e.g. pondernet-align-seed1


def main(paths: list[str]) -> None:
    by_method: dict[str, list[tuple[str, dict]]] = defaultdict(list)
    uniform = []
    for path in paths:
        with open(path) as file:
            report = json.load(file)
        if report["protocol"] == "uniform":
            uniform.append(report)
            continue
        by_method[f"{report['method']}, {report['halting']}"].append((run_name(report), figures(report)))
    if uniform:
        uniform_table(uniform)
        if not by_method:
            return
        print()
    print("| model | acc ±45° (≥ 0.95) | acc ±67.5° (≥ 0.80) | mean steps 0 → 22.5 → 45 → 67.5 → 90° | "
          "rise (≥ 2, strictly) | ρ (≥ 0.5) | ✗ > ✓ buckets | gap, points, worst ≤ 67.5° (at 67.5°; ≤ 0.5) |")
    print("|---|---|---|---|---|---|---|---|")
    for method, members in by_method.items():
        for label, f in members:
            print(row(f"{label}, {f['halting']}", f))
        if len(members) > 1:
            mean = {k: statistics.mean(f[k] for _, f in members) for k in members[0][1] if k not in ("strict", "halting")}
            mean["strict"] = all(mean[f"steps{b:g}"] > mean[f"steps{a:g}"] for a, b in zip(ANGLES, ANGLES[1:]))
            mean["wrong_more"] = sum(f["wrong_more"] for _, f in members)  # buckets over all seeds
            print(row(f"**{method}, mean of {len(members)}**", mean, seeds=len(members)))


if __name__ == "__main__":
    main(sys.argv[1:])
