"""Step functions for vector inputs (parity): both read the whole input vector at every step.

rnn: The paper's parity step: a simple tanh RNN that reads the whole input vector at every step.

h_n = tanh(W_x x + W_h h_{n-1} + b), h_0 = 0, `--hidden` units (the paper: 128). Step 1
computes h_1 = tanh(W_x x + b), so the first readout (and lambda_1) already depends on the
input. W_x x + b does not change across steps: it is computed once per input in `start`.
The readout is h_n; the model's class head is the paper's output unit (see tasks/parity.py).

gru: A GRU step for vector inputs, the public PonderNet parity implementations' choice.

h_n = GRU(x, h_{n-1}), h_0 = 0: the whole input is read at every step, so step 1 already sees
it (unlike implementations that read out h_0 before the first update). The input's share of
the gates (W_ih x + b_ih) does not change across steps and is computed once per input; each
step then costs one (hidden x 3 hidden) matmul. The parameters are an nn.GRUCell's, and the
update equals nn.GRUCell's.

Optional, after the min-pondernet recipe: LayerNorm on the new state, orthogonal recurrent
weights, and a positive update-gate bias (each step keeps more of the previous state). The
config's gru_* fields choose them; `ponder train --step gru` implies all three (the recipe
that learns parity here: docs/parity-results.md), the dataclass defaults are off.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from . import StepFunction


class RNNStep(StepFunction):
    reads = ("hidden",)
    input_kind = "vectors"
    graph_safe = True

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


class GRUStep(StepFunction):
    implied = {"gru_layer_norm": True, "gru_orthogonal": True, "gru_update_bias": 1.0}
    reads = ("hidden", "gru_layer_norm", "gru_orthogonal", "gru_update_bias")
    input_kind = "vectors"
    graph_safe = True

    def __init__(self, cfg, input_shape):
        super().__init__()
        layer_norm, orthogonal, update_bias = cfg.step.gru_layer_norm, cfg.step.gru_orthogonal, cfg.step.gru_update_bias
        (width,) = input_shape
        self.cell = nn.GRUCell(width, cfg.step.hidden)
        self.norm = nn.LayerNorm(cfg.step.hidden) if layer_norm else None
        hidden = cfg.step.hidden
        with torch.no_grad():
            if orthogonal:
                for block in self.cell.weight_hh.split(hidden):  # reset, update, new: one each
                    nn.init.orthogonal_(block)
            if update_bias:
                self.cell.bias_ih[hidden:2 * hidden].add_(update_bias)
        self.readout_size = hidden

    def start(self, x, steps):
        input_gates = nn.functional.linear(x, self.cell.weight_ih, self.cell.bias_ih)  # (B, 3 hidden)
        return (input_gates,), (None,)

    def forward(self, context, state, n):
        (input_gates,), (h,) = context, state
        input_reset, input_update, input_new = input_gates.chunk(3, dim=1)
        if h is None:  # h_0 = 0: the state's share of the gates is its bias alone
            state_gates = self.cell.bias_hh.expand_as(input_gates)
            h = torch.zeros_like(input_reset)
        else:
            state_gates = nn.functional.linear(h, self.cell.weight_hh, self.cell.bias_hh)
        state_reset, state_update, state_new = state_gates.chunk(3, dim=1)
        reset = torch.sigmoid(input_reset + state_reset)
        update = torch.sigmoid(input_update + state_update)
        new = torch.tanh(input_new + reset * state_new)
        h = new + update * (h - new)  # (1 - z) n + z h
        if self.norm is not None:
            h = self.norm(h)
        return (h,), h, None
