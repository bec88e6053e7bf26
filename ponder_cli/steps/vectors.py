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

Both read each entry as its value (`--encoding raw`), one-hot over {-1, 0, +1} (`onehot`, three
inputs an entry, as AdaTape feeds parity) or as its value and its square (`square`: x and x^2
side by side, two inputs an entry). The last two show which entries are non-zero apart from
their signs, so the count of +1 entries, (sum x + sum x^2) / 2, is linear in the input. They
carry the same information, but one-hot also gives every zero entry an input of its own: a
vector with few non-zeros is mostly the zeros' indicators, where x^2 leaves zeros silent.

Optional, after the min-pondernet recipe: LayerNorm on the new state, orthogonal recurrent
weights, and a positive update-gate bias (each step keeps more of the previous state). The
config's gru_* fields choose them; `ponder train --step gru` implies all three (the recipe
that learns parity here: docs/parity-results.md), the dataclass defaults are off.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from . import StepFunction

ONEHOT_VALUES = (-1.0, 0.0, 1.0)


def input_width(cfg, input_shape) -> int:
    """The width the step's first layer reads: the vector's, three times it one-hot, twice squared."""
    (width,) = input_shape
    return width * {"raw": 1, "onehot": len(ONEHOT_VALUES), "square": 2}[cfg.step.encoding]


def encoded(x: torch.Tensor, encoding: str) -> torch.Tensor:
    """The entries (B, width) as the step reads them: as they are (raw); (B, 3 width) one-hot,
    entry i's indicators of -1, 0 and +1 at 3i, 3i + 1 and 3i + 2; or (B, 2 width) squared."""
    if encoding == "raw":
        return x
    if encoding == "square":  # (B, 2 width): the values, then their squares
        return torch.cat([x, x * x], dim=1)
    # comparisons with Python numbers: no tensor made from the host inside a batch (capturable)
    return torch.stack([x == value for value in ONEHOT_VALUES], dim=2).to(x.dtype).flatten(1)



class RNNStep(StepFunction):
    reads = ("hidden", "encoding")
    input_kind = "vectors"
    graph_safe = True

    def __init__(self, cfg, input_shape):
        super().__init__()
        self.encoding = cfg.step.encoding
        self.from_input = nn.Linear(input_width(cfg, input_shape), cfg.step.hidden)
        self.from_state = nn.Linear(cfg.step.hidden, cfg.step.hidden, bias=False)
        self.readout_size = cfg.step.hidden

    def start(self, x, steps):
        return (self.from_input(encoded(x, self.encoding)),), (None,)  # (B, hidden) once per input; h_0 = 0

    def forward(self, context, state, n):
        (input_part,), (h,) = context, state
        h = torch.tanh(input_part if h is None else input_part + self.from_state(h))
        return (h,), h, None


class GRUStep(StepFunction):
    implied = {"gru_layer_norm": True, "gru_orthogonal": True, "gru_update_bias": 1.0}
    reads = ("hidden", "gru_layer_norm", "gru_orthogonal", "gru_update_bias", "encoding")
    input_kind = "vectors"
    graph_safe = True

    def __init__(self, cfg, input_shape):
        super().__init__()
        layer_norm, orthogonal, update_bias = cfg.step.gru_layer_norm, cfg.step.gru_orthogonal, cfg.step.gru_update_bias
        self.encoding = cfg.step.encoding
        self.cell = nn.GRUCell(input_width(cfg, input_shape), cfg.step.hidden)
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
        input_gates = nn.functional.linear(encoded(x, self.encoding), self.cell.weight_ih,
                                           self.cell.bias_ih)  # (B, 3 hidden)
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
