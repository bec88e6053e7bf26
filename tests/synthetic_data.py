"""Learnable stand-ins for MNIST, for tests and for benchmarks run without the real digits
(`benchmarks/speed.py --synthetic`, `benchmarks/paired.py epoch`). Test plumbing, not part of the
package: tests import it as `synthetic_data` (pytest puts this folder on the path), benchmarks add
this folder to `sys.path` first."""

import torch

from ponder_cli.tasks.mnist import ImageSet


def synthetic_digits(count: int, seed: int) -> ImageSet:
    """`count` 28x28 uint8 images: label k is a bright bar at rows 4 + 2k to 5 + 2k (columns 6 to
    21) over uniform noise below 40, drawn from a generator seeded with `seed`."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (count,), generator=g)
    images = (torch.rand(count, 28, 28, generator=g) * 40).to(torch.uint8)
    row_offset = torch.arange(28)[None, :, None] - (4 + 2 * labels)[:, None, None]  # (N, 28, 1)
    columns = (torch.arange(28) >= 6) & (torch.arange(28) < 22)  # (28,)
    images[((row_offset >= 0) & (row_offset < 2)) & columns] = 255
    return ImageSet(images, labels)
