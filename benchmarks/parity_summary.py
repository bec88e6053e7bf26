"""One markdown row per parity_explore.py log: the final test per bucket and when validation
first reached given accuracies.

    python benchmarks/parity_summary.py /work/parity-runs/*.jsonl [--curve]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(path: Path) -> tuple[dict, list[dict], dict | None]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    header = lines[0]
    vals = [r for r in lines if r.get("kind") == "val"]
    test = next((r for r in lines if r.get("kind") == "test"), None)
    return header, vals, test


def first_reaching(vals: list[dict], accuracy: float) -> str:
    """Iteration and training seconds at which every validation bucket first reached `accuracy`."""
    for r in vals:
        if all(b["sample"]["accuracy"] >= accuracy for b in r["buckets"]):
            return f"{r['iteration']} ({r['train_seconds'] / 60:.1f} min)"
    return "-"


def row(path: Path) -> str:
    header, vals, test = load(path)
    last = test or (vals[-1] if vals else None)
    if last is None:
        return f"| {path.stem} | no evaluation yet |"
    buckets = " ".join(f"{b['counts']}: {b['sample']['accuracy']:.3f}" for b in last["buckets"])
    steps = " ".join(f"{b['sample']['steps']:.1f}±{b['sample']['steps_sd']:.1f}" for b in last["buckets"])
    rho = last.get("rho_sample")
    rho = "-" if rho is None else f"{rho:.2f}"
    median = " ".join(f"{b['median']['accuracy']:.3f}" for b in last["buckets"])
    seconds = last["train_seconds"]
    return (f"| {path.stem} | {last['iteration']} | {seconds / 60:.1f} | {last['it_per_s']} | {buckets} | "
            f"{median} | {steps} | {rho} | {first_reaching(vals, 0.9)} | {first_reaching(vals, 0.99)} |")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("logs", nargs="+", type=Path)
    p.add_argument("--curve", action="store_true", help="also print each log's validation curve")
    args = p.parse_args()
    print("| run | iterations | train min | it/s | test accuracy (sample) | test accuracy (median) | "
          "steps ± sd | ρ(count, steps) | all ≥ 0.9 at | all ≥ 0.99 at |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in args.logs:
        print(row(path))
    if args.curve:
        for path in args.logs:
            _, vals, _ = load(path)
            print(f"\n{path.stem}: iteration: per-bucket validation accuracy (sampled halting)")
            for r in vals:
                print(f"  {r['iteration']}: " + " ".join(f"{b['sample']['accuracy']:.2f}" for b in r["buckets"]))


if __name__ == "__main__":
    main()
