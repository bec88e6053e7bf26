"""The parity task's data: labels are the parity of the +1 entries, counts and positions as
asked, everything reproducible from explicit generators."""

import math

import pytest
import torch

from ponder_cli import PonderError
from ponder_cli.config import PonderConfig
from ponder_cli.model import get_method
from ponder_cli.tasks.declared import CLASSES
from ponder_cli.tasks.parity import evaluation_set, parity_batch, parity_labels, parse_count_range, vectors_with_counts


def test_labels_are_the_parity_of_the_plus_ones_not_of_the_non_zeros():
    x = torch.tensor([
        [1.0, -1.0, 0.0, 0.0],   # 2 non-zeros (even), one +1 (odd): label 1
        [1.0, 1.0, -1.0, 0.0],   # 3 non-zeros (odd), two +1 (even): label 0
        [-1.0, -1.0, -1.0, 0.0],  # 3 non-zeros, no +1: label 0
        [1.0, 1.0, 1.0, -1.0],   # 4 non-zeros, three +1: label 1
        [0.0, 0.0, 0.0, 0.0],    # nothing at all: label 0
    ])
    assert parity_labels(x).tolist() == [1, 0, 0, 1, 0]
    assert parity_labels(x).dtype == torch.long


def test_a_batch_has_the_counts_values_and_labels_it_claims():
    batch = parity_batch(512, 16, 3, 9, torch.Generator().manual_seed(5))
    assert batch.x.shape == (512, 16) and batch.x.dtype == torch.float32
    assert set(batch.x.unique().tolist()) == {-1.0, 0.0, 1.0}
    assert torch.equal((batch.x != 0).sum(1), batch.counts)
    assert batch.counts.min() == 3 and batch.counts.max() == 9
    by_hand = [sum(1 for v in row if v == 1.0) % 2 for row in batch.x.tolist()]
    assert batch.labels.tolist() == by_hand


def test_positions_are_the_first_count_slots_of_a_random_permutation_and_signs_fair_coins():
    counts = torch.tensor([1, 3, 5])
    generator = torch.Generator().manual_seed(11)
    keys, signs = torch.rand(3, 5, generator=generator), torch.rand(3, 5, generator=generator)
    batch = vectors_with_counts(counts, keys, signs)
    # redone by hand: uniforms -> permutation -> the first `count` positions
    order, plus = keys.argsort(dim=1), signs < 0.5
    for row, count in enumerate(counts.tolist()):
        chosen = set(order[row, :count].tolist())
        assert {i for i in range(5) if batch.x[row, i] != 0} == chosen
        for i in chosen:
            assert batch.x[row, i] == (1.0 if plus[row, i] else -1.0)
    assert (batch.x[2] != 0).all()  # count = elems: every entry set


def test_draws_are_reproducible_by_seed_and_leave_the_global_stream_alone():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    a = parity_batch(64, 32, 1, 32, torch.Generator().manual_seed(7))
    b = parity_batch(64, 32, 1, 32, torch.Generator().manual_seed(7))
    c = parity_batch(64, 32, 1, 32, torch.Generator().manual_seed(8))
    assert torch.equal(a.x, b.x) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.x, c.x)
    assert torch.equal(torch.get_rng_state(), before)


def test_counts_positions_signs_and_labels_are_uniform():
    generator = torch.Generator().manual_seed(3)
    batch = parity_batch(40_000, 8, 1, 4, generator)
    # counts 1..4: 10,000 each expected, sd ~87
    assert (batch.counts.bincount(minlength=5)[1:] - 10_000).abs().max() < 500
    single = vectors_with_counts(torch.ones(40_000, dtype=torch.long), torch.rand(40_000, 8, generator=generator),
                                 torch.rand(40_000, 8, generator=generator))
    # one non-zero among 8 slots: 5,000 per slot expected, sd ~66
    assert ((single.x != 0).sum(0) - 5_000).abs().max() < 350
    nonzero = batch.x[batch.x != 0]
    assert abs(float((nonzero == 1).float().mean()) - 0.5) < 0.01
    assert abs(float(batch.labels.float().mean()) - 0.5) < 0.01


def test_evaluation_sets_are_fixed_by_seed_and_independent_of_the_range_asked_for():
    wide = evaluation_set(16, 3, 6, 10, seed=1)
    assert wide.counts.tolist() == [c for c in range(3, 7) for _ in range(10)]
    assert torch.equal(wide.x, evaluation_set(16, 3, 6, 10, seed=1).x)
    alone = evaluation_set(16, 5, 5, 10, seed=1)
    assert torch.equal(wide.x[20:30], alone.x)  # count 5's rows, whatever else is in the set
    assert not torch.equal(alone.x, evaluation_set(16, 5, 5, 10, seed=2).x)
    buckets = [evaluation_set(16, lo, hi, 4, seed=1) for lo, hi in [(1, 8), (9, 16)]]
    assert [b.counts.unique().tolist() for b in buckets] == [list(range(1, 9)), list(range(9, 17))]
    smaller = evaluation_set(16, 3, 6, 4, seed=1)  # --limit 4: each count's first rows of the larger set
    assert torch.equal(smaller.x, torch.cat([wide.x[i * 10:i * 10 + 4] for i in range(4)]))
    assert torch.equal(smaller.labels, parity_labels(smaller.x)) and (smaller.x != 0).sum(1).tolist() == \
        smaller.counts.tolist()


def test_count_ranges_parse_and_refuse_what_cannot_be_drawn():
    assert parse_count_range("17-32", elems=32) == (17, 32)
    assert parse_count_range("5", elems=16) == (5, 5)
    for bad in ("0-3", "5-3", "1-20", "a-b", "0", "3-"):
        with pytest.raises(PonderError):
            parse_count_range(bad, 16)
    with pytest.raises(ValueError):
        parity_batch(4, 8, 0, 8, torch.Generator())


def test_the_two_logit_head_is_the_papers_sigmoid_unit_in_pondernets_loss_and_predictions():
    """The paper's one logistic unit with logit d gives class 1 the probability sigmoid(d) and
    the loss BCE(d); PonderNet's loss and predictions on two logits (a, b) give the same with
    d = b - a."""
    cfg = PonderConfig.of(task="parity", max_steps=2)
    method = get_method(cfg)
    # d = ln 3 and d = -ln 3 (logits shifted by 1: only the difference counts), the same at both
    # steps so that the loss does not depend on where halting puts its mass
    row_logits = torch.tensor([[0.0, math.log(3)], [math.log(3) + 1, 1.0]])
    logits = row_logits.expand(2, 2, CLASSES)  # (steps, B, classes)
    lambda_logits = torch.zeros(2, 2)  # lambda = 1/2: the median rule halts at step 1
    targets = torch.tensor([1, 1])
    # sigmoid(ln 3) = 3/4, sigmoid(-ln 3) = 1/4; BCE for class 1: ln(4/3) and ln 4
    reconstruction = method.loss(logits, lambda_logits, targets).reconstruction
    assert math.isclose(float(reconstruction), (math.log(4 / 3) + math.log(4)) / 2, rel_tol=1e-6)
    scores, steps = method.predict(logits, lambda_logits, torch.zeros(2, 2), "median")
    assert steps.tolist() == [1, 1] and scores.argmax(1).tolist() == [1, 0]
    probabilities = method.probabilities(scores, "median")[:, 1]
    assert torch.allclose(probabilities, torch.tensor([0.75, 0.25]), atol=1e-7)
