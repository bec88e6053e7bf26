"""Halting arithmetic shared by the model, the losses and evaluation: PonderNet's halting
distribution and its rules (sample, median, expected, quantile:Q, patience:K, confidence:C,
threshold:T, and the fixed budget fixed:N, `FixedBudget`; spelled in registry.py), ACT's halting
units, and the per-row rules that let the one early-exit loop (`PonderNet.infer`) stop each image
as soon as it halts.

Shapes: lambda_logits (steps, B) are pre-sigmoid conditional halting probabilities; logits
(steps, B, classes) are the class scores y_n of every step.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .registry import HaltingRule, parse_halting_rule

# Per-step terms and running sums --------------------------------------------------------------
# shared by the batch forms (over every step) and the early-exit rules (step by step), so that both
# compute the same float32 numbers and halt at the same step


def halting_units(lambda_logits: torch.Tensor) -> torch.Tensor:
    """lambda_n = sigmoid(z_n) in float32, as exp(logsigmoid(z)): the same float wherever z sits
    in a tensor. (torch.sigmoid on the CPU rounds differently in its vectorised body and its
    scalar tail, and the two forms hold a row at different positions.)"""
    return F.logsigmoid(lambda_logits.float()).exp()


def log_continue(lambda_logits: torch.Tensor) -> torch.Tensor:
    """log(1 - lambda_n) = logsigmoid(-z_n) in float32, never the log of 0."""
    return F.logsigmoid(-lambda_logits.float())


def running_sums(terms: torch.Tensor) -> torch.Tensor:
    """The sum of terms[0..n] at every step n, (steps, ...) -> (steps, ...), added one step at a
    time in step order as the early-exit rules add them. (torch.cumsum on the CPU accumulates
    float32 in float64: its sums differ in the last bit and, near a threshold, halt at another
    step than the early exit.)"""
    total, sums = torch.zeros_like(terms[0]), []
    for term in terms:
        total = total + term
        sums.append(total)
    return torch.stack(sums)


def log_survivals(lambda_logits: torch.Tensor) -> torch.Tensor:
    """log prod_{k<=n} (1 - lambda_k) at every step n: the log of the halting mass not yet
    spent after step n. (steps, B) -> (steps, B), float32."""
    return running_sums(log_continue(lambda_logits))


# PonderNet -------------------------------------------------------------------------------------

def halting_log_probs(lambda_logits: torch.Tensor) -> torch.Tensor:
    """log p_n = log lambda_n + sum_{k<n} log(1 - lambda_k), with lambda forced to 1 at the last step.

    Computed in log space and float32 so it stays finite even where p_n underflows:
    log(1 - sigmoid(z)) = logsigmoid(-z) never takes the log of 0.
    """
    z = lambda_logits.float()  # (steps, B)
    log_lambda = F.logsigmoid(z)
    log_lambda = torch.cat([log_lambda[:-1], torch.zeros_like(log_lambda[-1:])])  # lambda_N = 1
    log_survive = torch.cat([torch.zeros_like(z[:1]), log_survivals(z)[:-1]])
    return log_lambda + log_survive  # (steps, B)


def sample_halting_steps(lambda_logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """1-based step at which each image halts: the first n with uniforms[n] < lambda_n."""
    return first_firing(uniforms < halting_units(lambda_logits))  # lambda_N = 1: the last step halts


def first_firing(fires: torch.Tensor) -> torch.Tensor:
    """1-based first step n where fires[n] holds, or the last step: every rule that halts at
    one step ends so. (steps, B) bool, overwritten at the last step -> (B,)"""
    fires[-1].fill_(True)
    return fires.to(torch.uint8).argmax(dim=0) + 1  # argmax returns the first maximum


def quantile_halting_steps(lambda_logits: torch.Tensor, q: float) -> torch.Tensor:
    """1-based first step where the cumulative halting probability 1 - prod_{k<=n}(1 - lambda_k)
    reaches q, i.e. the survival prod_{k<=n}(1 - lambda_k) falls to 1 - q: a deterministic
    halting rule (q = 1/2: the median). (steps, B) -> (B,)"""
    return first_firing(log_survivals(lambda_logits) <= survival_threshold(q))


def survival_threshold(q: float) -> float:
    """log(1 - q): the log survival at or below which the q-quantile rule halts (log 1/2 for the median)."""
    return math.log1p(-q)


def patience_halting_steps(logits: torch.Tensor, patience: int) -> torch.Tensor:
    """1-based first step n whose predicted class argmax y_n is also that of each of the
    `patience` steps before it (so n >= patience + 1), or the last step (PABEE's patience exit).
    (steps, B, classes) -> (B,)"""
    predictions = logits.argmax(dim=-1)  # (steps, B)
    streak = torch.zeros_like(predictions[0])  # steps so far whose prediction equals the step before's
    fires = torch.zeros(predictions.shape, dtype=torch.bool, device=logits.device)
    for n in range(1, predictions.shape[0]):
        streak = torch.where(predictions[n] == predictions[n - 1], streak + 1, torch.zeros_like(streak))
        fires[n] = streak >= patience
    return first_firing(fires)


def confidence_halting_steps(logits: torch.Tensor, confidence: float) -> torch.Tensor:
    """1-based first step whose top class probability max softmax(y_n) reaches `confidence`, or
    the last step (CALM's softmax-response exit). (steps, B, classes) -> (B,)"""
    return first_firing(confident(logits, confidence))


def confident(logits: torch.Tensor, confidence: float) -> torch.Tensor:
    """Whether max softmax(y) >= confidence, (..., classes) -> (...), in float32 and without
    the softmax: the top probability is 1 / sum_j exp(y_j - y_max), so the test is
    logsumexp(y - y_max) <= -log(confidence)."""
    logits = logits.float()
    top = logits.amax(dim=-1, keepdim=True)
    return torch.logsumexp(logits - top, dim=-1) <= -math.log(confidence)


def threshold_halting_steps(lambda_logits: torch.Tensor, threshold: float) -> torch.Tensor:
    """1-based first step whose halting probability lambda_n reaches `threshold`, or the last
    step. (steps, B) -> (B,)"""
    return first_firing(reaches(lambda_logits, threshold))


def reaches(lambda_logits: torch.Tensor, threshold: float) -> torch.Tensor:
    """Whether sigmoid(z) >= threshold, compared as logits in float32 (no rounding of lambda to 1)."""
    return lambda_logits.float() >= math.log(threshold) - math.log1p(-threshold)


def rule_halting_steps(rule: HaltingRule, logits: torch.Tensor, lambda_logits: torch.Tensor,
                       uniforms: torch.Tensor) -> torch.Tensor:
    """The 1-based halting step (B,) of each image under a rule that halts at one step, from a
    forward pass over every step: what `rule_exit` decides step by step."""
    if rule.budget is not None:
        return FixedBudget(rule).halting_steps(lambda_logits)
    if rule.name == "sample":
        return sample_halting_steps(lambda_logits, uniforms)
    if rule.quantile is not None:
        return quantile_halting_steps(lambda_logits, rule.quantile)
    if rule.name == "patience":
        return patience_halting_steps(logits, rule.parameter)
    if rule.name == "confidence":
        return confidence_halting_steps(logits, rule.parameter)
    if rule.name == "threshold":
        return threshold_halting_steps(lambda_logits, rule.parameter)
    raise ValueError(f"the {rule} rule does not halt at one step")


def logits_at(logits: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Pick y_n at each image's 1-based halting step: (steps, B, C), (B,) -> (B, C)."""
    index = (steps - 1).view(1, -1, 1).expand(1, -1, logits.shape[-1])
    return logits.gather(0, index).squeeze(0)


def expected_prediction(logits: torch.Tensor, lambda_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The p-weighted average of every step's class probabilities (B, classes) and the expected
    number of steps sum_n n p_n (B,): the 'expected' halting rule, which runs every step."""
    p = halting_log_probs(lambda_logits).exp()  # (steps, B)
    probs = torch.softmax(logits.float(), dim=-1)  # (steps, B, classes)
    n = torch.arange(1, p.shape[0] + 1, device=p.device, dtype=p.dtype)[:, None]
    return (p[..., None] * probs).sum(dim=0), (n * p).sum(dim=0)


# ACT (Graves 2016) -----------------------------------------------------------------------------

class ActHalting(NamedTuple):
    p: torch.Tensor  # (steps, B) weights of the step outputs, zero after N
    steps: torch.Tensor  # (B,) N, 1-based
    remainder: torch.Tensor  # (B,) R


def act_halting(lambda_logits: torch.Tensor, epsilon: float) -> ActHalting:
    """Halting units h_n = sigmoid(z_n); N is the first step with h_1 + ... + h_N >= 1 - epsilon
    (or the last step); R = 1 - sum_{n<N} h_n; p = (h_1, ..., h_{N-1}, R, 0, ...)."""
    h = halting_units(lambda_logits)  # (steps, B)
    cumulative = running_sums(h)  # sum_{k<=n} h_k
    steps = first_firing(act_reached(cumulative, epsilon))  # max_steps caps N; (B,)
    n = torch.arange(1, h.shape[0] + 1, device=h.device)[:, None]  # (steps, 1)
    # sum_{n<N} h_n read off the same running sum that chose N (0 when N = 1)
    before = torch.where(steps > 1, cumulative.gather(0, (steps - 2).clamp_min(0)[None]).squeeze(0),
                         torch.zeros_like(steps, dtype=h.dtype))
    remainder = 1 - before
    p = torch.where(n < steps, h, torch.zeros_like(h)) + torch.where(n == steps, remainder, torch.zeros_like(h))
    return ActHalting(p, steps, remainder)


def act_reached(cumulative: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Whether the halting units summed so far reach 1 - epsilon: ACT's halting condition."""
    return cumulative >= 1 - epsilon


def act_mean_field(p: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """The p-weighted sum of the step logits, (steps, B), (steps, B, classes) -> (B, classes),
    summed step by step as `ActExit` sums it (the weights after N are 0 and add nothing)."""
    return running_sums(p[..., None] * logits.float())[-1]


def act_prediction(logits: torch.Tensor, lambda_logits: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The p-weighted mean of the step logits (B, classes) and N (B,)."""
    halting = act_halting(lambda_logits, epsilon)
    return act_mean_field(halting.p, logits), halting.steps


# Early exit: one rule object per evaluation batch, driven step by step by PonderNet.infer ----------

class EarlyExitRule:
    """Decides, step by step, which of the rows still running halt and what they predict.

    `decide` sees only the rows still running (A of them) and returns halts (A,) bool and the
    prediction (A, classes) to keep for the rows that halt; `keep(rows)` then keeps only the
    given rows (A',) of its own per-row state, integer positions among the A, as the loop does
    with the model's. (Integer indices, not a mask: a mask's indices cost a host sync each time.)
    """

    # a truncation rule's: whether the last step a training forward computes for an image takes
    # all its remaining halting mass (PonderNet.forward forces lambda to 1 there)
    forces_halt = True

    def decide(self, n: int, last: bool, logits: torch.Tensor, lambda_logits: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def keep(self, rows: torch.Tensor) -> None:
        pass


class SampleExit(EarlyExitRule):
    """Halt at the first step whose Bernoulli(lambda_n) coin fires: uniforms[n] < lambda_n, the
    coins (steps, B) drawn up front so the result equals `sample_halting_steps` on every step."""

    def __init__(self, uniforms: torch.Tensor):
        self.uniforms = uniforms  # (steps, A)

    def decide(self, n, last, logits, lambda_logits):
        if last:
            return torch.ones_like(lambda_logits, dtype=torch.bool), logits
        return self.uniforms[n] < halting_units(lambda_logits), logits

    def keep(self, rows):
        self.uniforms = self.uniforms.index_select(1, rows)


class QuantileExit(EarlyExitRule):
    """Halt where the cumulative halting probability reaches q (`quantile_halting_steps`; the
    median rule is q = 1/2)."""

    def __init__(self, batch: int, q: float, device):
        self.threshold = survival_threshold(q)
        self.log_survival = torch.zeros(batch, device=device)  # log prod_k (1 - lambda_k), (A,)

    def decide(self, n, last, logits, lambda_logits):
        self.log_survival = self.log_survival + log_continue(lambda_logits)
        halts = torch.ones_like(self.log_survival, dtype=torch.bool) if last else self.log_survival <= self.threshold
        return halts, logits

    def keep(self, rows):
        self.log_survival = self.log_survival.index_select(0, rows)


class PatienceExit(EarlyExitRule):
    """Halt once the predicted class has stayed the same for `patience` steps after the step
    that first predicted it (`patience_halting_steps`)."""

    def __init__(self, batch: int, patience: int, device):
        self.patience = patience
        self.previous = None  # argmax y_{n-1}, (A,)
        self.streak = torch.zeros(batch, dtype=torch.long, device=device)  # (A,)

    def decide(self, n, last, logits, lambda_logits):
        prediction = logits.argmax(dim=-1)
        if self.previous is not None:
            self.streak = torch.where(prediction == self.previous, self.streak + 1, torch.zeros_like(self.streak))
        self.previous = prediction
        halts = torch.ones_like(self.streak, dtype=torch.bool) if last else self.streak >= self.patience
        return halts, logits

    def keep(self, rows):
        self.streak, self.previous = self.streak.index_select(0, rows), self.previous.index_select(0, rows)


class FiringExit(EarlyExitRule):
    """A rule that looks at the current step alone: halt once `fires` holds, or at the last step
    (`first_firing`, step by step)."""

    def fires(self, logits: torch.Tensor, lambda_logits: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def decide(self, n, last, logits, lambda_logits):
        halts = torch.ones(logits.shape[0], dtype=torch.bool, device=logits.device) if last \
            else self.fires(logits, lambda_logits)
        return halts, logits


class ConfidenceExit(FiringExit):
    """Halt once the top class probability reaches `confidence` (`confidence_halting_steps`)."""

    def __init__(self, confidence: float):
        self.confidence = confidence

    def fires(self, logits, lambda_logits):
        return confident(logits, self.confidence)


class ThresholdExit(FiringExit):
    """Halt once lambda_n reaches `threshold` (`threshold_halting_steps`)."""

    def __init__(self, threshold: float):
        self.threshold = threshold

    def fires(self, logits, lambda_logits):
        return reaches(lambda_logits, self.threshold)


def rule_exit(rule: HaltingRule, uniforms: torch.Tensor) -> EarlyExitRule:
    """The early-exit form of a rule that halts at one step (see `rule_halting_steps`);
    uniforms (steps, B) are the sample rule's coins, and give the steps run, the batch size and
    the device."""
    batch, device = uniforms.shape[1], uniforms.device
    if rule.budget is not None:
        return FixedBudget(rule).within(uniforms.shape[0])
    if rule.name == "sample":
        return SampleExit(uniforms)
    if rule.quantile is not None:
        return QuantileExit(batch, rule.quantile, device)
    if rule.name == "patience":
        return PatienceExit(batch, rule.parameter, device)
    if rule.name == "confidence":
        return ConfidenceExit(rule.parameter)
    if rule.name == "threshold":
        return ThresholdExit(rule.parameter)
    raise ValueError(f"the {rule} rule needs every step; it has no early exit")


class ActExit(EarlyExitRule):
    """ACT: accumulate halting units and the p-weighted prediction until they reach 1 - epsilon;
    the same N and predictions as `act_prediction` on every step."""

    def __init__(self, batch: int, epsilon: float, device):
        self.epsilon = epsilon
        self.cumulative = torch.zeros(batch, device=device)  # sum of halting units so far, (A,)
        self.weighted = None  # running sum of p_n * y_n, (A, classes), from the first step on

    def decide(self, n, last, logits, lambda_logits):
        if self.weighted is None:
            self.weighted = torch.zeros_like(logits, dtype=torch.float32)
        unit = halting_units(lambda_logits)
        cumulative = self.cumulative + unit
        reached = torch.ones_like(cumulative, dtype=torch.bool) if last else act_reached(cumulative, self.epsilon)
        weight = torch.where(reached, 1 - self.cumulative, unit)  # R on the halting step
        self.weighted = self.weighted + weight[:, None] * logits.float()
        self.cumulative = cumulative
        return reached, self.weighted

    def keep(self, rows):
        self.cumulative, self.weighted = self.cumulative.index_select(0, rows), self.weighted.index_select(0, rows)


# The fixed budget ------------------------------------------------------------------------------

class FixedBudget(EarlyExitRule):
    """fixed:N, the control that adaptive halting is measured against: every input stops at
    step N whatever its halting says, for every method alike (ACT's too: it then reads step N's
    own output y_N). The budget's one home: which rules are one (`of`), its range (`problem`,
    `within`: refused beyond the steps run, never cut to them), its per-step form
    (`halting_steps`, over a forward of every step) and its early-exit form (`decide`). Its
    accuracy is the per-step accuracy at step N; the best fixed policy at a rule's mean steps is
    the reports' (reports.evaluation.best_fixed_accuracy)."""

    def __init__(self, rule: HaltingRule):
        self.rule, self.step = rule, rule.budget

    @classmethod
    def of(cls, rule: "str | HaltingRule") -> "FixedBudget | None":
        """The budget `rule` names; None for any other rule, a method's own label ("act", "one
        step") or a spelling that is no rule."""
        try:
            rule = parse_halting_rule(rule)
        except ValueError:
            return None
        return cls(rule) if rule.budget is not None else None

    def problem(self, steps: int, runs: str = "run") -> str | None:
        """Why it cannot apply where `steps` steps are run (`runs` says by what), else None."""
        if self.step <= steps:
            return None
        return f"{self.rule.spelling} stops at step {self.step}, beyond the {steps} step{'s' * (steps != 1)} {runs}"

    def within(self, steps: int) -> "FixedBudget":
        problem = self.problem(steps)
        if problem is not None:
            raise ValueError(problem)
        return self

    def halting_steps(self, lambda_logits: torch.Tensor) -> torch.Tensor:
        """Step N (1-based) for every input, (steps, B) -> (B,)."""
        self.within(lambda_logits.shape[0])
        return torch.full(lambda_logits.shape[1:], self.step, dtype=torch.long, device=lambda_logits.device)

    def decide(self, n, last, logits, lambda_logits):
        # the same for every row: no row leaves before step N, so the batch that reaches it is
        # the whole batch, and no tensor is compared on the device
        halts = last or n + 1 >= self.step
        return torch.full(lambda_logits.shape, halts, dtype=torch.bool, device=lambda_logits.device), logits


# Truncation in training ------------------------------------------------------------------------
# Rules that decide when a training forward needs no more steps for an
# input, in two forms with one arithmetic: step by step (halting.EarlyExitRule's `decide`, which
# PonderNet.forward with `stop` drives, dropping the inputs that are done) and over every step at
# once (`computed_steps`, a mask over the fixed step count: fixed shapes, no host read, what a
# captured CUDA graph runs; model.truncate applies it). Also the weights that keep the roulette
# rule's loss unbiased.


class TruncationRule(EarlyExitRule):
    """A rule whose decision reads only the halting logits."""

    # whether the full forward's loss and gradients are already those of the truncated one, so
    # that a batch on every step needs no mask (ACT: every step after its halting step weighs 0)
    mask_is_identity = False

    def computed_steps(self, lambda_logits: torch.Tensor) -> torch.Tensor:
        """The batch form, (steps, B) -> (B,): the 1-based step at which each input is done, from
        `decide` applied to every input at every step (no row dropped, so the same float32
        arithmetic as the early-exit loop's). Call it on a fresh rule, once."""
        steps = lambda_logits.shape[0]
        computed = torch.full(lambda_logits.shape[1:], steps, dtype=torch.long, device=lambda_logits.device)
        running = torch.ones_like(computed, dtype=torch.bool)
        for n in range(steps):
            done, _ = self.decide(n, n == steps - 1, None, lambda_logits[n])
            computed = torch.where(running & done, n + 1, computed)
            running = running & ~done
        return computed


class TruncateBelow(TruncationRule):
    """PonderNet: an image is done once its remaining halting mass prod_k (1 - lambda_k) falls
    below epsilon (per image; the paper truncates the whole batch at 0.05)."""

    def __init__(self, batch: int, epsilon: float, device):
        self.log_epsilon = math.log(epsilon)
        self.log_survival = torch.zeros(batch, device=device)  # (A,)

    def decide(self, n, last, logits, lambda_logits):
        self.log_survival = self.log_survival + log_continue(lambda_logits.detach())
        done = torch.ones_like(self.log_survival, dtype=torch.bool) if last else self.log_survival < self.log_epsilon
        return done, logits

    def keep(self, rows):
        self.log_survival = self.log_survival.index_select(0, rows)


class ContinueBelow(TruncationRule):
    """PonderNet, unbiased: an image whose remaining halting mass S_n = prod_{k<=n} (1 - lambda_k)
    is below epsilon goes on to step n + 1 only with probability S_n / epsilon ("Russian
    roulette"), so it reaches step n with probability r_n = min(1, S_{n-1} / epsilon)
    (`reach_log_probs`), and the loss weighs step n's terms by 1 / r_n (`roulette_weights`): in
    expectation, the loss and its gradient over every step. The coins `uniforms` (steps, B) are
    drawn up front. Its last computed step keeps its own lambda (no mass is moved onto it)."""

    forces_halt = False

    def __init__(self, epsilon: float, uniforms: torch.Tensor):
        self.log_epsilon = math.log(epsilon)
        self.uniforms = uniforms  # (steps, A)
        self.log_survival = torch.zeros(uniforms.shape[1], device=uniforms.device)  # log S_n, (A,)
        self.log_reach = torch.zeros_like(self.log_survival)  # log r_n of the step just computed, (A,)

    def decide(self, n, last, logits, lambda_logits):
        self.log_survival = self.log_survival + log_continue(lambda_logits.detach())
        log_reach_next = reach_log_prob(self.log_survival, self.log_epsilon)
        going_on = torch.exp(log_reach_next - self.log_reach)  # P(step n + 1 | step n)
        self.log_reach = log_reach_next
        done = torch.ones_like(self.log_survival, dtype=torch.bool) if last else self.uniforms[n] >= going_on
        return done, logits

    def keep(self, rows):
        self.uniforms = self.uniforms.index_select(1, rows)
        self.log_survival = self.log_survival.index_select(0, rows)
        self.log_reach = self.log_reach.index_select(0, rows)


def reach_log_prob(log_survival: torch.Tensor, log_epsilon: float) -> torch.Tensor:
    """log min(1, S / epsilon): the log probability that `ContinueBelow` computes the step after
    one whose remaining halting mass is S (log S given)."""
    return (log_survival - log_epsilon).clamp_max(0.0)


def roulette_weights(lambda_logits: torch.Tensor, computed: torch.Tensor, epsilon: float) -> torch.Tensor:
    """1 / r_n for the steps each image computed under `ContinueBelow` (r_n its probability of
    computing step n), 0 after them: (steps, B), float32, detached. lambda_logits (steps, B) as
    the truncated forward gave them, computed (B,) the steps it computed."""
    log_survival = log_survivals(lambda_logits.detach())  # log S_n after step n
    log_reach = reach_log_prob(torch.cat([torch.zeros_like(log_survival[:1]), log_survival[:-1]]), math.log(epsilon))
    n = torch.arange(1, lambda_logits.shape[0] + 1, device=lambda_logits.device)[:, None]  # (steps, 1)
    return torch.where(n <= computed, torch.exp(-log_reach), torch.zeros_like(log_reach))


class ActHalted(TruncationRule):
    """ACT: an image is done at its halting step N; every later step has weight 0, so dropping
    it changes nothing (exact)."""

    mask_is_identity = True

    def __init__(self, batch: int, epsilon: float, device):
        self.epsilon = epsilon
        self.cumulative = torch.zeros(batch, device=device)  # (A,)

    def decide(self, n, last, logits, lambda_logits):
        self.cumulative = self.cumulative + halting_units(lambda_logits.detach())
        done = torch.ones_like(self.cumulative, dtype=torch.bool) if last else act_reached(self.cumulative, self.epsilon)
        return done, logits

    def keep(self, rows):
        self.cumulative = self.cumulative.index_select(0, rows)


class RandomDepth(TruncationRule):
    """Random-depth training: input b is done at its own depth depths[b] (1-based, drawn by the
    method), where its halting is forced, so every depth from the lowest drawn on trains its
    halting as the last step would (Huginn's recurrence sampled at a random depth)."""

    def __init__(self, depths: torch.Tensor):
        self.depths = depths  # (A,)

    def decide(self, n, last, logits, lambda_logits):
        done = torch.ones_like(self.depths, dtype=torch.bool) if last else self.depths <= n + 1
        return done, logits

    def keep(self, rows):
        self.depths = self.depths.index_select(0, rows)


class EitherDone(TruncationRule):
    """An input is done when either of two rules (each forcing its halt) says so."""

    def __init__(self, first: TruncationRule, second: TruncationRule):
        self.first, self.second = first, second

    def decide(self, n, last, logits, lambda_logits):
        done_first, _ = self.first.decide(n, last, logits, lambda_logits)
        done_second, _ = self.second.decide(n, last, logits, lambda_logits)
        return done_first | done_second, logits

    def keep(self, rows):
        self.first.keep(rows)
        self.second.keep(rows)


class StopAfterFirstStep(TruncationRule):
    """Every image is done after its first step: the least that any forward pass computes."""

    def decide(self, n, last, logits, lambda_logits):
        return torch.ones_like(lambda_logits, dtype=torch.bool), logits
