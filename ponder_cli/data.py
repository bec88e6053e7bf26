"""MNIST as whole uint8 tensors on the training device, and batch preparation on that device:
batched rotation, pixel-identical to torchvision's RandomRotation, and the test protocols'
rotations.

torchvision rotates one angle per call; training needs a different angle per image, so `rotate`
builds the same sampling grid as torchvision's tensor `rotate` (nearest, zero fill, no expand,
counter-clockwise positive) for a whole batch at once and runs one `grid_sample`.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from . import BadValue, PonderError, brief
from .registry import PROTOCOLS

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
RAW_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def resolve_data_dir(data_dir: Path | None) -> Path:
    """--data-dir when given, else the default."""
    return data_dir if data_dir is not None else default_data_dir()


def default_data_dir() -> Path:
    """$PONDER_DATA_DIR, else a per-user cache directory."""
    env = os.environ.get("PONDER_DATA_DIR")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "ponder_cli"


@dataclass(frozen=True)
class ImageSet:
    images: torch.Tensor  # (N, 28, 28) uint8
    labels: torch.Tensor  # (N,) int64

    def __len__(self) -> int:
        return self.labels.shape[0]

    def to(self, device) -> "ImageSet":
        return ImageSet(self.images.to(device), self.labels.to(device))

    def subset(self, index: torch.Tensor) -> "ImageSet":
        return ImageSet(self.images[index], self.labels[index])


_IDX_UBYTE = 0x08


def read_idx(path: Path) -> torch.Tensor:
    """One IDX file of unsigned bytes (MNIST's format) as a uint8 tensor, with its header checked."""
    data = Path(path).read_bytes()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != _IDX_UBYTE or not 1 <= data[3] <= 4:
        raise PonderError(f"{path} is not an IDX file of unsigned bytes (bad magic number)")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise PonderError(f"{path} is truncated (incomplete header)")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    expected = math.prod(dims)
    if len(data) - header != expected:
        raise PonderError(f"{path} is truncated or padded: {len(data) - header} bytes of data for shape "
                          f"{'x'.join(map(str, dims))} ({expected} expected)")
    if expected == 0:  # torch.frombuffer refuses an empty buffer
        return torch.empty(dims, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data[header:]), dtype=torch.uint8).view(*dims)


def _download(root: Path, train: bool) -> None:
    from torchvision.datasets import MNIST  # slow to import: only when a download is needed

    # torchvision reports download progress on stdout, which belongs to results.
    with contextlib.redirect_stdout(sys.stderr):
        MNIST(str(root), train=train, download=True)


def load_mnist(data_dir: Path | str, *, train: bool, download: bool = True) -> ImageSet:
    """The whole training (60k) or test (10k) set from torchvision's layout, downloaded when absent."""
    root = Path(data_dir).expanduser()
    raw = root / "MNIST" / "raw"
    prefix = "train" if train else "t10k"
    image_file, label_file = raw / f"{prefix}-images-idx3-ubyte", raw / f"{prefix}-labels-idx1-ubyte"
    if root.exists() and not root.is_dir():
        raise PonderError(f"data directory {root} is not a directory")
    for path in (image_file, label_file):
        if path.is_dir():  # not a missing file: no download would help
            raise PonderError(f"{path} is a directory, not an IDX file; put MNIST's {path.name} file there")
    if not (image_file.is_file() and label_file.is_file()):
        reason = "not found"
        if download:
            created = None if raw.exists() else raw  # the topmost directory a download would create
            while created is not None and not created.parent.exists():
                created = created.parent
            try:
                _download(root, train)
            except Exception as exc:  # offline, unwritable directory, server down
                if created is not None:  # leave no half-made directory behind
                    shutil.rmtree(created, ignore_errors=True)
                detail = brief(" ".join(str(exc).split()).rsplit("got: ", 1)[-1] or type(exc).__name__, 120)
                reason = f"not found and could not be downloaded ({detail})"
        if not (image_file.is_file() and label_file.is_file()):
            raise PonderError(f"MNIST {reason} in {raw}; put the four IDX files {', '.join(RAW_FILES)} "
                              "there (uncompressed), or point --data-dir / PONDER_DATA_DIR at the "
                              "directory that holds MNIST/raw")
    try:
        images, labels = read_idx(image_file), read_idx(label_file)
    except OSError as exc:
        raise PonderError(f"cannot read MNIST in {raw}: {exc.strerror or exc}") from None
    if images.dim() != 3 or tuple(images.shape[1:]) != (28, 28) or labels.dim() != 1 \
            or labels.shape[0] != images.shape[0]:
        raise PonderError(f"MNIST files in {raw} do not hold N 28x28 images and N labels "
                          f"(images {tuple(images.shape)}, labels {tuple(labels.shape)})")
    if images.shape[0] == 0:
        raise PonderError(f"{image_file} holds no images")
    if int(labels.max()) > 9:
        raise PonderError(f"{label_file} holds labels outside 0-9")
    return ImageSet(images, labels.long())


def train_val_split(full: ImageSet, *, val_size: int, train_size: int, seed: int) -> tuple[ImageSet, ImageSet]:
    """Seeded split into training and held-out validation images (train_size 0: all the rest)."""
    available = len(full) - val_size
    if available <= 0:
        raise BadValue(f"val-size {val_size} leaves no training images out of {len(full)}")
    if train_size > available:
        raise BadValue(f"train-size {train_size} exceeds the {available} images left after validation")
    order = torch.randperm(len(full), generator=torch.Generator().manual_seed(seed))
    train_index = order[val_size:val_size + (train_size or available)]
    return full.subset(train_index), full.subset(order[:val_size])


def prepare_batch(images: torch.Tensor, angles: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 (B, 28, 28) -> normalised float (B, 1, 28, 28), rotated first when angles are given.

    Rotating the raw pixels with zero fill and then normalising is what torchvision's
    RandomRotation -> ToTensor -> Normalize does.
    """
    x = images.unsqueeze(1).float()
    if angles is not None:
        x = rotate(x, angles)
    return (x / 255 - MNIST_MEAN) / MNIST_STD


# rotation ---------------------------------------------------------------------------------------

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
