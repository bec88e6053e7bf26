"""What differs between the methods sharing one network: the loss and how halting picks the
prediction. pondernet and plain (pondernet with one step) share everything; act has its own."""

from __future__ import annotations

import torch

from .act import act_infer, act_loss, act_prediction
from .config import PonderConfig
from .losses import LossParts, ponder_loss
from .model import (PonderNet, PonderOutput, expected_prediction, logits_at, median_halting_steps,
                    sample_halting_steps)


def halting_name(cfg: PonderConfig, rule: str) -> str:
    """The halting rule that applies: ACT halts by its own deterministic rule; plain never ponders."""
    return {"act": "act", "plain": "one step"}.get(cfg.method, rule)


def training_loss(cfg: PonderConfig, out: PonderOutput, targets: torch.Tensor, log_prior: torch.Tensor) -> LossParts:
    if cfg.method == "act":
        return act_loss(out, targets, cfg.tau, cfg.act_epsilon)
    return ponder_loss(out, targets, log_prior, cfg.beta)


def predict_from_all_steps(cfg: PonderConfig, out: PonderOutput, uniforms: torch.Tensor,
                           rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Class scores (B, classes) and ponder steps (B,) from a forward pass over every step."""
    if cfg.method == "act":
        return act_prediction(out, cfg.act_epsilon)
    if rule == "expected":
        return expected_prediction(out)
    steps = sample_halting_steps(out.lambda_logits, uniforms) if rule == "sample" \
        else median_halting_steps(out.lambda_logits)
    return logits_at(out.logits, steps), steps


def predict_early_exit(cfg: PonderConfig, model: PonderNet, x: torch.Tensor, uniforms: torch.Tensor,
                       rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The same as predict_from_all_steps, computing only the steps images still need."""
    if cfg.method == "act":
        return act_infer(model, x, cfg.act_epsilon)
    return model.infer(x, uniforms, rule)


def uses_expected_rule(cfg: PonderConfig, rule: str) -> bool:
    """The expected rule applies (and needs every step); ACT ignores the rule it is given."""
    return cfg.method != "act" and rule == "expected"
