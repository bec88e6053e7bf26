"""MNIST as whole uint8 tensors on the training device, and batch preparation on that device."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from . import PonderError
from .rotation import rotate

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
RAW_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


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


def load_mnist(data_dir: Path | str, *, train: bool, download: bool = True) -> ImageSet:
    """The whole training (60k) or test (10k) set, loaded once; downloaded when absent."""
    from torchvision.datasets import MNIST  # heavy import, only when data is needed

    root = Path(data_dir).expanduser()
    raw = root / "MNIST" / "raw"
    if root.exists() and not root.is_dir():
        raise PonderError(f"data directory {root} is not a directory")
    try:
        try:
            dataset = MNIST(str(root), train=train, download=False)
        except RuntimeError:
            if not download:
                raise
            # torchvision reports download progress on stdout, which belongs to results.
            with contextlib.redirect_stdout(sys.stderr):
                dataset = MNIST(str(root), train=train, download=True)
    except Exception as exc:  # offline, unreadable, truncated or wrong-magic files
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise PonderError(
            f"cannot load MNIST from {raw} ({reason}); put the four IDX files "
            f"{', '.join(RAW_FILES)} there, or point --data-dir / PONDER_DATA_DIR at their parent's parent"
        ) from None
    images, labels = dataset.data, dataset.targets
    if images.dtype != torch.uint8 or images.dim() != 3 or tuple(images.shape[1:]) != (28, 28) \
            or labels.shape != images.shape[:1]:
        raise PonderError(f"MNIST files in {raw} do not hold N x 28 x 28 images with N labels")
    return ImageSet(images, labels.long())


def train_val_split(full: ImageSet, *, val_size: int, train_size: int, seed: int) -> tuple[ImageSet, ImageSet]:
    """Seeded split into training and held-out validation images (train_size 0: all the rest)."""
    available = len(full) - val_size
    if available <= 0:
        raise PonderError(f"val-size {val_size} leaves no training images out of {len(full)}")
    if train_size > available:
        raise PonderError(f"train-size {train_size} exceeds the {available} images left after validation")
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
