"""The model's core: PonderNet's network, its halting rules, its halting distribution and
losses, and the halting methods (PonderNet, ACT, plain) that share one network.

- Halting rules, each defined once by its decision at a step (`Rule.halts`): PonderNet's
  (sample, median, quantile:Q, patience:K, confidence:C, threshold:T; spelled in registry.py),
  the fixed budget fixed:N, ACT's, and the truncations that say which steps a training forward
  computes. The early-exit loop (`PonderNet._until_done`) drives a rule step by step, dropping
  the rows that halt; `halting_steps` drives the same rule over a forward of every step with no
  row dropped: one arithmetic, so early exit equals the full forward by construction.
- PonderNet's distribution and loss: p_n from the conditional halting probabilities lambda_n,
  the expected reconstruction loss plus beta * KL(p || prior).
- The network: a step function applied up to max_steps times and two heads reading each step,
  the class head (y_n) and the halting head (lambda_n).
- The methods: what differs between PonderNet, ACT and a one-step network: the loss, the rule
  inference halts by, the truncation training may use, a batch's metrics, config constraints.
  Register a new one in `registry.METHODS` (or an entry point in the group `ponder_cli.methods`).

Shapes: lambda_logits (steps, B) are pre-sigmoid conditional halting probabilities; logits
(steps, B, classes) are the class scores y_n of every step.
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import PonderError, pieces
from .config import implied_values
from .registry import device_problem, method_class, parse_halting_rule, step_class

# Per-step terms and their sums: the same float32 numbers wherever a row sits -----------------


def halting_units(lambda_logits: torch.Tensor) -> torch.Tensor:
    """lambda_n = sigmoid(z_n) in float32, as exp(logsigmoid(z)): the same float wherever z sits
    in a tensor. (torch.sigmoid on the CPU rounds differently in its vectorised body and its
    scalar tail, and the two forms hold a row at different positions.)"""
    return F.logsigmoid(lambda_logits.float()).exp()


def log_continue(lambda_logits: torch.Tensor) -> torch.Tensor:
    """log(1 - lambda_n) = logsigmoid(-z_n) in float32, never the log of 0."""
    return F.logsigmoid(-lambda_logits.float())


def _plus(total: torch.Tensor | None, term: torch.Tensor) -> torch.Tensor:
    """A rule's running sum after one more step's term (the first term alone starts it)."""
    return term if total is None else total + term


def reach_log_prob(log_survival: torch.Tensor, log_epsilon: float) -> torch.Tensor:
    """log min(1, S / epsilon): the log probability that `Roulette` computes the step after one
    whose remaining halting mass is S (log S given)."""
    return (log_survival - log_epsilon).clamp_max(0.0)


# The rules ---------------------------------------------------------------------------------------

class Rule:
    """Which of the A rows still running halt at step n (0-based), `halts(n, logits (A, classes)
    or None, lambda_logits (A,))`; every row halts at the last step (`decide`). The per-row state
    lives in the attributes `per_row` names (rows first; "uniforms" (steps, A)), which `keep` cuts
    to the rows going on. A rule object serves one batch, once."""

    per_row: tuple = ()
    # a truncation's: whether the last step it computes for an input takes all its remaining
    # halting mass (PonderNet.forward forces lambda to 1 there)
    forces_halt = True
    # a truncation's: whether the full forward's loss and gradients are already those of the
    # truncated one, so that a batch on every step needs no mask (ACT: every later step weighs 0)
    mask_is_identity = False

    def halts(self, n: int, logits: torch.Tensor | None, lambda_logits: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def decide(self, n: int, last: bool, logits: torch.Tensor | None, lambda_logits: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """halts (A,), every row at the `last` step, and what the halting rows predict (A,
        classes), None for the step's own logits."""
        halts = self.halts(n, logits, lambda_logits)
        return (torch.ones_like(halts) if last else halts), None

    def keep(self, rows: torch.Tensor) -> None:
        for name in self.per_row:
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.index_select(1 if name == "uniforms" else 0, rows))


def halting_steps(rule: Rule, logits: torch.Tensor | None, lambda_logits: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The full-forward form of every rule: `rule` (fresh) decides at every step for every row,
    none dropped; each row halts at the first step it says so. Returns the 1-based halting steps
    (B,) and the prediction there (B, classes) or None. Fixed shapes, no host read."""
    count = lambda_logits.shape[0]
    halts, chosen = [], []
    for n in range(count):
        step_halts, step_chosen = rule.decide(n, n == count - 1, None if logits is None else logits[n],
                                              lambda_logits[n])
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


def _rows(state, rows: torch.Tensor):
    return None if state is None else state.index_select(0, rows)


class Sample(Rule):
    """Halt at the first step whose Bernoulli(lambda_n) coin fires: uniforms[n] < lambda_n, the
    coins (steps, B) drawn up front."""
    per_row = ("uniforms",)

    def __init__(self, uniforms: torch.Tensor):
        self.uniforms = uniforms

    def halts(self, n, logits, lambda_logits):
        return self.uniforms[n] < halting_units(lambda_logits)


class Quantile(Rule):
    """Halt where the cumulative halting probability 1 - prod_{k<=n} (1 - lambda_k) reaches q,
    i.e. the log survival falls to log(1 - q) (the median rule: q = 1/2)."""
    per_row = ("log_survival",)

    def __init__(self, q: float):
        self.threshold = math.log1p(-q)
        self.log_survival = None  # log prod_k (1 - lambda_k), (A,)

    def halts(self, n, logits, lambda_logits):
        self.log_survival = _plus(self.log_survival, log_continue(lambda_logits))
        return self.log_survival <= self.threshold


class Patience(Rule):
    """Halt at the first step n whose predicted class argmax y_n is also that of each of the
    `patience` steps before it (PABEE's patience exit)."""
    per_row = ("previous", "streak")

    def __init__(self, patience: int):
        self.patience = patience
        self.previous = self.streak = None  # argmax y_{n-1}; steps so far equal to the step before, (A,)

    def halts(self, n, logits, lambda_logits):
        prediction = logits.argmax(dim=-1)
        if self.previous is None:
            self.streak = torch.zeros_like(prediction)
        else:
            self.streak = torch.where(prediction == self.previous, self.streak + 1, torch.zeros_like(self.streak))
        self.previous = prediction
        return self.streak >= self.patience


class Confidence(Rule):
    """Halt once the top class probability max softmax(y_n) reaches `confidence` (CALM's
    softmax-response exit), in float32 and without the softmax: the top probability is
    1 / sum_j exp(y_j - y_max)."""

    def __init__(self, confidence: float):
        self.log_confidence = math.log(confidence)

    def halts(self, n, logits, lambda_logits):
        logits = logits.float()
        return torch.logsumexp(logits - logits.amax(dim=-1, keepdim=True), dim=-1) <= -self.log_confidence


class Threshold(Rule):
    """Halt once lambda_n reaches `threshold`, compared as logits in float32 (no rounding of
    lambda to 1)."""

    def __init__(self, threshold: float):
        self.logit = math.log(threshold) - math.log1p(-threshold)

    def halts(self, n, logits, lambda_logits):
        return lambda_logits.float() >= self.logit


class FixedBudget(Rule):
    """fixed:N, the control adaptive halting is measured against: every input stops at step N,
    for every method alike. Refused beyond the steps run (Method.halting_problem), never cut to
    them: a forward that ends before step N raises."""

    def __init__(self, step: int):
        self.step = step

    def halts(self, n, logits, lambda_logits):
        # the same for every row: no row leaves before step N, so the batch that reaches it is
        # the whole batch, and no tensor is compared on the device
        return torch.full(lambda_logits.shape, n + 1 >= self.step, dtype=torch.bool, device=lambda_logits.device)

    def decide(self, n, last, logits, lambda_logits):
        if last and n + 1 < self.step:
            raise ValueError(f"fixed:{self.step} stops at step {self.step}, beyond the {n + 1} "
                             f"step{'s' * (n != 0)} run")
        return super().decide(n, last, logits, lambda_logits)


def rule_of(rule, uniforms: torch.Tensor | None = None) -> Rule:
    """The rule a --halting spelling names, fresh for one batch; uniforms (steps, B), the sample
    rule's coins. 'expected' needs every step and halts at none."""
    rule = parse_halting_rule(rule)
    if rule.budget is not None:
        return FixedBudget(rule.budget)
    if rule.quantile is not None:
        return Quantile(rule.quantile)
    kinds = {"sample": lambda: Sample(uniforms), "patience": lambda: Patience(rule.parameter),
             "confidence": lambda: Confidence(rule.parameter), "threshold": lambda: Threshold(rule.parameter)}
    if rule.name not in kinds:
        raise ValueError(f"the {rule} rule needs every step; it halts at no one step")
    return kinds[rule.name]()


class Act(Rule):
    """ACT (Graves 2016): halting units h_n = sigmoid(z_n) summed until they reach 1 - epsilon
    (N, or the last step); the prediction is the p-weighted sum of the step logits, p = (h_1,
    ..., h_{N-1}, R = 1 - sum_{n<N} h_n, 0, ...), differentiable in the units (`act_halting`
    drives it over every step for the loss). As a truncation, exact: every later step weighs 0."""

    per_row = ("cumulative", "weighted", "halted")
    mask_is_identity = True

    def __init__(self, epsilon: float):
        self.epsilon = epsilon
        self.cumulative = None  # sum of halting units so far, (A,)
        self.weighted = None  # running sum of p_n * y_n, (A, classes)
        self.halted = None  # halted at an earlier step (a forward of every step keeps such rows), (A,)
        self.p = []  # p_n of every step, (A,) each

    def decide(self, n, last, logits, lambda_logits):
        unit = halting_units(lambda_logits)
        before = torch.zeros_like(unit) if self.cumulative is None else self.cumulative
        self.cumulative = before + unit
        reached = torch.ones_like(unit, dtype=torch.bool) if last else self.cumulative >= 1 - self.epsilon
        weight = torch.where(reached, 1 - before, unit)  # R on the halting step
        if self.halted is not None:
            weight = torch.where(self.halted, torch.zeros_like(weight), weight)
        self.halted = reached if self.halted is None else self.halted | reached
        self.p.append(weight)
        if logits is None:
            return reached, None
        self.weighted = _plus(self.weighted, weight[:, None] * logits.float())
        return reached, self.weighted


class ActHalting(NamedTuple):
    p: torch.Tensor  # (steps, B) weights of the step outputs, zero after N
    steps: torch.Tensor  # (B,) N, 1-based
    remainder: torch.Tensor  # (B,) R
    prediction: torch.Tensor | None  # (B, classes) the p-weighted sum of the step logits, given them


def act_halting(lambda_logits: torch.Tensor, epsilon: float, logits: torch.Tensor | None = None) -> ActHalting:
    """ACT's rule over a forward of every step, differentiable in the halting units (the loss's)."""
    rule = Act(epsilon)
    steps, prediction = halting_steps(rule, logits, lambda_logits)
    p = torch.stack(rule.p)
    return ActHalting(p, steps, p.gather(0, (steps - 1)[None]).squeeze(0), prediction)


def act_loss(logits: torch.Tensor, lambda_logits: torch.Tensor, targets: torch.Tensor, tau: float,
             epsilon: float) -> LossParts:
    """CE of the mean-field prediction plus tau * (N + R); gradients reach the halting units
    through R (N is discrete). Reported as (total, task loss, ponder cost)."""
    halting = act_halting(lambda_logits, epsilon, logits)
    task = F.cross_entropy(halting.prediction, targets)
    ponder = (halting.steps.float() + halting.remainder).mean()
    return LossParts(task + tau * ponder, task, ponder)


# Truncation in training: which steps a training forward computes --------------------------------
# Driven step by step by PonderNet.forward with `stop` (dropping the inputs that are done), or by
# `halting_steps` over a forward of every step and applied as a mask (`truncate`: fixed shapes,
# no host read, what a captured CUDA graph runs). Both give the same steps. Also ACT's `Act`, and
# FixedBudget(1), the least any forward computes.


class Cut(Rule):
    """PonderNet: an input is done once its remaining halting mass prod_k (1 - lambda_k) falls
    below `epsilon` (per input; the paper truncates the whole batch at 0.05), or at its own depth
    depths[b] (1-based, drawn by the method: random-depth training, where its halting is forced,
    so every depth from the lowest drawn on trains its halting as the last step would), whichever
    comes first. Either may be None."""
    per_row = ("log_survival", "depths")

    def __init__(self, epsilon: float | None = None, depths: torch.Tensor | None = None):
        self.log_epsilon = None if epsilon is None else math.log(epsilon)
        self.depths = depths  # (A,)
        self.log_survival = None  # (A,)

    def halts(self, n, logits, lambda_logits):
        done = None
        if self.log_epsilon is not None:
            self.log_survival = _plus(self.log_survival, log_continue(lambda_logits))
            done = self.log_survival < self.log_epsilon
        if self.depths is not None:
            deep = self.depths <= n + 1
            done = deep if done is None else done | deep
        return done


class Roulette(Rule):
    """PonderNet, unbiased: an input whose remaining halting mass S_n = prod_{k<=n} (1 - lambda_k)
    is below epsilon goes on to step n + 1 only with probability S_n / epsilon ("Russian
    roulette"), so it reaches step n with probability r_n = min(1, S_{n-1} / epsilon), and the
    loss weighs step n's terms by 1 / r_n (roulette_weights): in expectation, the loss and
    its gradient over every step. The coins `uniforms` (steps, B) are drawn up front. Its last
    computed step keeps its own lambda (no mass is moved onto it)."""
    per_row = ("uniforms", "log_survival", "log_reach")
    forces_halt = False

    def __init__(self, epsilon: float, uniforms: torch.Tensor):
        self.log_epsilon = math.log(epsilon)
        self.uniforms = uniforms  # (steps, A)
        self.log_survival = None  # log S_n, (A,)
        self.log_reach = 0.0  # log r_n of the step just computed, (A,)

    def halts(self, n, logits, lambda_logits):
        self.log_survival = _plus(self.log_survival, log_continue(lambda_logits))
        log_reach_next = reach_log_prob(self.log_survival, self.log_epsilon)
        going_on = torch.exp(log_reach_next - self.log_reach)  # P(step n + 1 | step n)
        self.log_reach = log_reach_next
        return self.uniforms[n] >= going_on


# A halting logit whose sigmoid is 1.0 in float32: how a truncated image's last computed step
# takes all its remaining halting mass (see PonderNet.forward).
FORCED_HALT_LOGIT = 80.0


class PonderOutput(NamedTuple):
    logits: torch.Tensor  # (steps, B, classes): y_n at every step
    lambda_logits: torch.Tensor  # (steps, B): pre-sigmoid conditional halting probability
    computed: torch.Tensor | None = None  # (B,) steps computed per image, when truncated


def _forced_after(lambda_logits: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
    return torch.where(forced, torch.full_like(lambda_logits, FORCED_HALT_LOGIT), lambda_logits)


def _step_numbers(like: torch.Tensor) -> torch.Tensor:
    """1, 2, ..., steps as a column (steps, 1) on like's device."""
    return torch.arange(1, like.shape[0] + 1, device=like.device)[:, None]


def halting_as_computed(out: PonderOutput) -> torch.Tensor:
    """out's halting logits (steps, B), every input halting by its last computed step at the latest."""
    if out.computed is None:
        return out.lambda_logits
    return _forced_after(out.lambda_logits, _step_numbers(out.lambda_logits) >= out.computed)


def truncate(out: PonderOutput, rule: Rule) -> PonderOutput:
    """A forward over every step as `forward(x, stop=rule)` gives it (`rule` fresh): the steps
    after those the rule computes masked (class logits 0, halting FORCED_HALT_LOGIT, and the last
    computed step's halting forced when the rule `forces_halt`), so the loss and its gradients
    are the truncated forward's. Fixed shapes, no host read."""
    computed, _ = halting_steps(rule, None, out.lambda_logits.detach())
    n = _step_numbers(out.lambda_logits)
    logits = torch.where((n <= computed)[..., None], out.logits, torch.zeros_like(out.logits))
    forced = n >= computed if rule.forces_halt else n > computed  # (steps, B)
    return PonderOutput(logits, _forced_after(out.lambda_logits, forced), computed)


# PonderNet's halting distribution and loss -----------------------------------------------------

# PonderNet's loss is per-sample expected cross-entropy plus beta * KL(p || prior). Two flaws of
# the reference notebook are fixed: each image's own cross-entropy is weighted by its own p_n (the
# reference multiplied p_n by a batch-averaged loss, so halting could not depend on the image), and
# the KL term is computed from log p in float32, so a p_n that underflows to 0 contributes
# 0 * finite = 0 (the reference removed every sample with a zero p_n from the batch).

def log_survivals(lambda_logits: torch.Tensor) -> torch.Tensor:
    """log prod_{k<=n} (1 - lambda_k) at every step n, (steps, B), float32: the halting mass not
    yet spent after step n, added one step at a time as the rules add it. (torch.cumsum on the
    CPU accumulates float32 in float64: its sums differ in the last bit and, near a threshold,
    halt at another step.)"""
    total, sums = None, []
    for term in log_continue(lambda_logits):
        total = _plus(total, term)
        sums.append(total)
    return torch.stack(sums)


def halting_log_probs(lambda_logits: torch.Tensor) -> torch.Tensor:
    """log p_n = log lambda_n + sum_{k<n} log(1 - lambda_k), with lambda forced to 1 at the last
    step; in log space and float32, so it stays finite where p_n underflows."""
    z = lambda_logits.float()  # (steps, B)
    log_lambda = F.logsigmoid(z)
    log_lambda = torch.cat([log_lambda[:-1], torch.zeros_like(log_lambda[-1:])])  # lambda_N = 1
    log_survive = torch.cat([torch.zeros_like(z[:1]), log_survivals(z)[:-1]])
    return log_lambda + log_survive  # (steps, B)


def expected_prediction(logits: torch.Tensor, lambda_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The p-weighted average of every step's class probabilities (B, classes) and the expected
    number of steps sum_n n p_n (B,): the 'expected' halting rule, which runs every step."""
    p = halting_log_probs(lambda_logits).exp()  # (steps, B)
    probs = torch.softmax(logits.float(), dim=-1)  # (steps, B, classes)
    n = torch.arange(1, p.shape[0] + 1, device=p.device, dtype=p.dtype)[:, None]
    return (p[..., None] * probs).sum(dim=0), (n * p).sum(dim=0)


def roulette_weights(lambda_logits: torch.Tensor, computed: torch.Tensor, epsilon: float) -> torch.Tensor:
    """1 / r_n for the steps each image computed under Roulette (r_n its probability of
    computing step n), 0 after them: (steps, B), float32, detached."""
    log_survival = log_survivals(lambda_logits.detach())  # log S_n after step n
    log_reach = reach_log_prob(torch.cat([torch.zeros_like(log_survival[:1]), log_survival[:-1]]), math.log(epsilon))
    return torch.where(_step_numbers(lambda_logits) <= computed, torch.exp(-log_reach), torch.zeros_like(log_reach))


class LossParts(NamedTuple):
    total: torch.Tensor
    reconstruction: torch.Tensor
    regularisation: torch.Tensor


def geometric_log_prior(lambda_p: float, max_steps: int, device=None) -> torch.Tensor:
    """log p_G(n) for n = 1..max_steps, p_G(n) proportional to lambda_p (1 - lambda_p)^(n-1),
    renormalised over the steps run, so that KL(p || p_G) compares two distributions over the
    same support (the paper leaves the truncation implicit); clamped, so that lambda_p = 1 stays
    finite."""
    k = torch.arange(max_steps, dtype=torch.float64)
    # xlog1py gives 0 for k = 0 even when lambda_p = 1 (0 * log 0).
    log_unnormalised = math.log(lambda_p) + torch.special.xlog1py(k, -lambda_p)
    log_prior = log_unnormalised - torch.logsumexp(log_unnormalised, dim=0)
    tiny = math.log(torch.finfo(torch.float32).tiny)
    return log_prior.clamp_min(tiny).to(device=device, dtype=torch.float32)  # (steps,)


def log_prior(shape: str, lambda_p: float, max_steps: int, device=None) -> torch.Tensor:
    """log p_G(n) of the prior named `shape` (config.py's `prior` setting): geometric, or uniform."""
    if shape == "uniform":
        return torch.full((max_steps,), -math.log(max_steps), dtype=torch.float32, device=device)
    return geometric_log_prior(lambda_p, max_steps, device)


def reconstruction_loss(logits: torch.Tensor, targets: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """mean over images of sum_n p_n(image) * CE(y_n(image), target(image))."""
    steps, batch, classes = logits.shape
    ce = F.cross_entropy(logits.float().reshape(steps * batch, classes), targets.expand(steps, batch).reshape(-1),
                         reduction="none").view(steps, batch)  # (steps, B): each image's own loss at each step
    return (p * ce).sum(dim=0).mean()


def kl_to_prior(p: torch.Tensor, log_p: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
    """mean over images of KL(p || p_G) = sum_n p_n (log p_n - log p_G(n)), the paper's direction;
    p = log_p.exp(), which the caller already has."""
    return (p * (log_p - log_prior[:, None])).sum(dim=0).mean()


def ponder_loss(logits: torch.Tensor, lambda_logits: torch.Tensor, targets: torch.Tensor,
                log_prior: torch.Tensor, beta: float | torch.Tensor, weights: torch.Tensor | None = None) -> LossParts:
    """Always in float32, also under autocast. `weights` (steps, B) scale each step's terms of
    both sums (roulette_weights); `beta` may be a 0-dim tensor on the device (a warm-up's)."""
    log_p = halting_log_probs(lambda_logits)  # (steps, B), float32
    p = log_p.exp()
    if weights is not None:
        p = p * weights  # the terms' weights; log_p stays the halting distribution's
    reconstruction = reconstruction_loss(logits, targets, p)
    regularisation = kl_to_prior(p, log_p, log_prior)
    return LossParts(reconstruction + beta * regularisation, reconstruction, regularisation)


# The halting head trained on the answer (--halting-target final or correct) -------------------

def halting_targets(logits: torch.Tensor, targets: torch.Tensor, kind: str,
                    computed: torch.Tensor | None = None) -> torch.Tensor:
    """t_n (steps, B) in {0, 1}, what lambda_n is trained towards: "final", no later computed step
    changes the answer (argmax y_m = argmax y_n for every computed m > n); "correct", the answer
    at step n is the label. Steps after `computed` (B,) are not looked at (halting_bce does not
    train them). Read from the answers alone, with no gradient; fixed shapes, no host read."""
    answers = logits.detach().argmax(dim=-1)  # (steps, B)
    if kind == "correct":
        return (answers == targets).float()
    last = answers.shape[0] if computed is None else computed  # (B,) or an int
    at_last = answers[-1:] if computed is None else answers.gather(0, (computed - 1)[None])  # (1, B)
    differs = ((answers != at_last) & (_step_numbers(answers) <= last)).to(torch.uint8)  # unlike the last answer
    # final at n: no step from n on differs from the last answer (a reverse running maximum)
    return 1.0 - differs.flip(0).cummax(dim=0).values.flip(0).float()


def halting_bce(logits: torch.Tensor, lambda_logits: torch.Tensor, targets: torch.Tensor, kind: str,
                computed: torch.Tensor | None = None) -> torch.Tensor:
    """The mean binary cross-entropy of lambda_n against halting_targets over every step before
    the last computed one (at that step halting is forced, whatever lambda says)."""
    t = halting_targets(logits, targets, kind, computed)
    trained = (_step_numbers(t) < (t.shape[0] if computed is None else computed)).float().expand(t.shape)
    bce = F.binary_cross_entropy_with_logits(lambda_logits.float(), t, reduction="none")
    return (bce * trained).sum() / trained.sum().clamp_min(1.0)


# Where the model runs: the device, mixed precision ----------------------------------------

def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when present; an explicit device that is not usable is an error."""
    problem = device_problem(name)
    if problem is not None:
        raise PonderError(problem)
    name = name.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this PyTorch has no CUDA support" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise PonderError(f"--device {name} requested but CUDA is not available ({why}); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise PonderError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return device


def drops_rows(device: torch.device) -> bool:
    """Whether inputs that are done leave the later steps (training's truncated forward,
    evaluation's early exit): on the CPU, where fewer rows cost less; on a GPU every step runs on
    every input at fixed shapes (a mask), which asks the host nothing and can be captured."""
    return device.type == "cpu"


def amp_dtype(device: torch.device) -> torch.dtype:
    """fp16 on CUDA (with a GradScaler), bf16 on CPU (no scaler needed, same code path)."""
    return torch.float16 if device.type == "cuda" else torch.bfloat16


def grad_scaler(device: torch.device, amp: bool) -> torch.amp.GradScaler:
    """The GradScaler training needs: enabled exactly when autocast computes in fp16, whose small
    range lets gradients underflow unless the loss is scaled up (bf16 has float32's range)."""
    return torch.amp.GradScaler(device.type, enabled=amp and amp_dtype(device) == torch.float16)


def autocast(device: torch.device, enabled: bool, *, cache: bool = True):
    """Mixed precision on `device` when enabled; `cache` False keeps no fp16 copies of the weights
    between uses (a CUDA graph's capture must not: the copies would be made once, at capture)."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=amp_dtype(device), cache_enabled=cache)


# The network ----------------------------------------------------------------------------------

ANSWER_FEATURES = 7  # answer_features' width


def answer_features(logits: torch.Tensor, earlier: torch.Tensor | None, n, first) -> torch.Tensor:
    """What the halting head reads of step n's answer (--halting-input ...+answer), (..., classes)
    -> (..., 7), detached, float32: the top probability, its margin over the second, the entropy
    (in log classes), log(1 - top) in tens of nats (where top rounds to 1), the total-variation
    distance from the step before's probabilities and whether the top class changed (before the
    first step: uniform, changed), and 1 / (n + 1). `earlier`: the step before's logits, ignored
    where `first`; n and first scalars or tensors broadcasting over (...)."""
    log_p = torch.log_softmax(logits.detach().float(), dim=-1)
    p = log_p.exp()
    top2, top = p.topk(2, dim=-1)
    classes = p.shape[-1]
    entropy = -(p * log_p).sum(dim=-1) / math.log(classes)
    others = log_p.scatter(-1, top[..., :1], float("-inf")).logsumexp(dim=-1).clamp_min(-30.0) / 10
    if earlier is None:
        earlier = torch.zeros_like(logits)
    first = torch.as_tensor(first, device=p.device).expand(p.shape[:-1])
    q = torch.where(first[..., None], torch.full_like(p, 1 / classes), torch.softmax(earlier.detach().float(), dim=-1))
    change = (p - q).abs().sum(dim=-1) / 2
    changed = first | (earlier.detach().argmax(dim=-1) != top[..., 0])
    inverse = (1 / (torch.as_tensor(n, device=p.device, dtype=p.dtype) + 1)).expand(p.shape[:-1])
    return torch.stack([top2[..., 0], top2[..., 0] - top2[..., 1], entropy, others, change, changed.float(), inverse],
                       dim=-1)


NARROW = 2  # the widest head narrow_linear computes by hand while compiling (parity's classes)


def narrow_linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """layer(x); while torch.compile traces (--compile), a head of at most NARROW outputs as a
    product and a sum, which the compiler fuses: its backward's matrix products with an inner
    size of 1 or 2 cost more than the step's own as library calls. The floats move by rounding."""
    if not torch.compiler.is_compiling() or layer.out_features > NARROW:
        return layer(x)
    out = (x.unsqueeze(-2) * layer.weight).sum(dim=-1)
    return out if layer.bias is None else out + layer.bias


class PonderNet(nn.Module):
    def __init__(self, cfg, classes: int, input_shape: tuple):
        super().__init__()
        self.max_steps = cfg.method.max_steps
        self.step = step_class(cfg.step.name)(cfg, tuple(input_shape))
        self.output_head = nn.Linear(self.step.readout_size, classes)
        # what the halting head sees besides the readout: the step's top class probability
        # ("confidence"), the previous step's readout ("previous": [h_n, h_{n-1}], zeros before
        # the first step) and the step function's own halting features (its halting_feature)
        inputs = cfg.method.halting_input.split("+")[1:]
        self.confidence_input = "confidence" in inputs
        self.previous_input = "previous" in inputs
        self.extra_input = self.step.halting_feature in inputs
        self.answer_input = "answer" in inputs  # answer_features: how sure the step is, how it changed
        self.halting_head = nn.Linear(self.step.readout_size * (1 + self.previous_input) + self.confidence_input
                                      + self.extra_input * self.step.halting_extra_size
                                      + self.answer_input * ANSWER_FEATURES, 1)

    def forward(self, x: torch.Tensor, stop: Rule | None = None, traces: list | None = None) -> PonderOutput:
        """Every step of every image, or, with a `stop` rule (a truncation), each image until the
        rule says it is done (the steps `truncate` masks): its last computed step then takes the
        remaining halting mass (FORCED_HALT_LOGIT, unless the rule's `forces_halt` is False), later
        steps have class logits 0. `traces`, a list, receives each step's steps.StepTrace.
        """
        if stop is not None:
            return self._forward_truncated(x, stop)
        context, state = self.step.start(x, self.max_steps)
        stacked = self.step.all_steps(context, state, self.max_steps) if traces is None else None
        if stacked is None:
            readouts, extras = [], []
            for n in range(self.max_steps):
                before = state
                state, readout, extra = self.step(context, state, n)
                if traces is not None:
                    traces.append(self.step.trace(x, context, before, state, n))
                readouts.append(readout)
                extras.append(extra)
            stacked = torch.stack(readouts), None if extras[0] is None else torch.stack(extras)
        # Heads run once on all steps together: one large matmul beats `steps` small ones.
        readouts, extra = stacked  # (steps, B, readout), (steps, B, extra) or None
        previous = torch.cat([torch.zeros_like(readouts[:1]), readouts[:-1]]) if self.previous_input else None
        return PonderOutput(*self.heads(readouts, extra, previous, n=None))

    def heads(self, readout: torch.Tensor, extra: torch.Tensor | None = None,
              previous: torch.Tensor | None = None, earlier: torch.Tensor | None = None,
              n: int | None = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Class logits (..., classes) and halting logits (...) from step n's readouts (..., readout)
        (n None: every step's, stacked); `previous`, the readouts one step earlier, and `earlier`,
        the class logits one step earlier (None before the first step; n None: from the stack)."""
        logits = narrow_linear(self.output_head, readout)
        halting_input = [readout]
        if self.confidence_input:
            # detached, as the turn below: the halting loss must not teach the class head to be
            # more (or less) sure in order to halt sooner
            halting_input.append(torch.softmax(logits.detach().float(), dim=-1).amax(dim=-1, keepdim=True)
                                 .to(readout.dtype))
        if self.previous_input:
            halting_input.append(torch.zeros_like(readout) if previous is None else previous)
        if self.extra_input and extra is not None:
            # detached: halting may read the step's own features but its loss (the KL pull towards
            # halting early) must not reach the step through them, or training could teach the
            # step to work less in order to halt sooner
            halting_input.append(extra.detach().to(readout.dtype))
        if self.answer_input:
            if n is None:  # every step stacked: step n's earlier answer is step n - 1's
                n = torch.arange(logits.shape[0], device=logits.device)[:, None]  # (steps, 1)
                earlier = torch.cat([torch.zeros_like(logits[:1]), logits[:-1]])
                first = n == 0
            else:
                first = earlier is None
            halting_input.append(answer_features(logits, earlier, n, first).to(readout.dtype))
        halting_input = halting_input[0] if len(halting_input) == 1 else torch.cat(halting_input, dim=-1)
        lambda_logits = narrow_linear(self.halting_head, halting_input).squeeze(-1)
        return logits, lambda_logits if extra is None else self.step.gate_halting(lambda_logits, extra)

    def _until_done(self, x: torch.Tensor, rule: Rule, predicts: bool):
        """The one early-exit loop: each step computes only the rows still running, and `rule`
        (shown the class logits when it `predicts`) says which halt. One host sync per step
        (`nonzero`: the next step's shape), which buys skipping all work on finished rows. Returns
        the steps computed (B,) and, when it `predicts`, the rule's prediction at each row's last
        step (B, classes), else every step's class and halting logits (steps, B, ...), padded after
        a row's last step with logits 0 and halting FORCED_HALT_LOGIT (p_n = 0 there)."""
        batch = x.shape[0]
        computed = torch.full((batch,), self.max_steps, dtype=torch.long, device=x.device)
        kept = None
        context, state = self.step.start(x, self.max_steps)
        active = torch.arange(batch, device=x.device)  # rows of the batch still running
        previous = None  # the last step's readouts of the running rows, when the halting head reads them
        earlier = None  # the last step's class logits of the running rows, when it reads the answer
        for n in range(self.max_steps):
            state, readout, extra = self.step(context, state, n)  # (A, ...)
            logits, lambda_logits = self.heads(readout, extra, previous, earlier, n)
            previous = readout if self.previous_input else None
            earlier = logits if self.answer_input else None
            last = n == self.max_steps - 1
            done, chosen = rule.decide(n, last, logits if predicts else None, lambda_logits.detach())
            # Every running row is written at every step; the last write is at the step it is done,
            # after which it no longer runs: no mask of the done rows is needed.
            if predicts:
                chosen = logits if chosen is None else chosen
                kept = chosen.new_empty(batch, chosen.shape[-1]) if kept is None else kept
                kept.index_copy_(0, active, chosen)
            else:
                if kept is None:
                    kept = (logits.new_zeros(self.max_steps, batch, logits.shape[-1]),
                            lambda_logits.new_full((self.max_steps, batch), FORCED_HALT_LOGIT))
                # index_put keeps the graph: gradients flow to the rows computed at this step (the
                # step index is filled on the device: no host-to-device copy per step)
                step = active.new_full(active.shape, n)
                kept = kept[0].index_put((step, active), logits), kept[1].index_put((step, active), lambda_logits)
            computed.index_fill_(0, active, n + 1)
            if last:
                break
            going_on = torch.nonzero(~done).squeeze(1)  # (A',) positions among the A: the step's sync
            if going_on.shape[0] == 0:
                break
            if going_on.shape[0] < active.shape[0]:  # nothing to copy when no row is done
                active = active.index_select(0, going_on)
                # integer indices, never a mask: a mask's `nonzero` would make the host wait once
                # per tensor
                context = tuple(_rows(v, going_on) for v in context)
                state = tuple(_rows(v, going_on) for v in state)
                previous, earlier = _rows(previous, going_on), _rows(earlier, going_on)
                rule.keep(going_on)
        return computed, kept

    def _forward_truncated(self, x: torch.Tensor, stop: Rule) -> PonderOutput:
        computed, (logits, lambda_logits) = self._until_done(x, stop, predicts=False)
        out = PonderOutput(logits, lambda_logits, computed)
        return out._replace(lambda_logits=halting_as_computed(out)) if stop.forces_halt else out

    @torch.no_grad()
    def infer(self, x: torch.Tensor, rule: Rule) -> tuple[torch.Tensor, torch.Tensor]:
        """Real early exit under `rule`: the prediction at the halting step (B, classes) and the
        1-based halting step (B,), as the rule over a forward of every step gives them."""
        steps, prediction = self._until_done(x, rule, predicts=True)
        return prediction, steps

    def left_out_by_one_step(self, x: torch.Tensor) -> list[str]:
        """The parameters a training forward that stops every image after one step leaves out of the
        autograd graph (DDP must then look for unused ones), from one small forward on `x`; the
        random number generators are left as they were."""
        device = next(self.parameters()).device
        named = [(name, p) for name, p in self.named_parameters() if p.requires_grad]
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.enable_grad():
            out = self(x, stop=FixedBudget(1)) if self.max_steps > 1 else self(x)
            grads = torch.autograd.grad(out.logits.sum() + out.lambda_logits.sum(), [p for _, p in named],
                                        allow_unused=True)
        return [name for (name, _), grad in zip(named, grads) if grad is None]


# The methods ------------------------------------------------------------------------------------

class Method(pieces.Method):
    """What differs between PonderNet, ACT and a one-step network. Everything about the rule a
    method halts by follows from `halting_label`: a method with a rule of its own (`own_halting`,
    `own_rule`) halts by it whatever --halting asks, but at a budget (fixed:N) wherever it has steps
    to stop at."""
    # whether its loss, truncation and metrics keep a training batch capturable as a CUDA graph
    # (fixed shapes, no host read, randomness from torch's default generator): a method that does
    # not declare it trains eagerly on CUDA (train.use_graphs); tests/test_graph_safe.py proves it
    graph_safe: bool = False
    own_halting: str | None = None  # how reports name the method's own rule (None: it halts by the one asked)
    own_halting_means = ""  # that rule in words, for the message refusing another

    def __init__(self, cfg, device=None):
        self.cfg = cfg
        self.device = torch.device("cpu" if device is None else device)  # where its losses will run

    def own_rule(self) -> Rule:
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, lambda_logits: torch.Tensor, targets: torch.Tensor,
             computed: torch.Tensor | None = None, progress: torch.Tensor | None = None) -> LossParts:
        """The loss of a forward; `computed` (B,): the steps a truncated forward computed (None: all);
        `progress`: the optimizer steps taken, a 0-dim tensor on the device (None: evaluation)."""
        raise NotImplementedError

    def truncation(self, batch: int, device) -> Rule | None:
        """The rule that lets training drop an image from later steps (None: every step), drawing
        from torch's default generator."""
        return None

    def follows(self, rule: str) -> bool:
        """Whether this method halts by `rule` as asked: one with a rule of its own halts by a
        budget alone, where it has steps to stop at ("act", "one step": its own)."""
        return self.own_halting is None or (self.cfg.method.max_steps > 1 and _budget(rule) is not None)

    def halting_label(self, rule: str) -> str:
        """The halting rule that really applies when the user asks for `rule`."""
        return rule if self.follows(rule) else self.own_halting

    def halting_problem(self, rule: str) -> str | None:
        """Why this method cannot halt by `rule` (None: it can): a budget beyond its steps, or, where
        it has steps to stop at, a rule other than its own or a budget."""
        steps, budget = self.cfg.method.max_steps, _budget(rule)
        if not self.follows(rule) and steps > 1:
            return (f"--halting {rule} applies to pondernet checkpoints; this one is {self.name}, which halts by "
                    f"its own rule ({self.own_halting_means}) or at a fixed budget (fixed:N)")
        if budget is None or budget <= steps:
            return None
        return (f"--halting {parse_halting_rule(rule).spelling} stops at step {budget}, beyond the {steps} "
                f"step{'s' * (steps != 1)} this {self.name} model runs"
                + (" (--max-steps runs more)" if self.cfg.method.name != "plain" else ""))

    def needs_all_steps(self, rule: str) -> bool:
        """Whether predicting under `rule` needs every step of every image (no early exit)."""
        return self.follows(rule) and not parse_halting_rule(rule).halts_at_one_step

    def exit_rule(self, rule: str, uniforms: torch.Tensor) -> Rule:
        """The Rule this method halts by when asked for `rule`, fresh for one batch; uniforms
        (steps, B): the halting coins."""
        return rule_of(rule, uniforms) if self.follows(rule) else self.own_rule()

    def predict(self, logits: torch.Tensor, lambda_logits: torch.Tensor, uniforms: torch.Tensor,
                rule: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Class scores (B, classes) and ponder steps (B,) from a forward pass over every step."""
        if self.needs_all_steps(rule):
            return expected_prediction(logits, lambda_logits)
        steps, scores = halting_steps(self.exit_rule(rule, uniforms), logits, lambda_logits)
        return scores, steps

    def probabilities(self, scores: torch.Tensor, rule: str) -> torch.Tensor:
        """Class probabilities (B, classes) from `predict`'s scores under `rule` (the expected
        rule's scores already are)."""
        return scores.float() if self.needs_all_steps(rule) else torch.softmax(scores.float(), dim=-1)

    def halting_distribution(self, lambda_logits: torch.Tensor) -> torch.Tensor:
        """p_n (steps, B): the weight this method gives each step's output (PonderNet: the
        halting distribution; ACT: h_1, ..., h_{N-1}, R, 0, ...)."""
        return halting_log_probs(lambda_logits).exp()

    def batch_metrics(self, out, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A training batch's correct predictions and halting steps summed (scalars on the device):
        their expectations under the halting distribution, sum_n p_n [y_n right] and sum_n n p_n."""
        p = self.halting_distribution(halting_as_computed(out))  # (steps, B)
        right = (out.logits.argmax(dim=-1) == targets).to(p.dtype)  # (steps, B)
        n = torch.arange(1, p.shape[0] + 1, device=p.device, dtype=p.dtype)[:, None]
        return (p * right).sum(), (p * n).sum()


def _budget(rule) -> int | None:
    """The step fixed:N stops at; None for another rule or a method's own label ("act")."""
    try:
        return parse_halting_rule(rule).budget
    except ValueError:
        return None


def get_method(cfg, device=None) -> Method:
    """The config's method; `device`, where its losses will run (what it builds once goes there)."""
    return method_class(cfg.method.name)(cfg, device)


def build_model(cfg, classes: int, input_shape: tuple) -> torch.nn.Module:
    """The model for a config, `classes` classes of one input's `input_shape`; the halting head's
    bias the config's halting_bias, else the method's implied one (ACT: +1), else PyTorch's."""
    model = PonderNet(cfg, classes=classes, input_shape=input_shape)
    bias = cfg.method.halting_bias
    if bias is None:
        bias = implied_values({"method": cfg.method.name}).get("halting_bias", (None,))[0]
    if bias is not None:
        with torch.no_grad():
            model.halting_head.bias.fill_(bias)
    return model


class PonderNetMethod(pieces.PonderNet, Method):
    graph_safe = True

    def __init__(self, cfg, device=None):
        super().__init__(cfg, device)
        # built once, on the device: a captured training batch copies nothing from the host
        m = cfg.method
        self._log_prior = log_prior(m.prior, m.lambda_p, m.max_steps, self.device)

    def kl_weight(self, progress: torch.Tensor | None):
        """beta, or during the warm-up beta * progress / beta_warmup (a tensor: no host read)."""
        beta, warmup = self.cfg.method.beta, self.cfg.method.beta_warmup
        if progress is None or warmup == 0:
            return beta
        return beta * (progress.float() / warmup).clamp(max=1.0)

    def loss(self, logits, lambda_logits, targets, computed=None, progress=None):
        m = self.cfg.method
        if m.halting_target != "prior":
            # The steps and the class head learn the expected loss under the halting distribution,
            # as PonderNet's; the halting head learns from the cross-entropy alone (p detached:
            # halting does not learn to stop where the loss is low, nor the steps to be cheap).
            p = halting_log_probs(lambda_logits.detach()).exp()
            reconstruction = reconstruction_loss(logits, targets, p)
            bce = halting_bce(logits, lambda_logits, targets, m.halting_target, computed)
            return LossParts(reconstruction + bce, reconstruction, bce)
        weights = None
        if computed is not None and m.truncation_rule == "roulette" and m.truncation > 0:
            weights = roulette_weights(lambda_logits, computed, m.truncation)
        if self._log_prior.device != logits.device:  # a method built for another device
            self._log_prior = self._log_prior.to(logits.device)
        return ponder_loss(logits, lambda_logits, targets, self._log_prior, self.kl_weight(progress), weights)

    def truncation(self, batch, device):
        m = self.cfg.method
        if m.max_steps == 1:
            return None
        depths = torch.randint(m.depth_min, m.max_steps + 1, (batch,), device=device) if m.depth_min else None
        if m.truncation > 0 and m.truncation_rule == "roulette":  # (config_problems: never with a random depth)
            return Roulette(m.truncation, torch.rand(m.max_steps, batch, device=device))
        epsilon = m.truncation if m.truncation > 0 else None
        return None if epsilon is None and depths is None else Cut(epsilon, depths)


class PlainMethod(pieces.Plain, PonderNetMethod):
    own_halting = "one step"  # every rule halts there

    def own_rule(self):
        return FixedBudget(1)


class ACTMethod(pieces.ACT, Method):
    graph_safe = True
    own_halting = "act"
    own_halting_means = "halting units summing to 1 - epsilon"

    def own_rule(self):
        return Act(self.cfg.method.act_epsilon)

    def loss(self, logits, lambda_logits, targets, computed=None, progress=None):
        return act_loss(logits, lambda_logits, targets, self.cfg.method.tau, self.cfg.method.act_epsilon)

    def batch_metrics(self, out, targets):
        # ACT predicts deterministically: its mean-field prediction and N
        halting = act_halting(halting_as_computed(out), self.cfg.method.act_epsilon, out.logits)
        return (halting.prediction.argmax(dim=1) == targets).float().sum(), halting.steps.float().sum()

    def halting_distribution(self, lambda_logits):
        return act_halting(lambda_logits, self.cfg.method.act_epsilon).p

    def truncation(self, batch, device):
        return Act(self.cfg.method.act_epsilon) if self.cfg.method.truncation > 0 else None
