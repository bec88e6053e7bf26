"""A step function that re-reads the image: "align".

At step n the *original* image is read through a rotation about its centre that the state
accumulates, x_n = rotate(x, theta_{n-1}); a CNN embeds x_n and a GRU cell updates the state,
h_n = GRU(CNN(x_n), h_{n-1}); a turn head gives a bounded increment
delta_n = max_turn * tanh(w . h_n + v . conv(x_n)), theta_n = theta_{n-1} + delta_n. The warp is bilinear
(`affine_grid` + `grid_sample`), so the turn is learnt from the halting method's loss alone:
no rotation labels, no angle regression. Unlike the mlp step, later steps see something new,
so iterating can pay: a digit rotated further needs more turns before it reads upright.

The halting gate, written once here (config.turn_gate and docs/align.md point to it): the
step's halting feature is its work, the net turn of its last two steps,
w_n = |delta_n + delta_{n-1}| / (2 max_turn) in [0, 1]; with `turn_gate = F` (AlignStep.gate_halting,
gated_logit) lambda_n = sigmoid(z_n) (1 - min(1, w_n / F)), so a step whose net turn reaches
2 F max_turn never halts. The halting head may also read w_n (`halting_input = "state+turn"`). Both
the gate and that input are detached: halting waits for the work, and the halting loss (the
KL pull towards halting early) cannot teach the step to turn less; it reaches the turn only
through what the turned view does to the state and the class head.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import pieces
from . import StepFunction, StepTrace
from .mlp import ImageEncoder


def rotation_grid(angles: torch.Tensor, size: tuple) -> torch.Tensor:
    """Sampling grid that rotates images (N, C, H, W) counter-clockwise by `angles` radians (N,)
    about their centre: output pixel p reads input pixel R(-angle) p. affine_grid's grid
    (align_corners=False: normalised coordinates in [-1, 1], y down, pixel centres at
    linspace(-1, 1, size) (size - 1) / size) computed elementwise, the same floats on this
    project's CPUs: affine_grid's batched matrix product took longer than the sampling itself."""
    height, width = size[-2:]
    options = {"device": angles.device, "dtype": angles.dtype}
    xs = torch.linspace(-1, 1, width, **options) * (width - 1) / width  # (W,)
    ys = (torch.linspace(-1, 1, height, **options) * (height - 1) / height)[:, None]  # (H, 1)
    cos, sin = torch.cos(angles)[:, None, None], torch.sin(angles)[:, None, None]  # (N, 1, 1)
    return torch.stack([cos * xs - sin * ys, sin * xs + cos * ys], -1)  # (N, H, W, 2)


class _RotateBilinear(torch.autograd.Function):
    """grid_sample (bilinear, zero padding) through `rotation_grid(angles)`, whose gradient w.r.t.
    each grid coordinate is the mean of its derivatives just either side of the sample along that
    coordinate's own axis. Bilinear sampling has a kink at pixel centres, where grid_sample takes
    a one-sided derivative; the turn heads start at zero, so the first warps sample exactly the
    centres and the turn's gradient would be 40% off. Each axis is moved on its own (both at once
    would mix in the change along the other). The forward and the image gradient are grid_sample's.
    The angle's gradient: sum over pixels of g_x dL/dg_y - g_y dL/dg_x (dg/d angle = (-g_y, g_x)).
    """

    @staticmethod
    def forward(ctx, images, angles):
        dtype = torch.promote_types(images.dtype, angles.dtype)
        if dtype in (torch.float16, torch.bfloat16):
            dtype = torch.float32  # as autocast runs grid_sample
        images = images.to(dtype)
        grid = rotation_grid(angles.detach().to(dtype), images.shape)  # (N, H, W, 2)
        ctx.save_for_backward(images, grid)
        ctx.angles_dtype = angles.dtype
        return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)

    @staticmethod
    def backward(ctx, grad_out):
        images, grid = ctx.saved_tensors
        grad_out = grad_out.to(images.dtype)
        grad_images = _grid_sample_backward(grad_out, images, grid, [True, False])[0] if ctx.needs_input_grad[0] \
            else None
        grad_angles = None
        if ctx.needs_input_grad[1]:
            grad_x, grad_y = _grid_gradient_either_side(grad_out, images, grid)  # each (N, H, W)
            x, y = grid.unbind(-1)
            grad_angles = (x * grad_y - y * grad_x).sum(dim=(1, 2)).to(ctx.angles_dtype)
        return grad_images, grad_angles


def _grid_sample_backward(grad_out, images, grid, mask):
    """aten's grid_sample backward (bilinear, zero padding, align_corners=False): the gradients
    w.r.t. the images and the grid that `mask` asks for."""
    return torch.ops.aten.grid_sampler_2d_backward(grad_out, images, grid, 0, 0, False, mask)


def _grid_gradient_either_side(grad_out, images, grid):
    """The gradient of _RotateBilinear w.r.t. the grid's x and y coordinates, each (N, H, W): x's
    from the grid moved by -+ the offset along x alone, y's from it moved along y alone. (Four
    backward calls: one on the four moved grids side by side costs more than twice as much, in
    copying them.)"""
    height, width = images.shape[-2:]
    # 32 units in the last place of a coordinate (float32, 28 pixels: 1e-4 pixels), far above the
    # rounding of the coordinates and far below a pixel
    offset = 32 * torch.finfo(images.dtype).eps * max(height, width)
    dx, dy = 2 * offset / width, 2 * offset / height  # normalised coordinates span 2 over the width (height)
    x, y = grid.unbind(-1)
    moved = grid.clone()  # one coordinate moved at a time, in place

    def along(axis, moved_values):
        moved[..., axis] = moved_values
        return _grid_sample_backward(grad_out, images, moved, [False, True])[1][..., axis]

    grad_x = (along(0, x + dx) + along(0, x - dx)) / 2
    moved[..., 0] = x
    grad_y = (along(1, y + dy) + along(1, y - dy)) / 2
    return grad_x, grad_y


def rotate_bilinear(images: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Differentiable in `angles` (see _RotateBilinear); zero outside the image. Images are
    normalised, so zero padding would read as mid-grey: pad with the background value (the image
    minimum) instead."""
    background = images.amin(dim=(1, 2, 3), keepdim=True)
    return _RotateBilinear.apply(images - background, angles) + background


def gated_logit(z: torch.Tensor, work: torch.Tensor) -> torch.Tensor:
    """logit(sigmoid(z) * (1 - work)) for work in [0, 1], computed in log space (float32):
    log lambda = logsigmoid(z) + log(1 - work), log(1 - lambda) = log1p(-sigmoid(z) (1 - work))."""
    z, keep = z.float(), (1 - work.float()).clamp_min(1e-6)
    log_lambda = F.logsigmoid(z) + torch.log(keep)
    return log_lambda - torch.log1p(-(torch.sigmoid(z) * keep).clamp_max(1 - 1e-6))


class AlignStep(pieces.Align, StepFunction):
    halting_extra_size = 1  # |delta_n + delta_{n-1}| in units of twice the largest turn
    graph_safe = True

    def __init__(self, cfg, input_shape):
        super().__init__(cfg)
        self.encoder = ImageEncoder.of(cfg)
        self.cell = nn.GRUCell(cfg.step.hidden_cnn, cfg.step.hidden)
        self.turn = nn.Linear(cfg.step.hidden, 1)
        # The classifier's embedding learns to ignore small rotations; the turn also reads the
        # convolutional features of the current view, which still show which way is up.
        self.view_turn = nn.Linear(self.encoder.fc.in_features, 1)
        for layer in (self.turn, self.view_turn):
            nn.init.zeros_(layer.weight)  # start by reading the image as it is
            nn.init.zeros_(layer.bias)
        self.max_turn = math.radians(cfg.step.align_turn)
        self.turn_gate = float(cfg.step.turn_gate)

    def gate_halting(self, lambda_logits, extra):
        """No halting while the step still turns (the module docstring's formula); the work is
        detached, as the halting input is."""
        if self.turn_gate <= 0:
            return lambda_logits
        work = (extra[..., 0].detach().float() / self.turn_gate).clamp_max(1.0)
        return gated_logit(lambda_logits, work)

    def start(self, x, steps):
        batch = x.shape[0]
        h = x.new_zeros(batch, self.cell.hidden_size)
        angle, previous = x.new_zeros(batch), x.new_zeros(batch)
        # every step's channel masks drawn per input, not per step's batch: the shrinking forward and
        # the mask over every step train on the same draws
        return (x, self.encoder.channel_masks(steps, x)), (h, angle, previous)

    def forward(self, context, state, n):
        (x, masks), (h, angle, previous) = context, state
        seen = x if n == 0 else rotate_bilinear(x, angle)  # theta_0 = 0: the image as given
        if masks is None:
            features = self.encoder.features(seen)  # (B, 320)
        else:  # a channel scale commutes with max-pooling and relu: the maps masked after them
            features = (self.encoder.maps(seen, dropout=False) * masks[:, n]).flatten(1)
        h = self.cell(self.encoder.head(features), h)
        delta = self.max_turn * torch.tanh((self.turn(h) + self.view_turn(features)).squeeze(-1))  # (B,)
        # The work a step does is its net turn over the last two steps, theta_n - theta_{n-2}: a
        # turn that swings back and forth about upright (the trained models' two-step cycle,
        # docs/align.md) does no work, and must not hold halting back.
        extra = ((delta + previous).abs() / (2 * self.max_turn)).unsqueeze(-1)  # (B, 1) in [0, 1]
        return (h, angle + delta, delta), h, extra

    def trace(self, x, context, before, after, n):
        """The view step n read, and the turn accumulated after it in degrees ("turn_deg"), in
        tasks.mnist.rotate's sense (counter-clockwise positive): a digit rotated by +60° is read
        upright after a turn of about -60°; a trained model's turn then swings from step to step
        between two turns about 27° apart, one reading the digit near upright and one well off it
        (docs/align.md, "What the turn does while it waits")."""
        image, angle_before, angle_after = context[0], before[1], after[1]
        view = image if n == 0 else rotate_bilinear(image, angle_before)
        return StepTrace(view, {"turn_deg": torch.rad2deg(angle_after)})
