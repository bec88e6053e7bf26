"""Step functions: the piece of PonderNet that is applied again and again.

A step function says what is computed once per input (`start`) and what each step computes
from that and the previous state (`forward`). It reads one kind of input (`input_kind`: images
(B, 1, 28, 28) for mlp and align, vectors (B, width) for rnn and gru), whatever task gives it,
and is built with the task's input shape (one input's, without the batch). The one ponder loop
in `model.PonderNet` drives it, for training and for early-exit inference (only the inputs still
running). Register a new one in `registry.STEPS`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn as nn

from .. import pieces


class StepTrace(NamedTuple):
    """What one step did, for looking inside a model (`ponder predict --steps`, `--plot`): the
    view the step read (B, ...), and named per-input scalars (B,) of the step's own (align:
    "turn_deg", the rotation so far). The model never reads them."""
    view: torch.Tensor
    values: dict


class StepFunction(nn.Module, pieces.Step):
    """Built as Step(cfg, input_shape). readout_size: the width of the readout the class head
    and the halting head read (the config's hidden size unless a step says otherwise);
    halting_extra_size: that of the step's own halting features (`forward`'s third output), read
    by the halting head when `--halting-input` names `halting_feature` (align: "turn")."""

    readout_size: int
    halting_extra_size: int = 0
    # whether start and forward keep a training batch capturable as a CUDA graph (fixed shapes,
    # no host read, randomness from torch's default generator); tests/test_graph_safe.py proves it
    graph_safe: bool = False

    def __init__(self, cfg=None, input_shape: tuple = ()):
        super().__init__()
        if cfg is not None:
            self.readout_size = cfg.step.hidden

    def start(self, x: torch.Tensor, steps: int) -> tuple[tuple, tuple]:
        """The per-input context computed once from a batch (B, ...), and the initial state;
        `steps` may follow (for drawing per-step dropout masks)."""
        raise NotImplementedError

    def forward(self, context: tuple, state: tuple, n: int) -> tuple[tuple, torch.Tensor, Optional[torch.Tensor]]:
        """Step n (0-based): the new state, the readout (B, readout_size) and the halting extras
        (B, halting_extra_size) or None."""
        raise NotImplementedError

    def all_steps(self, context: tuple, state: tuple, steps: int):
        """Steps 0 .. steps - 1 at once, exactly as `forward` step by step: the readouts (steps, B,
        readout_size) and the extras stacked or None; None: no faster way of its own."""
        return None

    def gate_halting(self, lambda_logits: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        """The halting logits after the step's own say on halting, from its halting features."""
        return lambda_logits

    def trace(self, x: torch.Tensor, context: tuple, before: tuple, after: tuple, n: int) -> StepTrace:
        """Diagnostics of step n from the inputs and the states before and after it."""
        return StepTrace(x, {})
