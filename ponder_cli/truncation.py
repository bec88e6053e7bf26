"""Truncation in training: rules that decide when a training forward needs no more steps for an
input, in two forms with one arithmetic: step by step (halting.EarlyExitRule's `decide`, which
PonderNet.forward with `stop` drives, dropping the inputs that are done) and over every step at
once (`computed_steps`, a mask over the fixed step count: fixed shapes, no host read, what a
captured CUDA graph runs; model.truncate applies it). Also the weights that keep the roulette
rule's loss unbiased."""

from __future__ import annotations

import math

import torch

from .halting import EarlyExitRule, accumulate, act_reached, halting_units, log_continue, log_survivals


class TruncationRule(EarlyExitRule):
    """A rule whose decision reads only the halting logits."""

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
        self.log_survival = accumulate(self.log_survival, log_continue(lambda_logits.detach()))
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
        self.log_survival = accumulate(self.log_survival, log_continue(lambda_logits.detach()))
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

    def __init__(self, batch: int, epsilon: float, device):
        self.epsilon = epsilon
        self.cumulative = torch.zeros(batch, device=device)  # (A,)

    def decide(self, n, last, logits, lambda_logits):
        self.cumulative = accumulate(self.cumulative, halting_units(lambda_logits.detach()))
        done = torch.ones_like(self.cumulative, dtype=torch.bool) if last else act_reached(self.cumulative, self.epsilon)
        return done, logits

    def keep(self, rows):
        self.cumulative = self.cumulative.index_select(0, rows)


class StopAfterFirstStep(TruncationRule):
    """Every image is done after its first step: the least that any forward pass computes."""

    def decide(self, n, last, logits, lambda_logits):
        return torch.ones_like(lambda_logits, dtype=torch.bool), logits
