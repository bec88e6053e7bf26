"""Step functions for vector inputs (parity): both read the whole input vector at every step.

rnn, the paper's: h_n = tanh(W_x x + W_h h_{n-1} + b), h_0 = 0 (the paper: 128 units), W_x x + b
computed once per input. gru, the public implementations' choice: h_n = GRUCell(x, h_{n-1}),
h_0 = 0, the input's share of the gates computed once per input. Step 1 already sees the input.

Each entry is read as its value (`--encoding raw`), one-hot over {-1, 0, +1} (`onehot`, as
AdaTape) or as x and x^2 (`square`): the last two make the count of +1 entries linear in the
input. Optional, after the min-pondernet recipe (`--step gru` implies all three): LayerNorm on
the new state, orthogonal recurrent weights, a positive update-gate bias.

On the CPU a forward over every step runs the gru's steps as one autograd function
(GRURecurrence): the loop's operators on the same values, and a backward that sums every
gradient in autograd's order, so a seeded run is the same to the bit, a third cheaper a batch.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.autograd.function import once_differentiable

from .. import pieces
from . import StepFunction

ONEHOT_VALUES = (-1.0, 0.0, 1.0)


def encoded(x: torch.Tensor, encoding: str) -> torch.Tensor:
    """The entries (B, width) as the step reads them: as they are (raw); (B, 3 width) one-hot,
    entry i's indicators of -1, 0 and +1 at 3i, 3i + 1 and 3i + 2; or (B, 2 width) squared."""
    if encoding == "raw":
        return x
    if encoding == "square":  # (B, 2 width): the values, then their squares
        return torch.cat([x, x * x], dim=1)
    # comparisons with Python numbers: no tensor made from the host inside a batch (capturable)
    return torch.stack([x == value for value in ONEHOT_VALUES], dim=2).to(x.dtype).flatten(1)


aten = torch.ops.aten


class VectorStep(pieces.Vectors, StepFunction):
    """A step reading the input vector as `--encoding` gives it (`encoded`), `input_width` wide."""
    graph_safe = True

    def __init__(self, cfg, input_shape):
        super().__init__(cfg)
        self.encoding = cfg.step.encoding
        (width,) = input_shape
        self.input_width = width * {"raw": 1, "onehot": len(ONEHOT_VALUES), "square": 2}[self.encoding]


class RNNStep(pieces.RNN, VectorStep):
    def __init__(self, cfg, input_shape):
        super().__init__(cfg, input_shape)
        self.from_input = nn.Linear(self.input_width, cfg.step.hidden)
        self.from_state = nn.Linear(cfg.step.hidden, cfg.step.hidden, bias=False)

    def start(self, x, steps):
        return (self.from_input(encoded(x, self.encoding)),), (None,)  # (B, hidden) once per input; h_0 = 0

    def forward(self, context, state, n):
        (input_part,), (h,) = context, state
        h = torch.tanh(input_part if h is None else input_part + self.from_state(h))
        return (h,), h, None


class GRUStep(pieces.GRU, VectorStep):
    def __init__(self, cfg, input_shape):
        super().__init__(cfg, input_shape)
        hidden = cfg.step.hidden
        self.cell = nn.GRUCell(self.input_width, hidden)
        self.norm = nn.LayerNorm(hidden) if cfg.step.gru_layer_norm else None
        with torch.no_grad():
            if cfg.step.gru_orthogonal:
                for block in self.cell.weight_hh.split(hidden):  # reset, update, new: one each
                    nn.init.orthogonal_(block)
            if cfg.step.gru_update_bias:
                self.cell.bias_ih[hidden:2 * hidden].add_(cfg.step.gru_update_bias)

    def start(self, x, steps):
        input_gates = nn.functional.linear(encoded(x, self.encoding), self.cell.weight_ih,
                                           self.cell.bias_ih)  # (B, 3 hidden)
        return (input_gates,), (None,)

    def forward(self, context, state, n):
        (input_gates,), (h,) = context, state
        input_reset, input_update, input_new = input_gates.chunk(3, dim=1)
        # GRURecurrence.forward repeats these operators: a change here is a change there
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

    def all_steps(self, context, state, steps: int):
        """Every step at once on the CPU (GRURecurrence): the readouts stacked (steps, B, hidden)
        and no extras; None elsewhere, under autocast (the loop casts per operator) or while
        torch.compile traces (--compile: the loop, fused by the compiler)."""
        (input_gates,), (h,) = context, state
        if (input_gates.device.type != "cpu" or h is not None or torch.is_autocast_enabled("cpu")
                or torch.compiler.is_compiling()):  # the compiler fuses the loop's own operators
            return None
        norm = self.norm
        readouts = GRURecurrence.apply(input_gates, self.cell.weight_hh, self.cell.bias_hh,
                                       None if norm is None else norm.weight, None if norm is None else norm.bias,
                                       steps, 1e-5 if norm is None else norm.eps)
        return readouts, None


class GRURecurrence(torch.autograd.Function):
    """GRUStep's `steps` steps from h_0 = 0 as one autograd node: (input gates (B, 3 hidden),
    weight_hh, bias_hh, LayerNorm weight and bias or None, steps, eps) -> the states (steps, B,
    hidden). The forward runs GRUStep.forward's operators in its order; the backward computes
    each of the loop's gradients with the kernels autograd calls (tanh_backward,
    sigmoid_backward, native_layer_norm_backward, the same matrix products) and adds up the
    gradients of a tensor used more than once in the order autograd's engine adds the loop's
    (the last step first; a state's own readout, then its share of the next step's update, then
    of its gates), so the results are the loop's to the bit (tests/test_parity_steps.py). In
    place where the loop allocates: an intermediate that nothing else reads."""

    @staticmethod
    def forward(ctx, input_gates, weight_hh, bias_hh, norm_weight, norm_bias, steps, eps):
        hidden = weight_hh.shape[1]
        input_gates_ru, input_new = input_gates[:, :2 * hidden], input_gates[:, 2 * hidden:]
        out = input_gates.new_empty(steps, input_gates.shape[0], hidden)
        h = torch.zeros_like(input_new)
        saved = []
        for n in range(steps):
            state_gates = bias_hh.expand_as(input_gates) if n == 0 else \
                nn.functional.linear(h, weight_hh, bias_hh)
            state_new = state_gates[:, 2 * hidden:]
            # the reset and update gates in one operator each: the loop's, element by element
            gates = torch.add(input_gates_ru, state_gates[:, :2 * hidden]).sigmoid_()
            reset, update = gates[:, :hidden], gates[:, hidden:]
            new = torch.mul(reset, state_new).add_(input_new).tanh_()
            kept = h - new
            h = torch.mul(update, kept).add_(new)  # new + update * (h - new)
            pre_norm = mean = rstd = None
            if norm_weight is not None:
                pre_norm = h
                h, mean, rstd = torch.native_layer_norm(h, [hidden], norm_weight, norm_bias, eps)
            out[n] = h
            saved.append((state_new, gates, new, kept, pre_norm, mean, rstd))
            h = out[n]
        # the states through save_for_backward: ctx holding views of its own output would be a
        # reference cycle that frees no batch's tensors
        ctx.save_for_backward(weight_hh, norm_weight, norm_bias, out)
        ctx.saved = saved
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        weight_hh, norm_weight, norm_bias, out = ctx.saved_tensors
        hidden = weight_hh.shape[1]
        steps, batch = grad_out.shape[:2]
        grad_input = grad_weight = grad_bias = grad_norm_weight = grad_norm_bias = None
        carried = None  # the next step's gradients to this step's state: through `kept`, through the gates
        grad_sigmoid = grad_out.new_empty(batch, 2 * hidden)  # the reset and update gates' outputs'
        for n in reversed(range(steps)):
            state_new, gates, new, kept, pre_norm, mean, rstd = ctx.saved[n]
            reset, update = gates[:, :hidden], gates[:, hidden:]
            grad_h = grad_out[n]
            if carried is not None:
                grad_kept, grad_gates = carried
                grad_h = torch.addmm(grad_h + grad_kept, grad_gates, weight_hh)
            if norm_weight is not None:
                grad_h, grad_nw, grad_nb = aten.native_layer_norm_backward(
                    grad_h, pre_norm, [hidden], mean, rstd, norm_weight, norm_bias, [True, True, True])
                if grad_norm_weight is None:
                    grad_norm_weight, grad_norm_bias = grad_nw, grad_nb
                else:
                    grad_norm_weight.add_(grad_nw)
                    grad_norm_bias.add_(grad_nb)
            torch.mul(grad_h, kept, out=grad_sigmoid[:, hidden:])  # the update gate's
            grad_kept = grad_h * update
            grad_new = grad_h - grad_kept  # autograd's grad + (-grad_kept): the same float
            grad_pre_new = aten.tanh_backward(grad_new, new)
            torch.mul(grad_pre_new, state_new, out=grad_sigmoid[:, :hidden])  # the reset gate's
            grad_gates = grad_out.new_empty(batch, 3 * hidden)  # the state's gates: reset, update, new
            torch.mul(grad_pre_new, reset, out=grad_gates[:, 2 * hidden:])
            aten.sigmoid_backward.grad_input(grad_sigmoid, gates, grad_input=grad_gates[:, :2 * hidden])
            # the input's gates: reset and update as the state's, new before the reset's product
            if grad_input is None:
                grad_input = torch.cat([grad_gates[:, :2 * hidden], grad_pre_new], dim=1)
            else:
                grad_input[:, :2 * hidden].add_(grad_gates[:, :2 * hidden])
                grad_input[:, 2 * hidden:].add_(grad_pre_new)
            step_bias = grad_gates.sum(0)
            grad_bias = step_bias if grad_bias is None else grad_bias.add_(step_bias)
            if n > 0:  # step 0's gates are the bias alone
                h = out[n - 1]
                grad_weight = grad_gates.t().mm(h) if grad_weight is None else grad_weight.addmm_(grad_gates.t(), h)
                carried = grad_kept, grad_gates
        return grad_input, grad_weight, grad_bias, grad_norm_weight, grad_norm_bias, None, None
