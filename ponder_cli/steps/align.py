"""A step function that re-reads the image: "align".

At step n the *original* image is read through a rotation about its centre that the state
accumulates, x_n = rotate(x, theta_{n-1}); a CNN embeds x_n and a GRU cell updates the state,
h_n = GRU(CNN(x_n), h_{n-1}); a turn head gives a bounded increment
delta_n = max_turn * tanh(w . h_n + v . conv(x_n)), theta_n = theta_{n-1} + delta_n. The warp is bilinear
(`affine_grid` + `grid_sample`), so the turn is learnt from the halting method's loss alone:
no rotation labels, no angle regression. Unlike the mlp step, later steps see something new,
so iterating can pay: a digit rotated further needs more turns before it reads upright.

The halting head may also see |delta_n| (the step's turn, `--halting-input ...+turn`), and with
`--turn-gate` lambda_n is held back while the step turns: lambda_n = sigmoid(z_n) (1 - |delta_n| /
max_turn), the turn detached, so halting waits for the work and cannot stop the turning.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import StepFunction, StepTrace
from .mlp import ImageEncoder


def rotation_grid(angles: torch.Tensor, size: tuple) -> torch.Tensor:
    """Sampling grid that rotates images (N, C, H, W) counter-clockwise by `angles` radians (N,)
    about their centre: output pixel p reads input pixel R(-angle) p."""
    cos, sin = torch.cos(angles), torch.sin(angles)
    zeros = torch.zeros_like(angles)
    # affine_grid maps output coordinates to input coordinates (normalised to [-1, 1], y down)
    theta = torch.stack([torch.stack([cos, -sin, zeros], -1), torch.stack([sin, cos, zeros], -1)], 1)  # (N, 2, 3)
    return F.affine_grid(theta, list(size), align_corners=False)


def rotate_bilinear(images: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Differentiable in `angles`; zero outside the image. Images are normalised, so zero
    padding would read as mid-grey: pad with the background value (the image minimum) instead."""
    background = images.amin(dim=(1, 2, 3), keepdim=True)
    grid = rotation_grid(angles, images.shape)
    return F.grid_sample(images - background, grid, mode="bilinear", padding_mode="zeros",
                         align_corners=False) + background


class AlignStep(StepFunction):
    halting_extra_size = 1  # |delta_n + delta_{n-1}| in units of twice the largest turn
    # what `--step align` implies unless given: the settings under which halting tracked the
    # work best in the README's experiments (and truncation, since every step runs the CNN)
    implied = {"max_steps": 12, "lambda_p": 0.5, "truncation": 0.01, "halting_input": "state+turn", "turn_gate": 0.2,
               "halting_bias": "prior"}
    reads = ("hidden", "hidden_cnn", "kernel_size", "cnn_dropout", "align_turn", "turn_gate")
    tasks = ("mnist",)

    def example_input(self, batch, device):
        return torch.zeros((batch, 1, 28, 28), device=device)

    def __init__(self, cfg):
        super().__init__()
        self.encoder = ImageEncoder(cfg.kernel_size, cfg.hidden_cnn, cfg.cnn_dropout)
        self.cell = nn.GRUCell(cfg.hidden_cnn, cfg.hidden)
        self.turn = nn.Linear(cfg.hidden, 1)
        # The classifier's embedding learns to ignore small rotations; the turn also reads the
        # convolutional features of the current view, which still show which way is up.
        self.view_turn = nn.Linear(self.encoder.fc.in_features, 1)
        for layer in (self.turn, self.view_turn):
            nn.init.zeros_(layer.weight)  # start by reading the image as it is
            nn.init.zeros_(layer.bias)
        self.max_turn = math.radians(cfg.align_turn)
        self.readout_size = cfg.hidden

    def start(self, x, steps):
        batch = x.shape[0]
        h = x.new_zeros(batch, self.cell.hidden_size)
        angle, previous = x.new_zeros(batch), x.new_zeros(batch)
        return (x,), (h, angle, previous)

    def forward(self, context, state, n):
        (x,), (h, angle, previous) = context, state
        seen = x if n == 0 else rotate_bilinear(x, angle)  # theta_0 = 0: the image as given
        features = self.encoder.features(seen)  # (B, 320)
        h = self.cell(self.encoder.head(features), h)
        delta = self.max_turn * torch.tanh((self.turn(h) + self.view_turn(features)).squeeze(-1))  # (B,)
        # The work a step does is its net turn over the last two steps: a turn policy that jitters
        # back and forth around upright does no work, and must not hold halting back.
        extra = ((delta + previous).abs() / (2 * self.max_turn)).unsqueeze(-1)  # (B, 1) in [0, 1]
        return (h, angle + delta, delta), h, extra

    def trace(self, x, context, before, after, n):
        """The view step n read, and the turn accumulated after it in degrees ("turn_deg"), in
        rotation.rotate's sense (counter-clockwise positive): a digit rotated by +60° is read
        upright after a turn of about -60°."""
        (image,), angle_before, angle_after = context, before[1], after[1]
        view = image if n == 0 else rotate_bilinear(image, angle_before)
        return StepTrace(view, {"turn_deg": torch.rad2deg(angle_after)})
