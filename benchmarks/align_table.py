"""The README's align-step experiment table from run folders made by align_experiment.sh.

    python benchmarks/align_table.py runs/exp-A runs/exp-K ...
    python benchmarks/align_table.py --mean runs/exp-P2 runs/exp-P2s1 runs/exp-P2s2   # seeds of one setting

One row per run: Spearman's rho and median-rule mean steps at exactly 0/22.5/45/67.5/90 degrees,
accuracy at the halting step against the last step at 45 and 67.5 degrees, steps on correct and
wrong digits at 67.5 degrees, and accuracy within +-22.5/45/67.5/90 degrees (sampled halting).
With --mean, a last row gives each figure's mean ± sd over the runs (seeds of one setting).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ANGLES = (0, 22.5, 45, 67.5, 90)


def figures(folder: Path) -> dict:
    """One run's figures, each a float, in the table's column groups."""
    fixed, uniform = (json.loads((folder / name).read_text()) for name in ("fixed.json", "uniform.json"))
    bucket = {b["rotation"]: b for b in fixed["buckets"]}
    return {
        "rho": [fixed["spearman"]["rho"]],
        "steps": [bucket[a]["mean_steps"] for a in ANGLES],
        "halting": [value for a in (45, 67.5) for value in (bucket[a]["accuracy"], bucket[a]["accuracy_at_step"][-1])],
        "right_wrong": [bucket[67.5]["steps_correct"], bucket[67.5]["steps_wrong"]],
        "uniform": [b["accuracy"] for b in uniform["buckets"]],
    }


def row(label: str, cells: dict) -> str:
    """cells: each figure a string, grouped as figures() groups them."""
    halting = cells["halting"]
    return (f"| {label} | {cells['rho'][0]} | {' → '.join(cells['steps'])} | {halting[0]} / {halting[1]} · "
            f"{halting[2]} / {halting[3]} | {' / '.join(cells['right_wrong'])} | {' / '.join(cells['uniform'])} |")


FORMATS = {"rho": "+.2f", "steps": ".2f", "halting": ".3f", "right_wrong": ".2f", "uniform": ".3f"}


def run_row(folder: Path) -> str:
    return row(folder.name, {key: [format(v, FORMATS[key]) for v in values] for key, values in figures(folder).items()})


def mean_row(folders: list[Path]) -> str:
    runs = [figures(folder) for folder in folders]
    cells = {key: [f"{format(statistics.mean(column), FORMATS[key])} ± "
                   f"{format(statistics.stdev(column), FORMATS[key].lstrip('+'))}"
                   for column in zip(*(run[key] for run in runs))] for key in FORMATS}
    return row(f"**mean ± sd of {len(runs)}**", cells)


def main() -> None:
    args = sys.argv[1:]
    mean = "--mean" in args
    folders = [Path(a) for a in args if a != "--mean"]
    if mean and len(folders) < 2:
        raise SystemExit("Error: --mean needs at least two run folders")
    print("| run | ρ fixed/median | median steps 0 → 22.5 → 45 → 67.5 → 90° | acc at halting / at last step, "
          "±45° · ±67.5° | steps ✓ / ✗ at ±67.5° | uniform acc ±22.5 / 45 / 67.5 / 90° |")
    print("|---|---|---|---|---|---|")
    for folder in folders:
        print(run_row(folder))
    if mean:
        print(mean_row(folders))


if __name__ == "__main__":
    main()
