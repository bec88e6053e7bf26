"""Parity's two layouts (scattered, prefix), the vector steps' two encodings (raw, one-hot) and
the curriculum by progress that looks back: what each draws, reads and saves."""

import json

import torch

from ponder_cli.checkpoint import new_model
from ponder_cli.config import PonderConfig
from ponder_cli.steps.vectors import encoded
from ponder_cli.tasks import get_task
from ponder_cli.tasks.parity import ParityBatches, evaluation_set, parity_batch, vectors_with_counts


def test_prefix_puts_the_non_zeros_first_and_scattered_draws_the_same_stream():
    prefix = parity_batch(256, 12, 1, 12, torch.Generator().manual_seed(3), layout="prefix")
    scattered = parity_batch(256, 12, 1, 12, torch.Generator().manual_seed(3))
    positions = torch.arange(12)
    assert torch.equal(prefix.x != 0, positions < prefix.counts[:, None])  # exactly the first `count`
    assert torch.equal(prefix.counts, scattered.counts)  # the same counts from the same stream
    assert torch.equal((scattered.x != 0).sum(1), scattered.counts)
    assert not torch.equal(prefix.x != 0, scattered.x != 0)
    # the signs of the prefix's entries are the sign coins of their positions
    generator = torch.Generator().manual_seed(3)
    torch.rand(256, generator=generator)
    torch.rand(256, 12, generator=generator)
    signs = torch.rand(256, 12, generator=generator)
    expected = torch.where(positions < prefix.counts[:, None], torch.where(signs < 0.5, 1.0, -1.0), 0.0)
    assert torch.equal(prefix.x, expected)


def test_the_evaluation_sets_of_each_layout_share_counts_and_signs():
    scattered = evaluation_set(16, 3, 6, 8, seed=1)
    prefix = evaluation_set(16, 3, 6, 8, seed=1, layout="prefix")
    assert torch.equal(scattered.counts, prefix.counts)
    assert torch.equal(prefix.x != 0, torch.arange(16) < prefix.counts[:, None])
    assert torch.equal(scattered.x, evaluation_set(16, 3, 6, 8, seed=1).x)  # unchanged by the setting


def test_onehot_shows_each_entry_as_three_indicators():
    x = torch.tensor([[1.0, 0.0, -1.0]])
    assert encoded(x, "onehot").tolist() == [[0, 0, 1, 0, 1, 0, 1, 0, 0]]
    assert encoded(x, "raw") is x
    assert encoded(x, "square").tolist() == [[1, 0, -1, 1, 0, 1]]
    # the count of +1 entries is linear in either: (sum x + sum x^2) / 2
    assert float(encoded(x, "square").sum()) / 2 == 1.0


def test_an_onehot_step_reads_three_inputs_an_entry_and_the_same_input_gives_the_same_answer():
    cfg = PonderConfig.of(task="parity", elems=8, encoding="onehot", hidden=16, max_steps=3)
    model = new_model(cfg)
    assert model.step.cell.weight_ih.shape == (3 * 16, 24)
    x = evaluation_set(8, 1, 8, 2, seed=1).x
    out = model(x)
    assert out.logits.shape == (3, 16, 2)  # (steps, inputs, classes)
    # the one-hot step equals a raw step whose first layer reads the indicators by hand
    torch.testing.assert_close(model.step.start(x, 3)[0][0],
                               torch.nn.functional.linear(encoded(x, "onehot"), model.step.cell.weight_ih,
                                                          model.step.cell.bias_ih))
    rnn = new_model(PonderConfig.of(task="parity", elems=8, step="rnn", encoding="onehot", hidden=16, max_steps=3))
    assert rnn.step.from_input.in_features == 24


def test_the_layout_and_encoding_are_saved_with_the_model_and_reread(tmp_path, ponder):
    run = tmp_path / "run"
    result = ponder("train", "--task", "parity", "--elems", "6", "--layout", "prefix", "--encoding", "onehot",
                    "--epochs", "1", "--batches-per-epoch", "3", "--batch-size", "16", "--hidden", "8",
                    "--max-steps", "2", "--out", str(run), "-q")
    assert result.exit_code == 0, result.output
    evaluated = ponder("eval", str(run), "--counts", "1-6", "--limit", "4", "-f", "json")
    assert evaluated.exit_code == 0, evaluated.output
    meta = json.loads(evaluated.stdout)
    assert (meta["layout"], meta["encoding"]) == ("prefix", "onehot")
    shown = ponder("info", str(run))
    assert "prefix" in shown.stdout and "onehot" in shown.stdout


def test_a_prefix_run_on_part_of_the_counts_says_where_its_non_zeros_never_were():
    cfg = PonderConfig.of(task="parity", elems=16, train_counts="1-8", layout="prefix")
    assert "past position 8" in get_task(cfg).view().trained_on
    assert "past position" not in get_task(PonderConfig.of(task="parity", elems=16, train_counts="1-8")).view().trained_on


def test_the_curriculum_by_progress_rises_only_once_the_counts_up_to_its_top_are_learnt():
    cfg = PonderConfig.of(task="parity", elems=16, batch_size=256, curriculum_advance=0.9, curriculum_start=4)
    source = ParityBatches(cfg, "cpu")
    source.stage(0)
    assert int((source.batch()[0] != 0).sum(1).max()) == 4
    counts = torch.arange(1, 17).repeat_interleave(10)
    wrong_above = counts > 4  # learnt up to 4, nothing above
    source.advance(counts, ~wrong_above)
    assert source.level == 6  # raised by an eighth of 1-16
    source.advance(counts, ~wrong_above)  # 5 and 6 not learnt: it waits
    assert source.level == 6
    state = source.state()
    resumed = ParityBatches(cfg, "cpu")
    resumed.load_state(state)
    assert resumed.level == 6
    resumed.advance(counts, torch.ones_like(counts, dtype=torch.bool))
    assert resumed.level == 8
    for _ in range(10):
        resumed.advance(counts, torch.ones_like(counts, dtype=torch.bool))
    assert resumed.level == 16  # never past the range


def test_looking_back_draws_a_share_from_the_whole_range():
    generator = torch.Generator().manual_seed(5)
    top = torch.tensor(4)
    mixed = parity_batch(20_000, 16, 1, 16, generator, mix=0.25, top=top)
    above = (mixed.counts > 4).double().mean()
    # a quarter drawn from 1-16, of which 12/16 above 4: about 0.1875 of the rows
    assert abs(float(above) - 0.25 * 12 / 16) < 0.015
    assert mixed.counts.max() <= 16 and mixed.counts.min() >= 1
    plain = parity_batch(64, 16, 1, 16, torch.Generator().manual_seed(5), top=top)
    again = parity_batch(64, 16, 1, 16, torch.Generator().manual_seed(5), mix=0.0, top=top)
    assert torch.equal(plain.x, again.x) and int(plain.counts.max()) <= 4


def test_the_curricula_are_one_or_the_other_and_the_mix_needs_one(ponder, one_error_line):
    for extra in (["--curriculum", "5", "--curriculum-advance", "0.9"], ["--curriculum-mix", "0.2"]):
        result = ponder("train", "--task", "parity", "--elems", "8", *extra, "--print-config")
        assert result.exit_code == 2
        one_error_line(result)
