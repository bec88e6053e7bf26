"""Halting methods: what differs between PonderNet, ACT and a one-step network sharing one model.

A method owns its training loss, how it predicts from a forward pass over every step, the rule
the early-exit loop applies at inference, the truncation rule training may use, the metrics of a
training batch, its halting-bias initialisation and any constraint it puts on the config.
Register a new one in `registry.METHODS` (or an entry point in the group `ponder_cli.methods`).

- PonderNet (Banino et al. 2021): expected loss under the halting distribution plus a KL term
  towards a geometric prior; halting by Bernoulli coins (or the median, expected, quantile:Q,
  patience:K or confidence:C rules: registry.py).
- ACT (Graves 2016) on the same network: halting units h_n = sigmoid(halting head); the network
  stops at the first step N where h_1 + ... + h_N >= 1 - epsilon (or at max_steps); the remainder
  R = 1 - sum_{n<N} h_n takes the last step's weight, so p = (h_1, ..., h_{N-1}, R) sums to 1.
  The prediction is the p-weighted mean of the step outputs and the ponder cost N + R is added
  to the loss, weighted by tau. Deterministic at inference: the ponder steps are N; of the
  --halting rules it takes only the fixed budget fixed:N, which reads step N's output y_N as for
  every method (a budget does not depend on how a method halts).
- plain: the "couldn't a plain network do as well?" baseline, PonderNet's network run for one step
  (every rule halts there).

PonderNet's loss is per-sample expected cross-entropy plus beta * KL(p || geometric prior). Two
flaws of the reference notebook are fixed here:
1. The reconstruction term weights each image's own cross-entropy by that image's own p_n.
   (The reference multiplied p_n by a batch-averaged loss, so halting could not depend on the
   image.)
2. The KL term is finite for every input without dropping samples: it is computed from log p in
   float32, so a p_n that underflows to 0 contributes 0 * finite = 0. (The reference removed
   every sample with a zero p_n from the batch.)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .config import applies, implied_values
from .halting import (Act, Cut, FixedBudget, Roulette, Rule, act_reached, halting_steps, halting_units,
                      log_continue, reach_log_prob, rule_of, running_sums)
from .model import PonderNet, halting_as_computed
from .registry import method_class, parse_halting_rule


# PonderNet's halting distribution and loss -----------------------------------------------------

def log_survivals(lambda_logits: torch.Tensor) -> torch.Tensor:
    """log prod_{k<=n} (1 - lambda_k) at every step n: the log of the halting mass not yet
    spent after step n. (steps, B) -> (steps, B), float32."""
    return running_sums(log_continue(lambda_logits))


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


def expected_prediction(logits: torch.Tensor, lambda_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The p-weighted average of every step's class probabilities (B, classes) and the expected
    number of steps sum_n n p_n (B,): the 'expected' halting rule, which runs every step."""
    p = halting_log_probs(lambda_logits).exp()  # (steps, B)
    probs = torch.softmax(logits.float(), dim=-1)  # (steps, B, classes)
    n = torch.arange(1, p.shape[0] + 1, device=p.device, dtype=p.dtype)[:, None]
    return (p[..., None] * probs).sum(dim=0), (n * p).sum(dim=0)


def roulette_weights(lambda_logits: torch.Tensor, computed: torch.Tensor, epsilon: float) -> torch.Tensor:
    """1 / r_n for the steps each image computed under halting.Roulette (r_n its probability of
    computing step n), 0 after them: (steps, B), float32, detached. lambda_logits (steps, B) as
    the truncated forward gave them, computed (B,) the steps it computed."""
    log_survival = log_survivals(lambda_logits.detach())  # log S_n after step n
    log_reach = reach_log_prob(torch.cat([torch.zeros_like(log_survival[:1]), log_survival[:-1]]), math.log(epsilon))
    n = torch.arange(1, lambda_logits.shape[0] + 1, device=lambda_logits.device)[:, None]  # (steps, 1)
    return torch.where(n <= computed, torch.exp(-log_reach), torch.zeros_like(log_reach))


# The prior's log is clamped here so that lambda_p = 1 (all mass on step 1) stays finite.
_MIN_LOG_PRIOR = math.log(torch.finfo(torch.float32).tiny)


class LossParts(NamedTuple):
    total: torch.Tensor
    reconstruction: torch.Tensor
    regularisation: torch.Tensor


def geometric_log_prior(lambda_p: float, max_steps: int, device=None) -> torch.Tensor:
    """log p_G(n) for n = 1..max_steps, p_G(n) proportional to lambda_p (1 - lambda_p)^(n-1).

    Choice: the geometric distribution truncated at max_steps is renormalised to sum to 1, so
    that KL(p || p_G) compares two distributions over the same support (p also sums to 1, its
    last step taking all remaining mass). The paper leaves the truncation implicit.
    """
    k = torch.arange(max_steps, dtype=torch.float64)
    # xlog1py gives 0 for k = 0 even when lambda_p = 1 (0 * log 0).
    log_unnormalised = math.log(lambda_p) + torch.special.xlog1py(k, -lambda_p)
    log_prior = log_unnormalised - torch.logsumexp(log_unnormalised, dim=0)
    return log_prior.clamp_min(_MIN_LOG_PRIOR).to(device=device, dtype=torch.float32)  # (steps,)


def log_prior(shape: str, lambda_p: float, max_steps: int, device=None) -> torch.Tensor:
    """log p_G(n) for n = 1..max_steps of the prior named `shape` (registry.PRIORS): the
    geometric one above, or uniform, 1 / max_steps at every step."""
    if shape == "uniform":
        return torch.full((max_steps,), -math.log(max_steps), dtype=torch.float32, device=device)
    return geometric_log_prior(lambda_p, max_steps, device)


def reconstruction_loss(logits: torch.Tensor, targets: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """mean over images of sum_n p_n(image) * CE(y_n(image), target(image))."""
    steps, batch, classes = logits.shape
    ce = F.cross_entropy(
        logits.float().reshape(steps * batch, classes),
        targets.expand(steps, batch).reshape(-1),
        reduction="none",
    ).view(steps, batch)  # (steps, B): each image's own loss at each step
    return (p * ce).sum(dim=0).mean()


def kl_to_prior(p: torch.Tensor, log_p: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
    """mean over images of KL(p || p_G) = sum_n p_n (log p_n - log p_G(n)); the paper's direction.

    p (steps, B) is log_p.exp(), passed in because the caller already has it.
    """
    return (p * (log_p - log_prior[:, None])).sum(dim=0).mean()


def ponder_loss(logits: torch.Tensor, lambda_logits: torch.Tensor, targets: torch.Tensor,
                log_prior: torch.Tensor, beta: float | torch.Tensor, weights: torch.Tensor | None = None) -> LossParts:
    """Always in float32, also when the forward pass ran under autocast. `weights` (steps, B)
    scale each step's terms of both sums (roulette_weights: an unbiased estimate of
    them from the steps a truncated forward computed). `beta` may be a 0-dim tensor on the
    device (a warm-up's, `kl_weight`)."""
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
    at step n is the label. Steps after `computed` (B,) are not looked at (their t_n is not
    trained: halting_bce). Read from the answers alone, with no gradient; fixed shapes, no host
    read."""
    answers = logits.detach().argmax(dim=-1)  # (steps, B)
    if kind == "correct":
        return (answers == targets).float()
    n = torch.arange(1, answers.shape[0] + 1, device=answers.device)[:, None]  # (steps, 1)
    last = answers.shape[0] if computed is None else computed  # (B,) or an int
    at_last = answers[-1:] if computed is None else answers.gather(0, (computed - 1)[None])  # (1, B)
    differs = ((answers != at_last) & (n <= last)).to(torch.uint8)  # (steps, B): unlike the last computed answer
    # final at n: no step from n on differs from the last answer (a reverse running maximum)
    return 1.0 - differs.flip(0).cummax(dim=0).values.flip(0).float()


def halting_bce(logits: torch.Tensor, lambda_logits: torch.Tensor, targets: torch.Tensor, kind: str,
                computed: torch.Tensor | None = None) -> torch.Tensor:
    """The mean binary cross-entropy of lambda_n against halting_targets over every step before
    the last computed one (at that step halting is forced, whatever lambda says)."""
    t = halting_targets(logits, targets, kind, computed)
    n = torch.arange(1, t.shape[0] + 1, device=t.device)[:, None]
    trained = (n < (t.shape[0] if computed is None else computed)).float().expand(t.shape)  # (steps, B)
    bce = F.binary_cross_entropy_with_logits(lambda_logits.float(), t, reduction="none")
    return (bce * trained).sum() / trained.sum().clamp_min(1.0)


# The methods ------------------------------------------------------------------------------------

class Method:
    name: str = ""
    # whether its loss, truncation and metrics keep a training batch capturable as a CUDA graph
    # (fixed shapes, no host read, randomness from torch's default generator): a method that does
    # not declare it trains eagerly on CUDA (train.use_graphs); tests/test_graph_safe.py proves it
    graph_safe: bool = False

    def __init__(self, cfg, device=None):
        self.cfg = cfg
        self.device = torch.device("cpu" if device is None else device)  # where its losses will run

    @classmethod
    def config_problems(cls, cfg) -> list[str]:
        """What this method cannot train with beside the other settings, as messages for the user
        (each value's own range is its field's, config.py)."""
        return []

    def halting_label(self, rule: str) -> str:
        """The halting rule that really applies when the user asks for `rule`."""
        return rule

    def halting_problem(self, rule: str) -> str | None:
        """Why this method cannot halt by `rule`, as a message for the user (None: it can): a
        fixed budget beyond the steps the model runs (its max_steps, as trained or as --max-steps
        sets it at evaluation)."""
        budget = FixedBudget.of(rule)
        problem = budget and budget.problem(self.cfg.method.max_steps, f"this {self.name} model runs")
        if not problem:
            return None
        return f"--halting {problem}" + (" (--max-steps runs more)" if self.cfg.method.name != "plain" else "")

    def needs_all_steps(self, rule: str) -> bool:
        """Whether predicting under `rule` needs every step of every image (no early exit)."""
        return False

    def loss(self, logits: torch.Tensor, lambda_logits: torch.Tensor, targets: torch.Tensor,
             computed: torch.Tensor | None = None, progress: torch.Tensor | None = None) -> LossParts:
        """The training loss of a forward pass; `computed` (B,), the steps a truncated forward
        computed per input (PonderOutput.computed), None when it computed every step;
        `progress`, the optimizer steps taken so far (a 0-dim tensor on the device, which a
        captured batch reads at every replay), for a loss that changes over training (a
        warm-up); None: a trained model's loss (evaluation)."""
        raise NotImplementedError

    def exit_rule(self, rule: str, uniforms: torch.Tensor) -> Rule:
        """The halting.Rule this method halts by when asked for `rule`, fresh for one batch, both
        for the early-exit loop (PonderNet.infer) and over a forward of every step (`predict`);
        uniforms (steps, B) are the halting coin flips."""
        raise NotImplementedError

    def predict(self, logits: torch.Tensor, lambda_logits: torch.Tensor, uniforms: torch.Tensor,
                rule: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Class scores (B, classes) and ponder steps (B,) from a forward pass over every step;
        uniforms (steps, B) are the halting coin flips."""
        steps, scores = halting_steps(self.exit_rule(rule, uniforms), logits, lambda_logits)
        return scores, steps

    def halting_distribution(self, lambda_logits: torch.Tensor) -> torch.Tensor:
        """p_n (steps, B): the weight this method gives each step's output (PonderNet: the
        halting distribution; ACT: h_1, ..., h_{N-1}, R, 0, ...)."""
        return halting_log_probs(lambda_logits).exp()

    def batch_metrics(self, out, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A training batch's correct predictions and halting steps, each summed over the batch
        (float32 scalars on the device) from its forward `out` (model.PonderOutput, truncated or
        not): their expectations under the halting distribution, so no coin is drawn (PonderNet:
        sum_n p_n [y_n right] and sum_n n p_n)."""
        p = self.halting_distribution(halting_as_computed(out))  # (steps, B)
        right = (out.logits.argmax(dim=-1) == targets).to(p.dtype)  # (steps, B)
        n = torch.arange(1, p.shape[0] + 1, device=p.device, dtype=p.dtype)[:, None]
        return (p * right).sum(), (p * n).sum()

    def probabilities(self, scores: torch.Tensor, rule: str) -> torch.Tensor:
        """Class probabilities (B, classes) from `predict`'s scores under `rule`."""
        return torch.softmax(scores.float(), dim=-1)

    def truncation(self, batch: int, device) -> Rule | None:
        """The rule that lets training drop an image from later steps (None: every step); any
        randomness it needs comes from the training stream (torch's default generator), as dropout's."""
        return None


def get_method(cfg, device=None) -> Method:
    """The config's method; `device`, where its losses will run (what it builds once goes there)."""
    return method_class(cfg.method.name)(cfg, device)


def build_model(cfg, classes: int, input_shape: tuple) -> torch.nn.Module:
    """The model for a config predicting `classes` classes of inputs of `input_shape` (the
    task's; one input's, without the batch), its halting head's
    initial bias the config's halting_bias, else the one the method implies (ACT: Graves' +1; a
    saved config may hold none), else PyTorch's default initialisation."""
    model = PonderNet(cfg, classes=classes, input_shape=input_shape)
    bias = cfg.method.halting_bias
    if bias is None:
        bias = implied_values({"method": cfg.method.name}).get("halting_bias", (None,))[0]
    if bias is not None:
        with torch.no_grad():
            model.halting_head.bias.fill_(bias)
    return model


class PonderNetMethod(Method):
    name = "pondernet"
    graph_safe = True

    def __init__(self, cfg, device=None):
        super().__init__(cfg, device)
        # built once, on the device: a captured training batch copies nothing from the host
        m = cfg.method
        self._log_prior = log_prior(m.prior, m.lambda_p, m.max_steps, self.device)

    @classmethod
    def config_problems(cls, cfg):
        problems, m = super().config_problems(cfg), cfg.method
        if not applies("depth_min", {"method": cls.name}):  # plain: one step, no depth to draw
            return problems
        if m.depth_min > m.max_steps:
            problems.append(f"depth-min {m.depth_min} is above max-steps {m.max_steps}: inputs train at a depth "
                            f"drawn from depth-min to max-steps")
        if m.halting_target != "prior" and (m.truncation > 0 or m.depth_min):
            problems.append(f"halting-target {m.halting_target} trains on every step's answer: give truncation 0 "
                            f"and depth-min 0 (got {m.truncation:g} and {m.depth_min}; --step align implies "
                            f"truncation 0.1)")
        if m.depth_min and m.truncation > 0 and m.truncation_rule == "roulette":
            problems.append("depth-min trains with truncation-rule cut, not roulette (roulette's loss weights "
                            "assume its own coins alone decide where an input stops)")
        return problems

    def kl_weight(self, progress: torch.Tensor | None):
        """beta, or during the warm-up beta * progress / beta_warmup (a tensor: no host read)."""
        beta, warmup = self.cfg.method.beta, self.cfg.method.beta_warmup
        if progress is None or warmup == 0:
            return beta
        return beta * (progress.float() / warmup).clamp(max=1.0)

    def log_prior(self, device) -> torch.Tensor:
        if self._log_prior.device != torch.device(device):  # a method built for another device
            self._log_prior = self._log_prior.to(device)
        return self._log_prior

    def needs_all_steps(self, rule):
        return parse_halting_rule(rule).name == "expected"

    def loss(self, logits, lambda_logits, targets, computed=None, progress=None):
        kind = self.cfg.method.halting_target
        if kind != "prior":
            # The steps and the class head learn the expected loss under the halting distribution,
            # as PonderNet's; the halting head learns from the cross-entropy alone (p detached:
            # halting does not learn to stop where the loss is low, nor the steps to be cheap).
            p = halting_log_probs(lambda_logits.detach()).exp()
            reconstruction = reconstruction_loss(logits, targets, p)
            bce = halting_bce(logits, lambda_logits, targets, kind, computed)
            return LossParts(reconstruction + bce, reconstruction, bce)
        weights = None
        if computed is not None and self.cfg.method.truncation_rule == "roulette" and self.cfg.method.truncation > 0:
            weights = roulette_weights(lambda_logits, computed, self.cfg.method.truncation)
        return ponder_loss(logits, lambda_logits, targets, self.log_prior(logits.device), self.kl_weight(progress),
                           weights)

    def exit_rule(self, rule, uniforms):
        return rule_of(rule, uniforms)

    def predict(self, logits, lambda_logits, uniforms, rule):
        if self.needs_all_steps(rule):
            return expected_prediction(logits, lambda_logits)
        return super().predict(logits, lambda_logits, uniforms, rule)

    def probabilities(self, scores, rule):
        # the expected rule's scores are already the p-weighted class probabilities
        return scores.float() if self.needs_all_steps(rule) else super().probabilities(scores, rule)

    def truncation(self, batch, device):
        m = self.cfg.method
        if m.max_steps == 1:
            return None
        depths = torch.randint(m.depth_min, m.max_steps + 1, (batch,), device=device) if m.depth_min else None
        if m.truncation > 0 and m.truncation_rule == "roulette":  # (config_problems: never with a random depth)
            return Roulette(m.truncation, torch.rand(m.max_steps, batch, device=device))
        epsilon = m.truncation if m.truncation > 0 else None
        return None if epsilon is None and depths is None else Cut(epsilon, depths)


class PlainMethod(PonderNetMethod):
    name = "plain"

    @classmethod
    def config_problems(cls, cfg):
        problems = super().config_problems(cfg)
        if cfg.method.max_steps != 1:
            # only a saved config gets here: --max-steps given with plain is refused as not read
            problems.append(f"method plain runs exactly one step (got max-steps {cfg.method.max_steps})")
        return problems

    def halting_label(self, rule):
        return "one step"

    def needs_all_steps(self, rule):
        return False  # one step: every rule is the same prediction

    def exit_rule(self, rule, uniforms):
        # one step: every rule halts there, a budget too (compare asks every method for one; eval
        # refuses a budget beyond it: halting_problem)
        return FixedBudget(1)


# ACT (Graves 2016) ------------------------------------------------------------------------------


class ActHalting(NamedTuple):
    p: torch.Tensor  # (steps, B) weights of the step outputs, zero after N
    steps: torch.Tensor  # (B,) N, 1-based
    remainder: torch.Tensor  # (B,) R


def act_halting(lambda_logits: torch.Tensor, epsilon: float) -> ActHalting:
    """ACT's weights of the step outputs, p = (h_1, ..., h_{N-1}, R, 0, ...), with N where
    halting.Act halts and R = 1 - sum_{n<N} h_n, differentiable in the halting units h_n. N is
    read off the running sum the loss differentiates, by halting.Act's own test (act_reached),
    at no cost beyond it (tests/test_exit_rules.py: the same N as Act's, near the bound)."""
    h = halting_units(lambda_logits)  # (steps, B)
    cumulative = running_sums(h)  # sum_{k<=n} h_k, as Act adds them
    reached = act_reached(cumulative.detach(), epsilon)
    reached[-1].fill_(True)  # max_steps caps N
    steps = reached.to(torch.uint8).argmax(dim=0) + 1  # the first step reached; (B,)
    n = torch.arange(1, h.shape[0] + 1, device=h.device)[:, None]  # (steps, 1)
    # sum_{n<N} h_n read off the running sum (0 when N = 1)
    before = torch.where(steps > 1, cumulative.gather(0, (steps - 2).clamp_min(0)[None]).squeeze(0),
                         torch.zeros_like(steps, dtype=h.dtype))
    remainder = 1 - before
    p = torch.where(n < steps, h, torch.zeros_like(h)) + torch.where(n == steps, remainder, torch.zeros_like(h))
    return ActHalting(p, steps, remainder)


def act_mean_field(p: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """The p-weighted sum of the step logits, (steps, B), (steps, B, classes) -> (B, classes),
    summed step by step as halting.Act sums it (the weights after N are 0 and add nothing)."""
    return running_sums(p[..., None] * logits.float())[-1]


def act_loss(logits: torch.Tensor, lambda_logits: torch.Tensor, targets: torch.Tensor, tau: float,
             epsilon: float) -> LossParts:
    """CE of the mean-field prediction plus tau * (N + R); gradients reach the halting units
    through R (N is discrete). Reported as (total, task loss, ponder cost)."""
    halting = act_halting(lambda_logits, epsilon)
    mean_field = act_mean_field(halting.p, logits)  # (B, classes)
    task = F.cross_entropy(mean_field, targets)
    ponder = (halting.steps.float() + halting.remainder).mean()
    return LossParts(task + tau * ponder, task, ponder)


class ACTMethod(Method):
    name = "act"
    graph_safe = True

    def halting_label(self, rule):
        budget = FixedBudget.of(rule)
        return budget.rule.spelling if budget else "act"

    def halting_problem(self, rule):
        # every --halting rule but a fixed budget is PonderNet's: ACT halts by its own alone, so a
        # rule asked for is refused rather than silently replaced (compare, where one --halting
        # serves every method, shows each method's own instead)
        if FixedBudget.of(rule):
            return super().halting_problem(rule)
        return (f"--halting {rule} applies to pondernet checkpoints; this one is act, which halts by its own "
                f"rule (halting units summing to 1 - epsilon) or at a fixed budget (fixed:N)")

    def loss(self, logits, lambda_logits, targets, computed=None, progress=None):
        return act_loss(logits, lambda_logits, targets, self.cfg.method.tau, self.cfg.method.act_epsilon)

    def exit_rule(self, rule, uniforms):
        # its own rule, or a budget (halting_problem refuses any other)
        return FixedBudget.of(rule) or Act(self.cfg.method.act_epsilon)

    def batch_metrics(self, out, targets):
        # ACT predicts deterministically: its mean-field prediction and N (as Act's, from the
        # weights the loss reads: cheaper than the rule's step-by-step sum in every batch)
        halting = act_halting(halting_as_computed(out), self.cfg.method.act_epsilon)
        scores = act_mean_field(halting.p, out.logits)
        return (scores.argmax(dim=1) == targets).float().sum(), halting.steps.float().sum()

    def halting_distribution(self, lambda_logits):
        return act_halting(lambda_logits, self.cfg.method.act_epsilon).p

    def truncation(self, batch, device):
        return Act(self.cfg.method.act_epsilon) if self.cfg.method.truncation > 0 else None
