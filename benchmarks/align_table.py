"""The README's align-step experiment table from run folders made by align_experiment.sh.

    python benchmarks/align_table.py runs/exp-A runs/exp-K ...

One row per run: Spearman's rho and median-rule mean steps at exactly 0/22.5/45/67.5/90 degrees,
accuracy at the halting step against the last step at 45 and 67.5 degrees, steps on correct and
wrong digits at 67.5 degrees, and accuracy within +-22.5/45/67.5/90 degrees (sampled halting).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def row(folder: Path) -> str:
    fixed, uniform = (json.loads((folder / name).read_text()) for name in ("fixed.json", "uniform.json"))
    bucket = {b["rotation"]: b for b in fixed["buckets"]}
    steps = " → ".join(f"{bucket[a]['mean_steps']:.2f}" for a in (0, 22.5, 45, 67.5, 90))
    halting = " · ".join(f"{bucket[a]['accuracy']:.3f} / {bucket[a]['accuracy_at_step'][-1]:.3f}" for a in (45, 67.5))
    right_wrong = f"{bucket[67.5]['steps_correct']:.2f} / {bucket[67.5]['steps_wrong']:.2f}"
    accuracy = " / ".join(f"{b['accuracy']:.3f}" for b in uniform["buckets"])
    return f"| {folder.name} | {fixed['spearman']['rho']:+.2f} | {steps} | {halting} | {right_wrong} | {accuracy} |"


def main() -> None:
    print("| run | ρ fixed/median | median steps 0 → 22.5 → 45 → 67.5 → 90° | acc at halting / at last step, "
          "±45° · ±67.5° | steps ✓ / ✗ at ±67.5° | uniform acc ±22.5 / 45 / 67.5 / 90° |")
    print("|---|---|---|---|---|---|")
    for folder in sys.argv[1:]:
        print(row(Path(folder)))


if __name__ == "__main__":
    main()
