"""PonderNet (Banino et al. 2021): expected loss under the halting distribution plus a KL term
towards a geometric prior; halting by Bernoulli coins (or the median, expected, quantile:Q or
patience:K or confidence:C rules: halting_rules.py)."""

from __future__ import annotations

import torch

from ..halting import expected_prediction, logits_at, rule_exit, rule_halting_steps
from ..halting_rules import parse_halting_rule
from ..losses import geometric_log_prior, ponder_loss
from ..truncation import ContinueBelow, TruncateBelow, roulette_weights
from . import Method


class PonderNetMethod(Method):
    name = "pondernet"
    reads = ("max_steps", "halting_input", "halting_bias", "turn_gate", "lambda_p", "beta", "truncation",
             "truncation_rule")

    def __init__(self, cfg, device=None):
        super().__init__(cfg, device)
        # built once, on the device: a captured training batch copies nothing from the host
        self._log_prior = geometric_log_prior(cfg.method.lambda_p, cfg.method.max_steps, self.device)

    def log_prior(self, device) -> torch.Tensor:
        if self._log_prior.device != torch.device(device):  # a method built for another device
            self._log_prior = self._log_prior.to(device)
        return self._log_prior

    def needs_all_steps(self, rule):
        return parse_halting_rule(rule).name == "expected"

    def loss(self, logits, lambda_logits, targets, computed=None):
        weights = None
        if computed is not None and self.cfg.method.truncation_rule == "roulette":
            weights = roulette_weights(lambda_logits, computed, self.cfg.method.truncation)
        return ponder_loss(logits, lambda_logits, targets, self.log_prior(logits.device), self.cfg.method.beta, weights)

    def predict(self, logits, lambda_logits, uniforms, rule):
        rule = parse_halting_rule(rule)
        if rule.name == "expected":
            return expected_prediction(logits, lambda_logits)
        steps = rule_halting_steps(rule, logits, lambda_logits, uniforms)
        return logits_at(logits, steps), steps

    def probabilities(self, scores, rule):
        # the expected rule's scores are already the p-weighted class probabilities
        return scores.float() if parse_halting_rule(rule).name == "expected" else super().probabilities(scores, rule)

    def early_exit(self, rule, uniforms):
        return rule_exit(parse_halting_rule(rule), uniforms)

    def truncation(self, batch, device):
        if self.cfg.method.truncation <= 0 or self.cfg.method.max_steps == 1:
            return None
        if self.cfg.method.truncation_rule == "roulette":
            return ContinueBelow(self.cfg.method.truncation, torch.rand(self.cfg.method.max_steps, batch, device=device))
        return TruncateBelow(batch, self.cfg.method.truncation, device)
