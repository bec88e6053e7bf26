"""Evaluation: accuracy and ponder steps per difficulty bucket, seeded, under any halting rule.

Task-neutral: a bucket (EvalBucket) is a fixed set of inputs with labels, halting coins and a
per-input difficulty value; the task builds it (tasks/: MNIST rotates test images, parity draws
vectors with given non-zero counts).

Calibration (`ponder calibrate`) chooses an exit rule on held-out data, as CALM (Schuster et al.
2022) calibrates its exit threshold: every candidate rule (registry.CALIBRATION_RULES) is applied
to the same forward passes over every step, and the cheapest rule whose halting-step prediction
agrees with the last step's (the full model's) on all but a `tolerance` share of the inputs is
chosen, the share taken at its one-sided 95% lower bound (Wilson) rather than as measured: with
95% confidence, the chosen rule agrees with the last step on at least 1 - tolerance of inputs
drawn as the calibration inputs were. The confidence is each rule's own, not simultaneous over
every candidate.

Agreement rather than accuracy: it bounds the accuracy lost to halting early (the two
accuracies differ by at most the share that disagrees), needs no labels, and is what CALM keeps.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Callable, Iterable, Optional

import torch

from .config import PonderConfig
from .halting import halting_steps, rule_of
from .registry import parse_halting_rule
from .methods import get_method, halting_log_probs
from .reports import standard_error, wilson_interval, wilson_lower
from .runtime import autocast, drops_rows


@dataclass(frozen=True)
class EvalBucket:
    """One bucket's inputs, built by the task: `inputs(start, end)` gives rows start:end ready
    for the model on the device (prepared lazily, batch by batch)."""
    labels: torch.Tensor  # (N,) long, on the device
    inputs: Callable[[int, int], torch.Tensor]
    uniforms: torch.Tensor  # (steps, N) halting coin flips, on the device
    difficulty: torch.Tensor  # (N,) CPU float: MNIST |rotation|, parity the non-zero count

    def __len__(self) -> int:
        return self.labels.shape[0]


@dataclass(frozen=True)
class EvalSamples:
    """Per-input values, kept for statistics across buckets (CPU tensors)."""
    difficulty: torch.Tensor  # (N,) the task's difficulty of each input (|rotation|, non-zero count)
    steps: torch.Tensor  # (N,) float64 ponder steps (fractional for the expected rule)
    correct: torch.Tensor  # (N,) bool


@dataclass(frozen=True)
class EvalResult:
    images: int
    accuracy: float
    mean_steps: float
    std_steps: float
    steps_correct: float | None  # mean steps on correctly classified images (None: there are none)
    steps_wrong: float | None
    histogram: tuple  # images halting at step 1..max_steps (expected halting mass for "expected")
    accuracy_at_step: tuple | None = None  # accuracy if every image stopped at step k (detail)
    loss: float | None = None  # cross-entropy of the prediction under the halting rule used
    objective: float | None = None  # the training loss (reconstruction + beta * regularisation), rule-free
    reconstruction: float | None = None
    regularisation: float | None = None
    samples: EvalSamples | None = field(default=None, compare=False, repr=False)

    def as_dict(self) -> dict:
        return {f.name: (list(v) if isinstance(v, tuple) else v)
                for f in fields(self) if f.name != "samples" for v in [getattr(self, f.name)]}


LOSSES = ("loss", "objective", "reconstruction", "regularisation")  # eval's alone (with_loss)


@torch.inference_mode()
def evaluate_bucket(model: torch.nn.Module, bucket: EvalBucket, cfg: PonderConfig, *, batch_size: int = 1000,
                    halting: str = "sample", early_exit: bool | None = None, with_loss: bool = False,
                    detail: bool = False, amp: bool = False) -> EvalResult:
    """Evaluate one bucket.

    halting: "sample" draws Bernoulli(lambda_n) at each step (the paper); "median" halts where
    the cumulative halting probability reaches 1/2, "quantile:Q" where it reaches Q;
    "patience:K" once the predicted class has not changed for K steps; "expected" runs every
    step and predicts with the p-weighted average of the step outputs, counting sum_n n p_n steps;
    "fixed:N" stops every input at step N (its accuracy is `detail`'s accuracy_at_step[N - 1]).
    early_exit computes each step only for images still running (model.infer): it must read on
    the host how many go on after every step, free on a CPU, where it skips the work of halted
    images (align: 10x), and a stall per step on a GPU. None (the default): on the CPU only. Else
    the full forward over every step, and the rule applied to it on the device (method.predict:
    the same predictions and steps; tests/test_evaluate.py). The loss, the per-step accuracy of
    `detail` (from which the reports take the best fixed budget at the rule's mean steps) and the
    expected rule need every step of every image, so they always run the full forward pass.

    with_loss: `loss`, each input's cross-entropy of the class probabilities it is predicted
    with under `halting` (fixed:N: y_N's; sample and the other exit rules: the halted step's;
    expected and ACT: the weighted mean's), averaged; and `objective`, the training loss on
    these inputs (method.loss: its reconstruction and regularisation), which no rule changes.
    """
    parse_halting_rule(halting)  # a bad spelling fails here, before any work
    was_training = model.training
    model.eval()
    device = bucket.labels.device
    count, max_steps = len(bucket), model.max_steps
    uniforms = bucket.uniforms
    method = get_method(cfg, device)
    if early_exit is None:
        early_exit = drops_rows(device)
    expected = method.needs_all_steps(halting)  # steps are then sum_n n p_n, not whole steps
    full_forward = with_loss or detail or expected or not early_exit
    loss_totals = torch.zeros(4, dtype=torch.float64, device=device)  # summed over inputs: EvalResult's losses
    halting_mass = torch.zeros(max_steps, dtype=torch.float64, device=device)  # expected rule: sum of p_n
    correct_at_step = torch.zeros(max_steps, dtype=torch.float64, device=device)
    all_steps, all_correct = [], []  # per image, kept on the device until the end
    for start in range(0, count, batch_size):
        end = min(start + batch_size, count)
        x = bucket.inputs(start, end)
        targets = bucket.labels[start:end]
        with autocast(device, amp):
            if not full_forward:
                logits, steps = model.infer(x, method.exit_rule(halting, uniforms[:, start:end]))
            else:
                out = model(x)
        if full_forward:
            logits, steps = method.predict(out.logits, out.lambda_logits, uniforms[:, start:end], halting)
            if expected:  # steps are sum_n n p_n: the histogram collects the halting mass p_n
                halting_mass += halting_log_probs(out.lambda_logits).exp().double().sum(dim=1)
            if detail:
                correct_at_step += (out.logits.argmax(dim=-1) == targets).sum(dim=1).double()
            if with_loss:
                chosen = method.probabilities(logits, halting).gather(1, targets[:, None]).squeeze(1)
                halted = -chosen.double().clamp_min(torch.finfo(torch.float32).tiny).log().sum()
                parts = method.loss(out.logits, out.lambda_logits, targets)
                loss_totals += torch.cat([halted[None], torch.stack(list(parts)).double() * (end - start)])
        all_steps.append(steps.double())
        all_correct.append(logits.argmax(dim=1) == targets)
    model.train(was_training)

    # Every statistic derives from the per-image values, read from the device once, here.
    steps, correct = torch.cat(all_steps).cpu(), torch.cat(all_correct).cpu()  # (N,)
    histogram = (tuple(halting_mass.tolist()) if expected
                 else tuple(torch.bincount(steps.long() - 1, minlength=max_steps).tolist()))
    return _result(bucket, steps, correct, histogram,
                   accuracy_at_step=tuple((correct_at_step / count).tolist()) if detail else None,
                   losses=(loss_totals / count).tolist() if with_loss else None)


def _result(bucket: EvalBucket, steps: torch.Tensor, correct: torch.Tensor, histogram: tuple, *,
            accuracy_at_step: Optional[tuple], losses: Optional[list]) -> EvalResult:
    """A bucket's figures from its per-input steps (N,) and correctness (N,) on the CPU."""
    count, n_correct = len(bucket), int(correct.sum())
    return EvalResult(
        images=count, accuracy=n_correct / count, mean_steps=float(steps.mean()),
        std_steps=float(steps.std(correction=0)),
        steps_correct=float(steps[correct].mean()) if n_correct else None,
        steps_wrong=float(steps[~correct].mean()) if n_correct < count else None,
        histogram=histogram, accuracy_at_step=accuracy_at_step,
        **(dict(zip(LOSSES, losses)) if losses is not None else {}),
        samples=EvalSamples(bucket.difficulty.double(), steps, correct),
    )


def uncertainty(samples: list[EvalSamples]) -> dict:
    """How far a bucket's figures could be from the model's true ones, over every input its
    draws evaluated (pooled): `accuracy_wilson`, Wilson's 95% interval [low, high] of the
    accuracy, and `steps_se`, the standard error of the mean steps."""
    correct = torch.cat([s.correct for s in samples])
    steps = torch.cat([s.steps for s in samples])
    count = correct.shape[0]
    return {"accuracy_wilson": wilson_interval(int(correct.sum()), count),
            "steps_se": standard_error(float(steps.std(correction=0)), count) if count else None}


def evaluate_buckets(model: torch.nn.Module, buckets, cfg: PonderConfig, *,
                     on_bucket: Optional[Callable[[], None]] = None, **options) -> tuple[list[EvalResult], float | None]:
    """One evaluation per bucket (EvalBuckets, or callables that build one when its turn comes),
    and Spearman's rho between every evaluated input's difficulty and its ponder steps.
    on_bucket is called after each bucket (a progress bar's tick)."""
    results = []
    for bucket in buckets:
        results.append(evaluate_bucket(model, bucket() if callable(bucket) else bucket, cfg, **options))
        if on_bucket is not None:
            on_bucket()
    rho = spearman(torch.cat([r.samples.difficulty for r in results]), torch.cat([r.samples.steps for r in results]))
    return results, rho


def _average_ranks(values: torch.Tensor) -> torch.Tensor:
    """1-based ranks, ties sharing their average rank (as Spearman's rho needs)."""
    sorted_values, order = torch.sort(values.double())
    _, inverse, counts = torch.unique_consecutive(sorted_values, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    average = ends - (counts.double() - 1) / 2
    ranks = torch.empty_like(sorted_values)
    ranks[order] = average[inverse]
    return ranks


def spearman(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Spearman's rank correlation; None when either variable is constant."""
    rx, ry = _average_ranks(x), _average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = math.sqrt(float((rx * rx).sum()) * float((ry * ry).sum()))
    return float((rx * ry).sum()) / denominator if denominator > 0 else None


# calibration: choosing an exit rule ------------------------------------------------------------

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
    per batch serves every rule (a rule halting early computes the same steps: halting.halting_steps)."""
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
                steps, _ = halting_steps(rule_of(rule, bucket.uniforms[:, start:end]), out.logits, out.lambda_logits)
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
