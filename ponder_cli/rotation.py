"""Batched rotation on the device, pixel-identical to torchvision's RandomRotation.

torchvision rotates one angle per call; training needs a different angle per image, so this
builds the same sampling grid as torchvision's tensor `rotate` (nearest, zero fill, no expand,
counter-clockwise positive) for a whole batch at once and runs one `grid_sample`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .registry import PROTOCOLS


def _inverse_rotation_matrices(angles: torch.Tensor) -> torch.Tensor:
    """(B,) degrees -> (B, 2, 3): output pixel -> input pixel, about the image centre.

    Mirrors torchvision's `_get_inverse_affine_matrix(center=0, angle=-angle, shear=0, scale=1)`
    in float64 before the cast, so the float32 matrices agree bit for bit.
    """
    rot = torch.deg2rad(-angles.to(torch.float64))
    cos, sin = torch.cos(rot), torch.sin(rot)
    zeros = torch.zeros_like(rot)
    # torchvision's [d, -b, 0, -c, a, 0] with a = d = cos, b = -sin, c = sin
    matrix = torch.stack([cos, sin, zeros, -sin, cos, zeros], dim=1)
    return matrix.view(-1, 2, 3).to(torch.float32)


def _pixel_grid(height: int, width: int, device) -> torch.Tensor:
    """(1, H*W, 3) homogeneous pixel-centre coordinates relative to the image centre."""
    base = torch.empty(1, height, width, 3, dtype=torch.float32, device=device)
    base[..., 0].copy_(torch.linspace(-width * 0.5 + 0.5, width * 0.5 - 0.5, steps=width, device=device))
    base[..., 1].copy_(torch.linspace(-height * 0.5 + 0.5, height * 0.5 - 0.5, steps=height, device=device).unsqueeze(-1))
    base[..., 2].fill_(1)
    return base.view(1, height * width, 3)


def rotate(images: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate each image counter-clockwise by its angle in degrees: (B, C, H, W) float, (B,)."""
    batch, _, height, width = images.shape
    theta = _inverse_rotation_matrices(angles.to(images.device)).transpose(1, 2)  # (B, 3, 2)
    # divided by Python numbers: a tensor made from a list is copied to the device, and on CUDA
    # that copy makes the host wait, for every training batch
    rescaled = torch.stack([theta[..., 0] / (0.5 * width), theta[..., 1] / (0.5 * height)], dim=-1)
    base = _pixel_grid(height, width, images.device).expand(batch, -1, -1)  # (B, H*W, 3)
    grid = torch.bmm(base, rescaled).view(batch, height, width, 2)
    return F.grid_sample(images, grid, mode="nearest", padding_mode="zeros", align_corners=False)


def uniform_angles(count: int, max_angle: float, *, generator: torch.Generator | None = None,
                   device=None) -> torch.Tensor:
    """(count,) angles drawn uniformly from [-max_angle, max_angle] degrees."""
    u = torch.rand(count, generator=generator, device=device)
    return (2 * u - 1) * max_angle


def protocol_angles(draws: torch.Tensor, angle: float, protocol: str = "uniform", *,
                    lower: float = 0.0) -> torch.Tensor:
    """(N,) test rotations in degrees (float64) for one bucket, from two uniforms per image
    `draws` (N, 2) in [0, 1): the size of the turn and its sign.

    uniform: uniformly within +-angle (the reference protocol); band: |rotation| uniform between
    the previous bucket's angle `lower` and `angle`, random sign, so buckets do not overlap;
    fixed: exactly +-angle, random sign. float64 arithmetic: the same angles on every CPU.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}")
    u, sign = draws[:, 0].double(), torch.where(draws[:, 1] < 0.5, -1.0, 1.0).double()
    if protocol == "uniform":
        return (2 * u - 1) * angle
    if protocol == "band":
        return sign * (lower + u * (angle - lower))
    return sign * angle
