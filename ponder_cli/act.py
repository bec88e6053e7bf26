"""Adaptive Computation Time (Graves 2016) on PonderNet's step function.

Halting units h_n = sigmoid(halting head); the network stops at the first step N where
h_1 + ... + h_N >= 1 - epsilon (or at max_steps); the remainder R = 1 - sum_{n<N} h_n takes the
last step's weight, so p = (h_1, ..., h_{N-1}, R) sums to 1. The prediction is the p-weighted
mean of the step outputs and the ponder cost N + R is added to the loss, weighted by tau.
Deterministic at inference: the ponder steps are N.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .losses import LossParts
from .model import N_CLASSES, PonderNet, PonderOutput


class ActHalting(NamedTuple):
    p: torch.Tensor  # (steps, B) weights of the step outputs, zero after N
    steps: torch.Tensor  # (B,) N, 1-based
    remainder: torch.Tensor  # (B,) R


def act_halting(lambda_logits: torch.Tensor, epsilon: float) -> ActHalting:
    """N, R and p from every step's halting logits (steps, B)."""
    h = torch.sigmoid(lambda_logits.float())  # (steps, B)
    cumulative = torch.cumsum(h, dim=0)  # sum_{k<=n} h_k
    reached = cumulative >= 1 - epsilon
    reached[-1] = True  # max_steps caps N
    steps = reached.to(torch.uint8).argmax(dim=0) + 1  # (B,)
    n = torch.arange(1, h.shape[0] + 1, device=h.device)[:, None]  # (steps, 1)
    # sum_{n<N} h_n read off the same running sum that chose N (0 when N = 1)
    before = torch.where(steps > 1, cumulative.gather(0, (steps - 2).clamp_min(0)[None]).squeeze(0),
                         torch.zeros_like(steps, dtype=h.dtype))
    remainder = 1 - before
    p = torch.where(n < steps, h, torch.zeros_like(h)) + torch.where(n == steps, remainder, torch.zeros_like(h))
    return ActHalting(p, steps, remainder)


def act_prediction(out: PonderOutput, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The p-weighted mean of the step logits (B, classes) and N (B,)."""
    halting = act_halting(out.lambda_logits, epsilon)
    return (halting.p[..., None] * out.logits.float()).sum(dim=0), halting.steps


def act_loss(out: PonderOutput, targets: torch.Tensor, tau: float, epsilon: float) -> LossParts:
    """CE of the mean-field prediction plus tau * (N + R); gradients reach the halting units
    through R (N is discrete). Reported as (total, task loss, ponder cost)."""
    halting = act_halting(out.lambda_logits, epsilon)
    logits = (halting.p[..., None] * out.logits.float()).sum(dim=0)  # (B, classes)
    task = F.cross_entropy(logits, targets)
    ponder = (halting.steps.float() + halting.remainder).mean()
    return LossParts(task + tau * ponder, task, ponder)


@torch.no_grad()
def act_infer(model: PonderNet, x: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """ACT with real early exit; the same N and predictions as `act_prediction` on every step."""
    batch = x.shape[0]
    embedding_part = model.step_mlp.embedding_part(model.encoder(x))  # (B, L)
    logits = embedding_part.new_empty(batch, N_CLASSES, dtype=torch.float32)
    steps = torch.full((batch,), model.max_steps, dtype=torch.long, device=x.device)
    active = torch.arange(batch, device=x.device)
    cumulative = torch.zeros(batch, device=x.device)  # sum of halting units so far, per active row
    weighted = torch.zeros(batch, N_CLASSES, device=x.device)  # running sum of p_n * y_n
    h = None
    for n in range(model.max_steps):
        h = model.step_mlp(embedding_part, h)
        y, lambda_logits = model.heads(h)
        y = y.float()
        unit = torch.sigmoid(lambda_logits.float())
        reached = cumulative + unit >= 1 - epsilon
        if n == model.max_steps - 1:
            reached = torch.ones_like(reached)
        weight = torch.where(reached, 1 - cumulative, unit)  # R on the halting step
        weighted = weighted + weight[:, None] * y
        halted = active[reached]
        logits[halted] = weighted[reached]
        steps[halted] = n + 1
        running = ~reached
        if not bool(running.any()):
            break
        cumulative = (cumulative + unit)[running]
        active, embedding_part, h, weighted = active[running], embedding_part[running], h[running], weighted[running]
    return logits, steps
