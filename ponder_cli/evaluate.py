"""Evaluation: accuracy and ponder steps per difficulty bucket, seeded, under any halting rule.

A bucket (EvalBucket) is a fixed set of inputs with labels, halting coins and a per-input
difficulty; the task builds it (MNIST rotates test images, parity draws vectors by non-zero count).
Calibration chooses an exit rule on held-out data, as CALM (Schuster et al. 2022) does: the
cheapest rule whose answer agrees with the last step's, at a one-sided 95% lower bound; agreement
bounds the accuracy lost to halting early and needs no labels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Callable, Iterable, Optional

import torch

from .config import PonderConfig
from .model import autocast, drops_rows, get_method, halting_log_probs, halting_steps, rule_of
from .registry import SHUFFLES, parse_halting_rule
from .reports import binomial_cdf, clopper_pearson_upper, standard_error, wilson_interval, wilson_lower


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
    # detail: each input's correctness under the shuffled-halting null (float64, its mean over the
    # permutations; shuffled_null), None where the null is not defined or not asked for
    shuffled: Optional[torch.Tensor] = None


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
    # detail, the controls beside the best fixed policy (shuffled_null; None where a rule does not
    # halt at one step, or the method predicts from more than its halting step's answer)
    shuffled_accuracy: float | None = None  # the same halting steps, permuted across the inputs
    adapting_minus_shuffled: float | None = None
    premature_halts: float | None = None  # share wrong where halted, right at the last step
    late_halts: float | None = None  # share wrong where halted, right at an earlier step
    samples: EvalSamples | None = field(default=None, compare=False, repr=False)

    def as_dict(self) -> dict:
        return {f.name: (list(v) if isinstance(v, tuple) else v)
                for f in fields(self) if f.name != "samples" for v in [getattr(self, f.name)]}


LOSSES = ("loss", "objective", "reconstruction", "regularisation")  # eval's alone (with_loss)
CONTROLS = ("shuffled_accuracy", "adapting_minus_shuffled", "premature_halts", "late_halts")  # --detail's alone


@torch.inference_mode()
def evaluate_bucket(model: torch.nn.Module, bucket: EvalBucket, cfg: PonderConfig, *, batch_size: int = 1000,
                    halting: str = "sample", early_exit: bool | None = None, with_loss: bool = False,
                    detail: bool = False, amp: bool = False) -> EvalResult:
    """One bucket under the `halting` rule (registry.py's spellings).

    early_exit (None: on the CPU only) computes each step only for the inputs still running
    (model.infer: a host read per step); else the rule is applied to the full forward (the same
    predictions and steps). with_loss, `detail` and the expected rule need the full forward.
    """
    rule = parse_halting_rule(halting)  # a bad spelling fails here, before any work
    was_training = model.training
    model.eval()
    device = bucket.labels.device
    count, max_steps = len(bucket), model.max_steps
    method = get_method(cfg, device)
    if early_exit is None:
        early_exit = drops_rows(device)
    expected = method.needs_all_steps(halting)  # steps are then sum_n n p_n, not whole steps
    full_forward = with_loss or detail or expected or not early_exit
    loss_totals = torch.zeros(4, dtype=torch.float64, device=device)  # summed over inputs: EvalResult's losses
    halting_mass = torch.zeros(max_steps, dtype=torch.float64, device=device)  # expected rule: sum of p_n
    correct_at_step = torch.zeros(max_steps, dtype=torch.float64, device=device)
    all_steps, all_correct = [], []  # per input, kept on the device until the end
    # detail: every step's correctness per input, (steps, B) per batch, for the shuffled null
    per_step = [] if detail and method.halting_label(halting) == halting and rule.halts_at_one_step else None
    for start in range(0, count, batch_size):
        end = min(start + batch_size, count)
        x, targets, uniforms = bucket.inputs(start, end), bucket.labels[start:end], bucket.uniforms[:, start:end]
        with autocast(device, amp):
            if not full_forward:
                logits, steps = model.infer(x, method.exit_rule(halting, uniforms))
            else:
                out = model(x)
        if full_forward:
            logits, steps = method.predict(out.logits, out.lambda_logits, uniforms, halting)
            if expected:  # steps are sum_n n p_n: the histogram collects the halting mass p_n
                halting_mass += halting_log_probs(out.lambda_logits).exp().double().sum(dim=1)
            if detail:
                right = out.logits.argmax(dim=-1) == targets  # (steps, B)
                correct_at_step += right.sum(dim=1).double()
                if per_step is not None:
                    per_step.append(right)
            if with_loss:
                chosen = method.probabilities(logits, halting).gather(1, targets[:, None]).squeeze(1)
                halted = -chosen.double().clamp_min(torch.finfo(torch.float32).tiny).log().sum()
                parts = method.loss(out.logits, out.lambda_logits, targets)
                loss_totals += torch.cat([halted[None], torch.stack(list(parts)).double() * (end - start)])
        all_steps.append(steps.double())
        all_correct.append(logits.argmax(dim=1) == targets)
    model.train(was_training)

    # Every statistic derives from the per-input values, read from the device once, here.
    steps, correct = torch.cat(all_steps).cpu(), torch.cat(all_correct).cpu()  # (N,)
    n_correct = int(correct.sum())
    shuffled, shares = shuffled_null(torch.cat(per_step, dim=1).cpu(), steps, correct) if per_step else (None, {})
    return EvalResult(
        images=count, accuracy=n_correct / count, mean_steps=float(steps.mean()),
        std_steps=float(steps.std(correction=0)),
        steps_correct=float(steps[correct].mean()) if n_correct else None,
        steps_wrong=float(steps[~correct].mean()) if n_correct < count else None,
        histogram=(tuple(halting_mass.tolist()) if expected
                   else tuple(torch.bincount(steps.long() - 1, minlength=max_steps).tolist())),
        accuracy_at_step=tuple((correct_at_step / count).tolist()) if detail else None,
        **(dict(zip(LOSSES, (loss_totals / count).tolist())) if with_loss else {}), **shares,
        samples=EvalSamples(bucket.difficulty.double(), steps, correct, shuffled))


# the controls beside the best fixed policy ---------------------------------------------------------

SHUFFLE_SEED = 0  # the permutations' generator: the same permutations of a bucket on every run


def shuffled_null(right: torch.Tensor, steps: torch.Tensor, correct: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Whether halting adapts or only spends an average: the bucket's halting steps dealt out at
    random across its inputs (SHUFFLES seeded permutations), each answered at the step it is
    dealt. right (steps, N), steps (N,) 1-based, correct (N,). Each input's correctness at the
    steps it is dealt, averaged ((N,) float64), and the bucket's figures: the shuffled accuracy,
    adapting minus it, the premature halts (wrong at the halting step, right at the last) and the
    late ones (wrong there, right at some step before it)."""
    count = right.shape[1]
    index = steps.long() - 1
    inputs = torch.arange(count)
    generator = torch.Generator().manual_seed(SHUFFLE_SEED)
    shuffled = torch.zeros(count, dtype=torch.float64)
    for _ in range(SHUFFLES):
        shuffled += right[index[torch.randperm(count, generator=generator)], inputs].double()
    shuffled /= SHUFFLES
    # right at some step before the halting one: the running "any" up to step n - 1
    seen = right.to(torch.uint8).cummax(dim=0).values.bool()  # right at step n or before
    before = torch.cat([torch.zeros_like(seen[:1]), seen[:-1]])[index, inputs]
    wrong, accuracy = ~correct, float(shuffled.mean())
    return shuffled, {"shuffled_accuracy": accuracy, "adapting_minus_shuffled": int(correct.sum()) / count - accuracy,
                      "premature_halts": float((wrong & right[-1]).double().mean()),
                      "late_halts": float((wrong & before).double().mean())}


def uncertainty(samples: list[EvalSamples]) -> dict:
    """Over every input a bucket's draws evaluated (pooled): Wilson's 95% interval of the accuracy,
    the standard error of the mean steps and, with --detail's null, that of adapting - shuffled
    (each input's own difference, paired)."""
    correct = torch.cat([s.correct for s in samples])
    steps = torch.cat([s.steps for s in samples])
    count = correct.shape[0]
    figures = {"accuracy_wilson": wilson_interval(int(correct.sum()), count),
               "steps_se": standard_error(float(steps.std(correction=0)), count) if count else None}
    if count and all(s.shuffled is not None for s in samples):
        differences = correct.double() - torch.cat([s.shuffled for s in samples])
        figures["adapting_minus_shuffled_se"] = standard_error(float(differences.std(correction=0)), count)
    return figures


def _average_ranks(values: torch.Tensor) -> torch.Tensor:
    """1-based ranks, ties sharing their average rank (as Spearman's rho needs)."""
    sorted_values, order = torch.sort(values.double())
    _, inverse, counts = torch.unique_consecutive(sorted_values, return_inverse=True, return_counts=True)
    ranks = torch.empty_like(sorted_values)
    ranks[order] = (torch.cumsum(counts, 0).double() - (counts.double() - 1) / 2)[inverse]
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


@torch.inference_mode()
def rule_outcomes(model: torch.nn.Module, buckets: Iterable, rules: list[str], *, batch_size: int = 1000,
                  amp: bool = False) -> list[RuleOutcome]:
    """Every rule over the inputs of all `buckets`, pooled: one full forward per batch serves every
    rule (a rule halting early computes the same steps: model.halting_steps)."""
    parsed = [parse_halting_rule(rule) for rule in rules]
    was_training = model.training
    model.eval()
    totals = correct_last = 0  # totals: (rules, 3): correct, agreeing, steps
    count = 0
    for bucket in buckets:
        bucket = bucket() if callable(bucket) else bucket
        device = bucket.labels.device
        for start in range(0, len(bucket), batch_size):
            end = min(start + batch_size, len(bucket))
            targets = bucket.labels[start:end]
            with autocast(device, amp):
                out = model(bucket.inputs(start, end))
            predictions = out.logits.argmax(dim=-1)  # (steps, B)
            last = predictions[-1]
            batch = []
            for rule in parsed:
                steps, _ = halting_steps(rule_of(rule, bucket.uniforms[:, start:end]), out.logits, out.lambda_logits)
                chosen = predictions.gather(0, (steps - 1)[None]).squeeze(0)  # (B,)
                batch.append(torch.stack([(chosen == targets).sum(), (chosen == last).sum(), steps.sum()]))
            totals = totals + torch.stack(batch).double()
            correct_last = correct_last + (last == targets).sum().double()
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
    # a hair of slack so that a bound of exactly 1 - tolerance counts
    admitted = [o for o in outcomes if o.agreement_lower >= 1 - tolerance - 1e-12]
    return min(admitted, key=lambda o: o.mean_steps).halting if admitted else None


# risk-controlled calibration: a rule whose loss is bounded with a stated risk ----------------------
#
# `calibrate --max-loss E --risk D` (Learn then Test, Angelopoulos et al. 2021; Jazbec et al.
# 2024). A rule's loss on an input is 1 when its halted answer differs from the last step's; each
# candidate's "risk > E" is rejected when the exact binomial p-value P(Binomial(n, E) <= losses)
# is at most its level. Fixed-sequence testing needs an order fixed before any loss is seen: each
# family's parameter, as a larger one halts every input at the same step or later. Each family is
# tested from its largest parameter down at level D / F (Bonferroni over F families), stopping
# at its first failure; every rule that passed is covered at once with probability >= 1 - D, so
# the cheapest may be chosen.


def fixed_sequences(rules: list[str]) -> dict[str, list[str]]:
    """The candidates by family (in the order the families first appear; median is
    quantile:0.5, sample a family of its own), each from its largest parameter to its smallest
    (ties as given): the order each is tested in."""
    families: dict[str, list[tuple[float, int, str]]] = {}
    for position, spelling in enumerate(rules):
        rule = parse_halting_rule(spelling)
        family, parameter = ("quantile", rule.quantile) if rule.quantile is not None else (rule.name, rule.parameter)
        families.setdefault(family, []).append((-(parameter or 0.0), position, spelling))
    return {family: [rule for *_, rule in sorted(members)] for family, members in families.items()}


@dataclass(frozen=True)
class RiskTest:
    """One candidate under fixed-sequence testing."""
    halting: str
    family: str
    position: int  # 1-based place in its family's sequence (1: the most steps)
    images: int
    losses: int  # inputs whose halted answer differs from the last step's
    loss: float  # their share
    level: float  # the risk each test in its family is run at (--risk / families)
    bound: float  # the Clopper–Pearson upper 1 - level bound on the loss
    p_value: float  # P(Binomial(images, max_loss) <= losses)
    tested: bool  # reached by its sequence (not after a failure)
    passed: bool  # tested and its bound at most max_loss
    mean_steps: float
    accuracy: float
    accuracy_last: float


def risk_controlled_rule(outcomes: list[RuleOutcome], max_loss: float, risk: float
                         ) -> tuple[Optional[str], list[RiskTest]]:
    """The cheapest rule (the first listed on a tie) of those passing fixed-sequence testing of
    "loss > max_loss" at total risk `risk` (None: none), and every test, in the order tested."""
    by_rule = {outcome.halting: outcome for outcome in outcomes}
    sequences = fixed_sequences([outcome.halting for outcome in outcomes])
    level = risk / len(sequences)
    tests = []
    for family, rules in sequences.items():
        going = True
        for position, rule in enumerate(rules, 1):
            outcome = by_rule[rule]
            n = outcome.images
            losses = round((1 - outcome.agreement) * n)  # a count: the agreement is one over n
            p_value = binomial_cdf(losses, n, max_loss)
            passed = going and p_value <= level
            tests.append(RiskTest(rule, family, position, n, losses, losses / n, level,
                                  clopper_pearson_upper(losses, n, level), p_value, going, passed,
                                  outcome.mean_steps, outcome.accuracy, outcome.accuracy_last))
            going = passed
    order = {outcome.halting: i for i, outcome in enumerate(outcomes)}
    passed = [test for test in tests if test.passed]
    return (min(passed, key=lambda t: (t.mean_steps, order[t.halting])).halting if passed else None), tests
