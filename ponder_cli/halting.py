"""Halting rules, each defined once by its decision at a step: PonderNet's (sample, median,
quantile:Q, patience:K, confidence:C, threshold:T; spelled in registry.py), the fixed budget
fixed:N, ACT's, and the truncation rules that say which steps a training forward computes.

A rule's `decide` sees one step of the rows still running; the early-exit loop (PonderNet.infer,
and a truncated training forward) drives it step by step, dropping the rows that halt, and
`halting_steps` drives the same rule over a forward of every step with no row dropped. The two
forms are one arithmetic, so early exit equals the full forward by construction.

Shapes: lambda_logits (steps, B) are pre-sigmoid conditional halting probabilities; logits
(steps, B, classes) are the class scores y_n of every step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .registry import HaltingRule, parse_halting_rule

# Per-step terms and running sums: the same float32 numbers wherever a row sits ---------------


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
    time in step order as the rules add them. (torch.cumsum on the CPU accumulates float32 in
    float64: its sums differ in the last bit and, near a threshold, halt at another step.)"""
    total, sums = torch.zeros_like(terms[0]), []
    for term in terms:
        total = total + term
        sums.append(total)
    return torch.stack(sums)


def confident(logits: torch.Tensor, confidence: float) -> torch.Tensor:
    """Whether max softmax(y) >= confidence, (..., classes) -> (...), in float32 and without
    the softmax: the top probability is 1 / sum_j exp(y_j - y_max), so the test is
    logsumexp(y - y_max) <= -log(confidence)."""
    logits = logits.float()
    top = logits.amax(dim=-1, keepdim=True)
    return torch.logsumexp(logits - top, dim=-1) <= -math.log(confidence)


def reach_log_prob(log_survival: torch.Tensor, log_epsilon: float) -> torch.Tensor:
    """log min(1, S / epsilon): the log probability that `Roulette` computes the step after one
    whose remaining halting mass is S (log S given)."""
    return (log_survival - log_epsilon).clamp_max(0.0)


# The rules ---------------------------------------------------------------------------------------

class Rule:
    """Decides, step by step, which of the rows still running halt and what they predict.

    `decide(n, last, logits, lambda_logits)` sees step n (0-based; `last`, the last step run) of
    the rows still running (A of them): class logits (A, classes), or None where only the steps
    are asked for (a truncation reads the halting logits alone), and halting logits (A,),
    detached. It returns halts (A,) bool, True for every row at the last step, and what the rows
    that halt predict (A, classes), or None for the step's own class logits. `keep(rows)` then
    keeps the given rows (A',) of its per-row state, integer positions among the A, as the loop
    does with the model's. (Integer indices, not a mask: a mask's indices cost a host sync each
    time.) State starts empty and takes its rows from the first step. A rule object serves one
    batch, once.
    """

    # a truncation's: whether the last step it computes for an input takes all its remaining
    # halting mass (PonderNet.forward forces lambda to 1 there)
    forces_halt = True
    # a truncation's: whether the full forward's loss and gradients are already those of the
    # truncated one, so that a batch on every step needs no mask (ACT: every step after its
    # halting step weighs 0)
    mask_is_identity = False

    def decide(self, n: int, last: bool, logits: torch.Tensor | None, lambda_logits: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        raise NotImplementedError

    def keep(self, rows: torch.Tensor) -> None:
        pass


def halting_steps(rule: Rule, logits: torch.Tensor | None, lambda_logits: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The full-forward form of every rule: `rule` (fresh) decides at every step for every row,
    none dropped, and each row halts at the first step it says so. Returns the 1-based halting
    steps (B,) and the prediction there (B, classes), None without `logits`. Fixed shapes, no
    host read (a captured training batch runs it)."""
    count = lambda_logits.shape[0]
    halts, chosen = [], []
    for n in range(count):
        step_halts, step_chosen = rule.decide(n, n == count - 1, None if logits is None else logits[n],
                                              lambda_logits[n].detach())
        halts.append(step_halts)
        chosen.append(step_chosen)
    steps = torch.stack(halts).to(torch.uint8).argmax(dim=0) + 1  # argmax returns the first maximum
    if logits is None:
        return steps, None
    return steps, logits_at(logits if chosen[0] is None else torch.stack(chosen), steps)


def logits_at(logits: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Pick y_n at each image's 1-based halting step: (steps, B, C), (B,) -> (B, C)."""
    index = (steps - 1).view(1, -1, 1).expand(1, -1, logits.shape[-1])
    return logits.gather(0, index).squeeze(0)


def _all(like: torch.Tensor) -> torch.Tensor:
    return torch.ones(like.shape[0], dtype=torch.bool, device=like.device)


def _rows(state, rows: torch.Tensor, dim: int = 0):
    return None if state is None else state.index_select(dim, rows)


class Sample(Rule):
    """Halt at the first step whose Bernoulli(lambda_n) coin fires: uniforms[n] < lambda_n, the
    coins (steps, B) drawn up front."""

    def __init__(self, uniforms: torch.Tensor):
        self.uniforms = uniforms  # (steps, A)

    def decide(self, n, last, logits, lambda_logits):
        return _all(lambda_logits) if last else self.uniforms[n] < halting_units(lambda_logits), None

    def keep(self, rows):
        self.uniforms = self.uniforms.index_select(1, rows)


class Quantile(Rule):
    """Halt where the cumulative halting probability 1 - prod_{k<=n} (1 - lambda_k) reaches q,
    i.e. the log survival falls to log(1 - q) (the median rule: q = 1/2)."""

    def __init__(self, q: float):
        self.threshold = math.log1p(-q)
        self.log_survival = None  # log prod_k (1 - lambda_k), (A,)

    def decide(self, n, last, logits, lambda_logits):
        step = log_continue(lambda_logits)
        self.log_survival = step if self.log_survival is None else self.log_survival + step
        return _all(lambda_logits) if last else self.log_survival <= self.threshold, None

    def keep(self, rows):
        self.log_survival = _rows(self.log_survival, rows)


class Patience(Rule):
    """Halt at the first step n whose predicted class argmax y_n is also that of each of the
    `patience` steps before it (PABEE's patience exit)."""

    def __init__(self, patience: int):
        self.patience = patience
        self.previous = self.streak = None  # argmax y_{n-1}; steps so far equal to the step before, (A,)

    def decide(self, n, last, logits, lambda_logits):
        prediction = logits.argmax(dim=-1)
        if self.previous is None:
            self.streak = torch.zeros_like(prediction)
        else:
            self.streak = torch.where(prediction == self.previous, self.streak + 1, torch.zeros_like(self.streak))
        self.previous = prediction
        return _all(lambda_logits) if last else self.streak >= self.patience, None

    def keep(self, rows):
        self.streak, self.previous = _rows(self.streak, rows), _rows(self.previous, rows)


class Confidence(Rule):
    """Halt once the top class probability max softmax(y_n) reaches `confidence` (CALM's
    softmax-response exit)."""

    def __init__(self, confidence: float):
        self.confidence = confidence

    def decide(self, n, last, logits, lambda_logits):
        return _all(lambda_logits) if last else confident(logits, self.confidence), None


class Threshold(Rule):
    """Halt once lambda_n reaches `threshold`, compared as logits in float32 (no rounding of
    lambda to 1)."""

    def __init__(self, threshold: float):
        self.logit = math.log(threshold) - math.log1p(-threshold)

    def decide(self, n, last, logits, lambda_logits):
        return _all(lambda_logits) if last else lambda_logits.float() >= self.logit, None


class FixedBudget(Rule):
    """fixed:N, the control that adaptive halting is measured against: every input stops at
    step N whatever its halting says, for every method alike (ACT's too: it then reads step N's
    own output y_N). Refused beyond the steps run, never cut to them (`problem`, which a method
    asks before it runs; a forward that ends before step N raises). Its accuracy is the per-step
    accuracy at step N; the best fixed policy at a rule's mean steps is the reports'
    (reports.evaluation.best_fixed_accuracy)."""

    def __init__(self, rule: "HaltingRule | int"):
        self.rule = parse_halting_rule(f"fixed:{rule}") if isinstance(rule, int) else rule
        self.step = self.rule.budget

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

    def decide(self, n, last, logits, lambda_logits):
        if last and n + 1 < self.step:
            raise ValueError(self.problem(n + 1))
        # the same for every row: no row leaves before step N, so the batch that reaches it is
        # the whole batch, and no tensor is compared on the device
        return torch.full(lambda_logits.shape, last or n + 1 >= self.step, dtype=torch.bool,
                          device=lambda_logits.device), None


def rule_of(rule: "str | HaltingRule", uniforms: torch.Tensor | None = None) -> Rule:
    """The rule a --halting spelling names, fresh for one batch; uniforms (steps, B), the sample
    rule's coins. 'expected' needs every step and halts at none."""
    rule = parse_halting_rule(rule)
    if rule.budget is not None:
        return FixedBudget(rule)
    if rule.name == "sample":
        return Sample(uniforms)
    if rule.quantile is not None:
        return Quantile(rule.quantile)
    if rule.name == "patience":
        return Patience(rule.parameter)
    if rule.name == "confidence":
        return Confidence(rule.parameter)
    if rule.name == "threshold":
        return Threshold(rule.parameter)
    raise ValueError(f"the {rule} rule needs every step; it halts at no one step")


class Act(Rule):
    """ACT (Graves 2016): halting units h_n = sigmoid(z_n) summed until they reach 1 - epsilon
    (N, or the last step); the prediction is the p-weighted sum of the step logits, p = (h_1,
    ..., h_{N-1}, R = 1 - sum_{n<N} h_n). As a truncation, exact: every later step weighs 0."""

    mask_is_identity = True

    def __init__(self, epsilon: float):
        self.epsilon = epsilon
        self.cumulative = None  # sum of halting units so far, (A,)
        self.weighted = None  # running sum of p_n * y_n, (A, classes), from the first step on

    def decide(self, n, last, logits, lambda_logits):
        unit = halting_units(lambda_logits)
        before = torch.zeros_like(unit) if self.cumulative is None else self.cumulative
        self.cumulative = before + unit
        reached = _all(unit) if last else act_reached(self.cumulative, self.epsilon)
        if logits is None:
            return reached, None
        if self.weighted is None:
            self.weighted = torch.zeros_like(logits, dtype=torch.float32)
        weight = torch.where(reached, 1 - before, unit)  # R on the halting step
        self.weighted = self.weighted + weight[:, None] * logits.float()
        return reached, self.weighted

    def keep(self, rows):
        self.cumulative, self.weighted = _rows(self.cumulative, rows), _rows(self.weighted, rows)


def act_reached(cumulative: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Whether the halting units summed so far reach 1 - epsilon: ACT's halting condition."""
    return cumulative >= 1 - epsilon


# Truncation in training: which steps a training forward computes --------------------------------
# Driven step by step by PonderNet.forward with `stop` (dropping the inputs that are done), or by
# `halting_steps` over a forward of every step and applied as a mask (model.truncate: fixed shapes,
# no host read, what a captured CUDA graph runs). Both give the same steps. Also ACT's `Act`, and
# FixedBudget(1), the least any forward computes.


class Cut(Rule):
    """PonderNet: an input is done once its remaining halting mass prod_k (1 - lambda_k) falls
    below `epsilon` (per input; the paper truncates the whole batch at 0.05), or at its own depth
    depths[b] (1-based, drawn by the method: random-depth training, where its halting is forced,
    so every depth from the lowest drawn on trains its halting as the last step would), whichever
    comes first. Either may be None."""

    def __init__(self, epsilon: float | None = None, depths: torch.Tensor | None = None):
        self.log_epsilon = None if epsilon is None else math.log(epsilon)
        self.depths = depths  # (A,)
        self.log_survival = None  # (A,)

    def decide(self, n, last, logits, lambda_logits):
        done = None
        if self.log_epsilon is not None:
            step = log_continue(lambda_logits)
            self.log_survival = step if self.log_survival is None else self.log_survival + step
            done = self.log_survival < self.log_epsilon
        if self.depths is not None:
            deep = self.depths <= n + 1
            done = deep if done is None else done | deep
        return _all(lambda_logits) if last else done, None

    def keep(self, rows):
        self.log_survival, self.depths = _rows(self.log_survival, rows), _rows(self.depths, rows)


class Roulette(Rule):
    """PonderNet, unbiased: an input whose remaining halting mass S_n = prod_{k<=n} (1 - lambda_k)
    is below epsilon goes on to step n + 1 only with probability S_n / epsilon ("Russian
    roulette"), so it reaches step n with probability r_n = min(1, S_{n-1} / epsilon), and the
    loss weighs step n's terms by 1 / r_n (methods.roulette_weights): in expectation, the loss and
    its gradient over every step. The coins `uniforms` (steps, B) are drawn up front. Its last
    computed step keeps its own lambda (no mass is moved onto it)."""

    forces_halt = False

    def __init__(self, epsilon: float, uniforms: torch.Tensor):
        self.log_epsilon = math.log(epsilon)
        self.uniforms = uniforms  # (steps, A)
        self.log_survival = None  # log S_n, (A,)
        self.log_reach = 0.0  # log r_n of the step just computed, (A,)

    def decide(self, n, last, logits, lambda_logits):
        step = log_continue(lambda_logits)
        self.log_survival = step if self.log_survival is None else self.log_survival + step
        log_reach_next = reach_log_prob(self.log_survival, self.log_epsilon)
        going_on = torch.exp(log_reach_next - self.log_reach)  # P(step n + 1 | step n)
        self.log_reach = log_reach_next
        return _all(lambda_logits) if last else self.uniforms[n] >= going_on, None

    def keep(self, rows):
        self.uniforms = self.uniforms.index_select(1, rows)
        self.log_survival, self.log_reach = _rows(self.log_survival, rows), _rows(self.log_reach, rows)
