"""Halting methods: what differs between PonderNet, ACT and a one-step network sharing one model.

A method owns its training loss, how it predicts from a forward pass over every step, the rule
the early-exit loop applies at inference, its halting-bias initialisation and any constraint it
puts on the config. Register a new one in `registry.METHODS`.
"""

from __future__ import annotations

import torch

from ..halting import EarlyExitRule, halting_log_probs
from ..losses import LossParts
from ..model import PonderNet, halting_as_computed
from ..registry import method_class


class Method:
    name: str = ""
    # config values this method implies when the user leaves them out (plain: one step)
    implied: dict = {}
    # the config fields this method reads among those that some method reads (config.inapplicable:
    # an option no chosen piece reads is refused)
    reads: tuple = ()

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
        """Why this method cannot halt by `rule`, as a message for the user (None: it can)."""
        return None

    def needs_all_steps(self, rule: str) -> bool:
        """Whether predicting under `rule` needs every step of every image (no early exit)."""
        return False

    def loss(self, logits: torch.Tensor, lambda_logits: torch.Tensor, targets: torch.Tensor,
             computed: torch.Tensor | None = None) -> LossParts:
        """The training loss of a forward pass; `computed` (B,), the steps a truncated forward
        computed per input (PonderOutput.computed), None when it computed every step."""
        raise NotImplementedError

    def predict(self, logits: torch.Tensor, lambda_logits: torch.Tensor, uniforms: torch.Tensor,
                rule: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Class scores (B, classes) and ponder steps (B,) from a forward pass over every step;
        uniforms (steps, B) are the halting coin flips."""
        raise NotImplementedError

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

    def early_exit(self, rule: str, uniforms: torch.Tensor) -> EarlyExitRule:
        """The rule `PonderNet.infer` applies so that it predicts exactly as `predict` does."""
        raise NotImplementedError

    def truncation(self, batch: int, device) -> EarlyExitRule | None:
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
    config built without from_options has none), else PyTorch's default initialisation."""
    model = PonderNet(cfg, classes=classes, input_shape=input_shape)
    bias = cfg.method.halting_bias
    if bias is None:
        bias = method_class(cfg.method.name).implied.get("halting_bias")
    if bias is not None:
        with torch.no_grad():
            model.halting_head.bias.fill_(bias)
    return model
