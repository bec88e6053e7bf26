import struct
from pathlib import Path

import pytest
import torch

from ponder_cli.data import synthetic_digits as generated_digits


def synthetic_digits(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, labels) of ponder_cli's generated stand-in digits."""
    data = generated_digits(count, seed)
    return data.images, data.labels


def write_idx(path: Path, data: torch.Tensor) -> None:
    kind = 0x08  # unsigned byte
    header = struct.pack(">HBB", 0, kind, data.dim()) + struct.pack(f">{data.dim()}I", *data.shape)
    path.write_bytes(header + data.to(torch.uint8).contiguous().numpy().tobytes())


def write_mnist(root: Path, n_train: int = 700, n_test: int = 200, seed: int = 0) -> Path:
    """A tiny MNIST in torchvision's layout: root/MNIST/raw/<four IDX files>."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, count, offset in (("train", n_train, 0), ("t10k", n_test, 1)):
        images, labels = synthetic_digits(count, seed + offset)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return root


@pytest.fixture(scope="session")
def tiny_mnist(tmp_path_factory) -> Path:
    return write_mnist(tmp_path_factory.mktemp("data"))
