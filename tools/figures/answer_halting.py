"""The answer-trained halting study (docs/halting.md): each checkpoint's threshold chosen on its
validation digits by calibrate's rule, then the test buckets, figures averaged over draws and seeds.

    python tools/figures/answer_halting.py NAME=CHECKPOINT[,CHECKPOINT...] ... [--limit N] [--repeats R]
        [--tolerance T] [--resamples B] [--rule RULE]

For each checkpoint (one per seed):
1. The threshold, stated in advance (the validation digits: those held out from the body's
   training, for a refit its source's): of the rules threshold:T for T in THRESHOLDS, the one with
   the fewest mean steps whose agreement with the last step has a one-sided 95% lower bound of at
   least 1 - tolerance on the validation digits rotated within the training range: what
   `ponder calibrate CHECKPOINT --rules threshold:0.5 ... --tolerance T --seed S` chooses (the same
   digits, rotations and rule, evaluate.choose_rule). `--rule` instead evaluates a rule given
   (sample: PonderNet's coins, the shipped head's own).
2. The test buckets (MNIST test digits rotated within ±22.5° ... ±90°, the uniform protocol), R
   draws (seeds S, S + 1, ...: the rotations and coins `ponder extrapolate --repeats R` draws),
   each bucket's accuracy, mean steps, last step's accuracy, the gap (last − rule), the best
   fixed budget in no more steps (best_fixed_accuracy, the column `--detail` shows) and
   Spearman's ρ(|angle|, steps) over every bucket's digits.
3. B bootstrap resamples of the validation digits (drawn with replacement, seeded), the threshold
   chosen again on each and the test figures recomputed: how often a resample moves the threshold,
   and the target's verdict.

One full forward per bucket and draw serves every rule (model.halting_steps on it: what the
early exit computes, tests/test_exit_rules.py), so resamples cost no model time.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ponder_cli.api import EvalOptions  # noqa: E402
from ponder_cli.checkpoint import load_checkpoint, load_model  # noqa: E402
from ponder_cli.evaluate import RuleOutcome, choose_rule, spearman  # noqa: E402
from ponder_cli.folders import resolve_checkpoint  # noqa: E402
from ponder_cli.model import halting_steps as full_forward_steps, rule_of  # noqa: E402
from ponder_cli.registry import parse_halting_rule  # noqa: E402
from ponder_cli.reports.evaluation import best_fixed_accuracy  # noqa: E402
from ponder_cli.reports.uncertainty import mean_ci  # noqa: E402
from ponder_cli.folders import Summary, run_of  # noqa: E402
from ponder_cli.tasks import derived_seed, get_task  # noqa: E402

ANGLES = [22.5, 45.0, 67.5, 90.0]
# the candidates, evenly in log(1 - T) near 1, where a head trained on "final" puts most lambdas
THRESHOLDS = (0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.998, 0.999, 0.9995, 0.9998, 0.9999)
# the target: at ±90° a gap to the last step of at most 0.3 points at no more than the shipped
# model's 4.66 mean steps, ρ at least its 0.43, and at ±22.5° no more than its 3.43 steps
TARGET = dict(gap=0.003, steps=4.66, rho=0.43, upright_steps=3.43)


@torch.inference_mode()
def outputs(model, bucket, batch_size: int = 1000) -> dict:
    """Every step's class logits and halting logits of one bucket, on the CPU."""
    logits, lambdas = [], []
    for start in range(0, len(bucket), batch_size):
        out = model(bucket.inputs(start, min(start + batch_size, len(bucket))))
        logits.append(out.logits.float().cpu())
        lambdas.append(out.lambda_logits.float().cpu())
    return dict(logits=torch.cat(logits, 1), lambdas=torch.cat(lambdas, 1), labels=bucket.labels.cpu(),
                uniforms=bucket.uniforms.cpu(), difficulty=bucket.difficulty.double())


def halting_steps(out: dict, rule: str, rows=None) -> torch.Tensor:
    logits, lambdas, uniforms = out["logits"], out["lambdas"], out["uniforms"]
    if rows is not None:
        logits, lambdas, uniforms = logits[:, rows], lambdas[:, rows], uniforms[:, rows]
    return full_forward_steps(rule_of(rule, uniforms), logits, lambdas)[0]


def validation_task(cfg, path: Path):
    """The task whose held-out digits are the model's validation digits: a refit's (--init-from
    CHECKPOINT --refit-halting) are those of the checkpoint it refits, which its body never trained
    on: its split_seed says so; a refit saved before runs kept their source's split has none (its
    own seed split the digits), and its run folder's config.json names the source."""
    old_refit = cfg.training.refit_halting and cfg.task.split_seed is None
    start = run_of(Summary.of({"config": cfg.to_dict()}), path.parent).get("init_from") if old_refit else None
    if start:  # the run's record: {"checkpoint": a shipped name or a path, ...}; an older one's the path alone
        source = load_checkpoint(resolve_checkpoint(start["checkpoint"] if isinstance(start, dict) else start).path).config
        return get_task(cfg.replace(seed=source.training.seed))
    return get_task(cfg)


def choose_threshold(val: dict, tolerance: float, rows=None) -> str | None:
    """calibrate's choice among threshold:T (evaluate.choose_rule), on the validation digits `rows`."""
    predictions = val["logits"].argmax(-1)  # (steps, N)
    labels = val["labels"]
    if rows is not None:
        predictions, labels = predictions[:, rows], labels[rows]
    last = predictions[-1]
    outcomes = []
    for t in THRESHOLDS:
        steps = halting_steps(val, f"threshold:{t}", rows)
        chosen = predictions.gather(0, (steps - 1)[None]).squeeze(0)
        outcomes.append(RuleOutcome(f"threshold:{t}", len(labels), float((chosen == labels).double().mean()),
                                    float((chosen == last).double().mean()), float((last == labels).double().mean()),
                                    float(steps.double().mean())))
    return choose_rule(outcomes, tolerance)


def draw_figures(buckets: list[dict], rule: str) -> dict:
    """One draw's figures under `rule`: per bucket lists, and ρ over every bucket's digits."""
    figures, all_steps = {}, []
    for out in buckets:
        steps = halting_steps(out, rule)
        predictions = out["logits"].argmax(-1)
        correct_at = (predictions == out["labels"]).double().mean(1).tolist()  # accuracy at each budget
        accuracy = float((predictions.gather(0, (steps - 1)[None]).squeeze(0) == out["labels"]).double().mean())
        mean_steps = float(steps.double().mean())
        budget = best_fixed_accuracy(correct_at, mean_steps)
        row = dict(accuracy=accuracy, steps=mean_steps, last=correct_at[-1], gap=correct_at[-1] - accuracy,
                   budget=budget, adapting=accuracy - budget)
        for key, value in row.items():
            figures.setdefault(key, []).append(value)
        all_steps.append(steps.double())
    figures["rho"] = spearman(torch.cat([out["difficulty"] for out in buckets]), torch.cat(all_steps))
    return figures


def mean_over_draws(draws: list[dict]) -> dict:
    keys = [key for key in draws[0] if key != "rho"]
    figures = {key: [sum(d[key][b] for d in draws) / len(draws) for b in range(len(draws[0][key]))] for key in keys}
    # None: the steps were constant over the draw's digits
    figures["rho"] = sum(float("nan") if d["rho"] is None else d["rho"] for d in draws) / len(draws)
    # the ±90° gap's spread over the draws: its 95% interval from the draws alone
    figures["gap90_draws"] = [d["gap"][-1] for d in draws]
    return figures


def meets(figures: dict) -> bool:
    return (figures["gap"][-1] <= TARGET["gap"] and figures["steps"][-1] <= TARGET["steps"]
            and figures["rho"] >= TARGET["rho"] and figures["steps"][0] <= TARGET["upright_steps"])


def study(checkpoint: str, args) -> dict:
    path = resolve_checkpoint(checkpoint).path
    model, cfg, _ = load_model(path, torch.device("cpu"))
    model.eval()
    task = get_task(cfg)
    options = EvalOptions(limit=args.limit, seed=args.seed, data_dir=args.data_dir)
    test = task.test_data(options, torch.device("cpu"))
    draws_out = [[outputs(model, task.bucket(test, angle, ANGLES, model.max_steps, args.seed + k, "uniform", draw=k))
                  for angle in ANGLES] for k in range(args.repeats)]
    result = {"checkpoint": str(path)}
    if args.rule:
        rule = args.rule
    else:
        held_out = validation_task(cfg, path).calibration_data(EvalOptions(data_dir=args.data_dir), torch.device("cpu"))
        spec = cfg.task.train_rotation
        val = outputs(model, task.bucket(held_out, spec, [spec], model.max_steps, derived_seed("calibrate", args.seed),
                                         "uniform", draw=0))
        rule = choose_threshold(val, args.tolerance)
        if rule is None:
            return {**result, "rule": None}
        generator = torch.Generator().manual_seed(args.seed)
        n = val["labels"].shape[0]
        resampled = [choose_threshold(val, args.tolerance, torch.randint(n, (n,), generator=generator))
                     for _ in range(args.resamples)]
        verdicts = {}
        for other in sorted(set(filter(None, resampled))):
            verdicts[other] = meets(mean_over_draws([draw_figures(d, other) for d in draws_out]))
        result["resampled"] = resampled
        result["resampled_meets"] = [verdicts.get(r) for r in resampled]
    figures = mean_over_draws([draw_figures(d, rule) for d in draws_out])
    median = mean_over_draws([draw_figures(d, "median") for d in draws_out])
    return {**result, "rule": rule, "figures": figures, "meets": meets(figures),
            "median": {key: median[key] for key in ("accuracy", "steps")}}


def cell(values: list[float], digits: int = 4, signed: bool = False) -> str:
    if any(math.isnan(value) for value in values):  # ρ where a rule's steps were constant
        return "n/a"
    mean, ci = mean_ci(values)
    text = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    return text if ci is None else f"{text} ±{(ci[1] - ci[0]) / 2:.{digits}f}"


def table(name: str, runs: list[dict]) -> list[str]:
    """The variant's rows, each figure's mean over its checkpoints ± half its 95% interval (one
    checkpoint: over its draws, for the gap; the rest as measured)."""
    lines = [f"### {name}", "", "| ±deg | accuracy | steps | median acc / steps | last step | gap | best fixed ≤ "
             "steps | adapting − best fixed |", "|---|---|---|---|---|---|---|---|"]
    for b, angle in enumerate(ANGLES):
        pick = lambda key, source="figures": [run[source][key][b] for run in runs]  # noqa: E731
        gap = pick("gap") if len(runs) > 1 else runs[0]["figures"]["gap90_draws"] if b == len(ANGLES) - 1 \
            else pick("gap")
        lines.append(f"| {angle:g} | {cell(pick('accuracy'))} | {cell(pick('steps'), 2)} | "
                     f"{cell(pick('accuracy', 'median'))} / {cell(pick('steps', 'median'), 2)} | "
                     f"{cell(pick('last'))} | "
                     f"{cell(gap, signed=True)} | {cell(pick('budget'))} | {cell(pick('adapting'), signed=True)} |")
    rho = cell([run['figures']['rho'] for run in runs], 3, signed=True)
    lines += ["", f"ρ(|angle|, steps): {rho}; per checkpoint: "
              + "; ".join(f"{run['rule']}, ±90° gap {run['figures']['gap'][-1] * 100:+.2f} points at "
                          f"{run['figures']['steps'][-1]:.2f} steps, ±22.5° {run['figures']['steps'][0]:.2f} steps, "
                          f"ρ {run['figures']['rho']:+.3f}, target {'met' if run['meets'] else 'missed'}"
                          for run in runs)]
    moved = [(run["rule"], run["resampled"], run["resampled_meets"]) for run in runs if "resampled" in run]
    for rule, resampled, verdicts in moved:
        lines.append(f"- {rule}: {sum(r != rule for r in resampled)} of {len(resampled)} resamples choose another "
                     f"threshold ({', '.join(sorted(set(map(str, resampled))))}); the target's verdict is "
                     f"{'met' if rule else '-'} in {sum(bool(v) for v in verdicts)} of {len(verdicts)}")
    return lines + [""]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", metavar="NAME=CHECKPOINT[,CHECKPOINT...]")
    parser.add_argument("--limit", type=int, default=2000, help="first N test digits per bucket (0: all 10,000)")
    parser.add_argument("--repeats", type=int, default=5, help="draws of rotations and coins per bucket")
    parser.add_argument("--seed", type=int, default=1234, help="the rotations and coins, the same for every model")
    parser.add_argument("--tolerance", type=float, default=0.001, help="calibrate's: 1 - the agreement's lower bound")
    parser.add_argument("--resamples", type=int, default=20, help="bootstrap resamples of the validation digits")
    parser.add_argument("--rule", default=None, help="evaluate this rule instead of a calibrated threshold")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write every figure per checkpoint here")
    args = parser.parse_args(argv)
    results = {}
    for spec in args.variants:
        name, _, checkpoints = spec.partition("=")
        results[name] = [study(checkpoint, args) for checkpoint in checkpoints.split(",")]
        if args.json is not None:
            args.json.write_text(json.dumps(results, indent=1))
        runs = [run for run in results[name] if run["rule"] is not None]
        if len(runs) < len(results[name]):
            print(f"{name}: no threshold admitted on the validation digits for "
                  f"{len(results[name]) - len(runs)} checkpoint(s)")
        if runs:
            print("\n".join(table(name, runs)), flush=True)


if __name__ == "__main__":
    main()
