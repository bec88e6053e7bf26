import pytest
import torch

from ponder_cli import PonderError
from ponder_cli.tasks.mnist import ImageSet, load_mnist, train_val_split
from synthetic_data import synthetic_digits


def test_load_tiny_idx(tiny_mnist):
    train = load_mnist(tiny_mnist, train=True, download=False)
    test = load_mnist(tiny_mnist, train=False, download=False)
    assert train.images.shape == (700, 28, 28) and train.images.dtype == torch.uint8
    assert test.labels.shape == (200,) and test.labels.dtype == torch.int64
    expected = synthetic_digits(700, seed=0)
    assert torch.equal(train.images, expected.images) and torch.equal(train.labels, expected.labels)


def test_missing_data_is_one_clear_error(tmp_path):
    with pytest.raises(PonderError) as err:
        load_mnist(tmp_path / "nowhere", train=True, download=False)
    message = str(err.value)
    assert "MNIST" in message and "train-images-idx3-ubyte" in message and "\n" not in message


def test_split_is_seeded_disjoint_and_sized():
    full = ImageSet(torch.zeros(100, 28, 28, dtype=torch.uint8), torch.arange(100))
    train, val = train_val_split(full, val_size=10, train_size=0, seed=7)
    again, _ = train_val_split(full, val_size=10, train_size=0, seed=7)
    other, _ = train_val_split(full, val_size=10, train_size=0, seed=8)
    assert len(train) == 90 and len(val) == 10
    assert set(train.labels.tolist()).isdisjoint(val.labels.tolist())
    assert torch.equal(train.labels, again.labels) and not torch.equal(train.labels, other.labels)
    small, _ = train_val_split(full, val_size=10, train_size=30, seed=7)
    assert torch.equal(small.labels, train.labels[:30])
    with pytest.raises(PonderError):
        train_val_split(full, val_size=100, train_size=0, seed=7)
