"""Step functions: the piece of PonderNet that is applied again and again.

A step function says what is computed once per input (`start`) and what each step computes
from that and the previous state (`forward`). It reads one kind of input (`input_kind`), and a
task gives one kind: images (B, 1, 28, 28) for mlp and align, vectors (B, width) for rnn and
gru, whatever task gives them; a step is built with the task's input shape (one input's,
without the batch), from which a vector step takes its width. The one ponder loop in
`model.PonderNet` drives it, for training (every step of every input) and for early-exit
inference (only the inputs still running). Register a new one in `registry.STEPS`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn as nn


class StepTrace(NamedTuple):
    """What one step did, for looking inside a model (`ponder predict --steps`, `--plot`): the
    view the step read (B, ...), and named per-input scalars (B,) of the step function's own
    (align: "turn_deg", the rotation accumulated so far). The model never reads them."""
    view: torch.Tensor
    values: dict


class StepFunction(nn.Module):
    """Interface of a step function, built as Step(cfg, input_shape): the config's sizes and
    the task's input shape (one input's, without the batch: (1, 28, 28), (width,)).

    readout_size: width of the readout that the class head and the halting head read.
    halting_extra_size: width of the step's own halting features (`forward`'s third output),
    which the halting head reads when `--halting-input` names `halting_feature` (align: "turn").
    """

    readout_size: int
    halting_extra_size: int = 0
    halting_feature: Optional[str] = None  # how --halting-input names the step's halting features
    # the kind of input this step function reads ("images", "vectors"): it fits every task whose
    # `input_kind` is the same
    input_kind: str = ""
    # whether its start and forward keep a training batch capturable as a CUDA graph (fixed
    # shapes, no host read, randomness from torch's default generator): a step that does not
    # declare it trains eagerly on CUDA (train.use_graphs); tests/test_graph_safe.py proves it
    graph_safe: bool = False

    @classmethod
    def config_problems(cls, cfg) -> list[str]:
        """The step's own settings out of their range, as messages for the user."""
        return []

    def start(self, x: torch.Tensor, steps: int) -> tuple[tuple, tuple]:
        """From a batch of inputs (B, ...): the per-input context computed once, and the initial
        state. `steps` is how many steps may follow (for drawing per-step dropout masks)."""
        raise NotImplementedError

    def forward(self, context: tuple, state: tuple, n: int
                ) -> tuple[tuple, torch.Tensor, Optional[torch.Tensor]]:
        """Step n (0-based): the new state, the readout (B, readout_size) and the halting
        extras (B, halting_extra_size) or None."""
        raise NotImplementedError

    def all_steps(self, context: tuple, state: tuple, steps: int
                  ) -> Optional[tuple[torch.Tensor, Optional[torch.Tensor]]]:
        """Steps 0 .. steps - 1 at once, from `start`'s context and state, for a forward over every
        step of every input: the readouts (steps, B, readout_size) and the halting extras stacked
        (or None), exactly what `forward` step by step gives. None: run `forward` step by step (the
        default; a step with a faster way of its own says so here)."""
        return None

    def gate_halting(self, lambda_logits: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        """The halting logits (...) after the step's own say on halting, from its halting features
        (..., halting_extra_size); by default it has none."""
        return lambda_logits

    def trace(self, x: torch.Tensor, context: tuple, before: tuple, after: tuple, n: int) -> StepTrace:
        """Diagnostics of step n (0-based) from the inputs x, the context and the states before and
        after it. By default the step read the input as it is and has no values of its own."""
        return StepTrace(x, {})
