"""The parity task of the PonderNet paper (Banino et al. 2021, §3.1; after Graves 2016, §3.1).

A vector of `elems` entries, `count` of them (the "non-zero count") set to +1 or -1 at random
positions, the rest 0. The label is 1 when the number of +1 entries is odd: the parity of the
+1 entries, not of the non-zero count.

Two classes with softmax cross-entropy. The paper's single logistic output unit is the same
model: a softmax over two logits (a, b) gives class 1 the probability sigmoid(b - a), so the
two-logit head is a reparametrised sigmoid unit and every piece of PonderNet's machinery
(argmax predictions, per-step cross-entropy, ACT's mean-field logits) applies unchanged.

Randomness comes only from explicit torch.Generator objects, never the global stream:
- training batches are drawn on the fly, on the training device, from one seeded generator;
- evaluation sets are drawn on the CPU from a generator seeded by (seed, elems, count), then
  moved to the device, so a checkpoint gives the same numbers on every device, and the rows of
  one non-zero count do not depend on which other counts are asked for.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

CLASSES = 2
# Seeds of the fixed evaluation sets: validation while training, test for reported figures.
VALIDATION_SEED = 1
TEST_SEED = 2
# Splits a (seed, elems, count) triple into one generator seed (an odd 64-bit multiplier, so
# distinct triples give distinct seeds for any realistic sizes).
_MIX = 0x9E3779B97F4A7C15


class ParityBatch(NamedTuple):
    x: torch.Tensor  # (B, elems) float32, entries in {-1, 0, +1}
    labels: torch.Tensor  # (B,) long: 1 when the number of +1 entries is odd
    counts: torch.Tensor  # (B,) long: the number of non-zero entries


def parity_labels(x: torch.Tensor) -> torch.Tensor:
    """1 where the number of +1 entries of a row is odd (B, elems) -> (B,) long."""
    return ((x == 1).sum(dim=-1) % 2).long()


def vectors_with_counts(counts: torch.Tensor, elems: int, generator: torch.Generator) -> ParityBatch:
    """Rows with the given non-zero counts (B,): positions uniform among all subsets of that
    size (the first `count` entries of a uniformly random permutation), signs +-1 with
    probability 1/2 each. Drawn on the generator's device."""
    batch, device = counts.shape[0], counts.device
    order = torch.rand(batch, elems, generator=generator, device=device).argsort(dim=1)  # random permutations
    first = torch.arange(elems, device=device) < counts[:, None]  # (B, elems): the first `count` slots
    nonzero = torch.zeros(batch, elems, dtype=torch.bool, device=device).scatter_(1, order, first)
    signs = torch.rand(batch, elems, generator=generator, device=device) < 0.5  # True: +1
    x = torch.where(nonzero, torch.where(signs, 1.0, -1.0), 0.0)  # (B, elems) float32
    return ParityBatch(x, parity_labels(x), counts)


def parity_batch(batch: int, elems: int, lo: int, hi: int, generator: torch.Generator) -> ParityBatch:
    """A training batch: non-zero counts uniform in [lo, hi], on the generator's device."""
    check_counts(elems, lo, hi)
    counts = torch.randint(lo, hi + 1, (batch,), generator=generator, device=generator.device)
    return vectors_with_counts(counts, elems, generator)


def check_counts(elems: int, lo: int, hi: int) -> None:
    if not 1 <= lo <= hi <= elems:
        raise ValueError(f"non-zero counts must satisfy 1 <= lo <= hi <= elems (got {lo}-{hi} of {elems})")


def count_seed(seed: int, elems: int, count: int) -> int:
    return (seed * _MIX + elems * 1_000_003 + count) % 2 ** 63


def evaluation_set(elems: int, lo: int, hi: int, per_count: int, seed: int, device=None) -> ParityBatch:
    """A fixed set: `per_count` rows for every non-zero count in [lo, hi], in count order.

    Drawn on the CPU (the same rows on every device) from a generator per count seeded by
    (seed, elems, count): the rows of one count are the same whatever range they are part of.
    """
    check_counts(elems, lo, hi)
    parts = []
    for count in range(lo, hi + 1):
        generator = torch.Generator().manual_seed(count_seed(seed, elems, count))
        parts.append(vectors_with_counts(torch.full((per_count,), count), elems, generator))
    x, labels, counts = (torch.cat(column) for column in zip(*parts))
    return ParityBatch(x.to(device), labels.to(device), counts.to(device))


def bucket_sets(elems: int, ranges: Sequence[tuple[int, int]], per_count: int, seed: int,
                device=None) -> list[ParityBatch]:
    """One fixed evaluation set per non-zero-count bucket (lo, hi)."""
    return [evaluation_set(elems, lo, hi, per_count, seed, device) for lo, hi in ranges]


def parse_count_range(text: str, elems: int | None = None) -> tuple[int, int]:
    """'17-32' -> (17, 32); '5' -> (5, 5). Checked against elems when given."""
    lo, sep, hi = text.partition("-")
    try:
        bounds = (int(lo), int(hi) if sep else int(lo))
    except ValueError:
        raise ValueError(f"a count range is LO-HI or N (got {text!r})") from None
    if elems is not None:
        check_counts(elems, *bounds)
    elif not 1 <= bounds[0] <= bounds[1]:
        raise ValueError(f"a count range needs 1 <= LO <= HI (got {text!r})")
    return bounds
