"""PonderNet's loss: per-sample expected cross-entropy plus beta * KL(p || geometric prior).

Two flaws of the reference notebook are fixed here:
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

from .halting import halting_log_probs

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
                log_prior: torch.Tensor, beta: float, weights: torch.Tensor | None = None) -> LossParts:
    """Always in float32, also when the forward pass ran under autocast. `weights` (steps, B)
    scale each step's terms of both sums (truncation.roulette_weights: an unbiased estimate of
    them from the steps a truncated forward computed)."""
    log_p = halting_log_probs(lambda_logits)  # (steps, B), float32
    p = log_p.exp()
    if weights is not None:
        p = p * weights  # the terms' weights; log_p stays the halting distribution's
    reconstruction = reconstruction_loss(logits, targets, p)
    regularisation = kl_to_prior(p, log_p, log_prior)
    return LossParts(reconstruction + beta * regularisation, reconstruction, regularisation)
