"""Choosing an exit rule on held-out data, as CALM (Schuster et al. 2022) calibrates its exit
threshold: every candidate rule (registry.CALIBRATION_RULES) is applied to the same forward
passes over every step, and the cheapest rule whose halting-step prediction agrees with the last
step's (the full model's) on all but a `tolerance` share of the inputs is chosen, the share
taken at its one-sided 95% lower bound (Wilson) rather than as measured: with 95% confidence,
the chosen rule agrees with the last step on at least 1 - tolerance of inputs drawn as the
calibration inputs were. The confidence is each rule's own, not simultaneous over every
candidate.

Agreement rather than accuracy: it bounds the accuracy lost to halting early (the two
accuracies differ by at most the share that disagrees), needs no labels, and is what CALM keeps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Optional

import torch

from .halting import rule_halting_steps
from .registry import parse_halting_rule
from .reports import wilson_lower
from .runtime import autocast


@dataclass(frozen=True)
class RuleOutcome:
    """One rule over every calibration input."""
    halting: str  # the rule, spelled as --halting takes it
    images: int
    accuracy: float  # of the prediction at the halting step
    agreement: float  # share of inputs whose halting-step class is the last step's
    accuracy_last: float  # of the last step's prediction (the same for every rule)
    mean_steps: float

    @property
    def agreement_lower(self) -> float:
        """The one-sided 95% lower bound (Wilson) of the agreement over inputs like these."""
        return wilson_lower(round(self.agreement * self.images), self.images)

    def as_dict(self) -> dict:
        return {**asdict(self), "agreement_lower": self.agreement_lower}


@torch.inference_mode()
def rule_outcomes(model: torch.nn.Module, buckets: Iterable, rules: list[str], *, batch_size: int = 1000,
                  amp: bool = False) -> list[RuleOutcome]:
    """Every rule's accuracy, agreement with the last step and mean steps over the inputs of all
    `buckets` (evaluate.EvalBuckets, or callables that build one), pooled; one full forward pass
    per batch serves every rule (a rule halting early computes the same steps: `rule_exit`)."""
    parsed = [parse_halting_rule(rule) for rule in rules]
    was_training = model.training
    model.eval()
    totals = None  # (rules, 3): correct, agreeing, steps
    correct_last, count = 0, 0
    for bucket in buckets:
        bucket = bucket() if callable(bucket) else bucket
        device = bucket.labels.device
        if totals is None:
            totals = torch.zeros(len(parsed), 3, dtype=torch.float64, device=device)
            correct_last = torch.zeros((), dtype=torch.float64, device=device)
        for start in range(0, len(bucket), batch_size):
            end = min(start + batch_size, len(bucket))
            targets = bucket.labels[start:end]
            with autocast(device, amp):
                out = model(bucket.inputs(start, end))
            predictions = out.logits.argmax(dim=-1)  # (steps, B)
            last = predictions[-1]
            for i, rule in enumerate(parsed):
                steps = rule_halting_steps(rule, out.logits, out.lambda_logits, bucket.uniforms[:, start:end])
                chosen = predictions.gather(0, (steps - 1)[None]).squeeze(0)  # (B,)
                totals[i] += torch.stack([(chosen == targets).sum(), (chosen == last).sum(), steps.sum()]).double()
            correct_last += (last == targets).sum().double()
            count += end - start
    model.train(was_training)
    if not count:
        raise ValueError("no inputs to calibrate on")
    rows, last_accuracy = (totals / count).tolist(), float(correct_last) / count
    return [RuleOutcome(rule.spelling, count, accuracy, agreement, last_accuracy, steps)
            for rule, (accuracy, agreement, steps) in zip(parsed, rows)]


def choose_rule(outcomes: list[RuleOutcome], tolerance: float) -> Optional[str]:
    """The rule with the fewest mean steps among those whose agreement with the last step has a
    lower bound of at least 1 - tolerance (the first listed on a tie); None when none has."""
    admitted = [o for o in outcomes if admits(o, tolerance)]
    return min(admitted, key=lambda o: o.mean_steps).halting if admitted else None


def admits(outcome: RuleOutcome, tolerance: float) -> bool:
    # a hair of slack so that a bound of exactly 1 - tolerance counts
    return outcome.agreement_lower >= 1 - tolerance - 1e-12
