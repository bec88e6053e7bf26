"""The paper's parity step: a simple tanh RNN that reads the whole input vector at every step.

h_n = tanh(W_x x + W_h h_{n-1} + b), h_0 = 0, `--hidden` units (the paper: 128). Step 1
computes h_1 = tanh(W_x x + b), so the first readout (and lambda_1) already depends on the
input. W_x x + b does not change across steps: it is computed once per input in `start`.
The readout is h_n; the model's class head is the paper's output unit (see tasks/parity.py).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from . import StepFunction


class RNNStep(StepFunction):
    reads = ("hidden",)
    input_kind = "vectors"

    def __init__(self, cfg, input_shape):
        super().__init__()
        (width,) = input_shape
        self.from_input = nn.Linear(width, cfg.step.hidden)
        self.from_state = nn.Linear(cfg.step.hidden, cfg.step.hidden, bias=False)
        self.readout_size = cfg.step.hidden

    def start(self, x, steps):
        return (self.from_input(x),), (None,)  # (B, hidden) once per input; h_0 = 0

    def forward(self, context, state, n):
        (input_part,), (h,) = context, state
        h = torch.tanh(input_part if h is None else input_part + self.from_state(h))
        return (h,), h, None
