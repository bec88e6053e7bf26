"""MNIST as whole uint8 tensors on the training device, and batch preparation on that device."""

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

from . import PonderError, brief
from .rotation import rotate

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
