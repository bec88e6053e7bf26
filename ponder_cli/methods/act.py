"""Adaptive Computation Time (Graves 2016) on the same network.

Halting units h_n = sigmoid(halting head); the network stops at the first step N where
h_1 + ... + h_N >= 1 - epsilon (or at max_steps); the remainder R = 1 - sum_{n<N} h_n takes the
last step's weight, so p = (h_1, ..., h_{N-1}, R) sums to 1. The prediction is the p-weighted
mean of the step outputs and the ponder cost N + R is added to the loss, weighted by tau.
Deterministic at inference: the ponder steps are N, whatever halting rule is asked for.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..halting import ActExit, act_halting, act_mean_field, act_prediction
from ..truncation import ActHalted
from ..losses import LossParts
from ..model import halting_as_computed
from . import Method

# Graves: a positive halting bias makes early training ponder little
INITIAL_HALTING_BIAS = 1.0


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
    # Graves' bias, also where a step implies another (align: 'prior'): the method's implied
    # values win over the step's (config.implied_values)
    implied = {"halting_bias": INITIAL_HALTING_BIAS}
    reads = ("max_steps", "halting_input", "halting_bias", "turn_gate", "tau", "act_epsilon", "truncation")

    def halting_label(self, rule):
        return "act"

    def halting_problem(self, rule):
        # every --halting rule is PonderNet's: ACT halts by its own alone, so a rule asked for is
        # refused rather than silently replaced (compare, where one --halting serves every
        # method, shows each method's own instead)
        return (f"--halting {rule} applies to pondernet checkpoints; this one is act, which halts by its own "
                f"rule (halting units summing to 1 - epsilon)")

    def loss(self, logits, lambda_logits, targets, computed=None):
        return act_loss(logits, lambda_logits, targets, self.cfg.method.tau, self.cfg.method.act_epsilon)

    def predict(self, logits, lambda_logits, uniforms, rule):
        return act_prediction(logits, lambda_logits, self.cfg.method.act_epsilon)

    def batch_metrics(self, out, targets):
        # ACT predicts deterministically: its mean-field prediction and N
        scores, steps = act_prediction(out.logits, halting_as_computed(out), self.cfg.method.act_epsilon)
        return (scores.argmax(dim=1) == targets).float().sum(), steps.float().sum()

    def halting_distribution(self, lambda_logits):
        return act_halting(lambda_logits, self.cfg.method.act_epsilon).p

    def early_exit(self, rule, uniforms):
        return ActExit(uniforms.shape[1], self.cfg.method.act_epsilon, uniforms.device)

    def truncation(self, batch, device):
        if self.cfg.method.truncation <= 0:
            return None
        return ActHalted(batch, self.cfg.method.act_epsilon, device)
