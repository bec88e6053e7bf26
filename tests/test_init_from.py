"""A run started from another's weights (--init-from, a refit: --refit-halting): the digits it
validates and calibrates on are none its source trained on, and a setting means what it says."""

import hashlib
import json

import pytest
import torch

from ponder_cli.api import EvalOptions
from ponder_cli.checkpoint import load_checkpoint
from ponder_cli.config import PonderConfig
from ponder_cli.data import load_mnist, train_val_split
from ponder_cli.tasks import get_task

BODY = ["--step", "align", "--max-steps", "3", "--hidden", "16", "--hidden-cnn", "16", "--val-size", "100",
        "--train-size", "300", "--batch-size", "100", "--epochs", "1", "--no-progress"]
# docs/halting.md's refit recipe, small
REFIT = ["--refit-halting", "--halting-target", "final", "--halting-input", "state+answer", "--turn-gate", "0",
         "--truncation", "0", "--epochs", "1", "--train-size", "200", "--lr", "0.05", "--no-progress"]


def _digits(images) -> set:
    return {hashlib.sha1(image.numpy().tobytes()).hexdigest() for image in images.images}


@pytest.fixture(scope="module")
def body(tiny_mnist, tmp_path_factory, ponder):
    """A one-epoch align run at the default seed (1234), 100 digits held out."""
    out = tmp_path_factory.mktemp("body")
    result = ponder("train", *BODY, "--data-dir", tiny_mnist, "--out", out)
    assert result.exit_code == 0, result.output
    return out


def test_a_refit_with_another_seed_validates_and_calibrates_on_digits_its_body_never_trained_on(
        body, tiny_mnist, tmp_path, ponder):
    assert len(_digits(load_mnist(tiny_mnist, train=True))) == 700  # every digit told apart by its pixels
    result = ponder("train", "--init-from", body, *REFIT, "--seed", "1", "--data-dir", tiny_mnist,
                    "--out", tmp_path / "refit")
    assert result.exit_code == 0, result.output
    body_cfg, refit_cfg = load_checkpoint(body / "best.pt").config, load_checkpoint(tmp_path / "refit" / "last.pt").config
    body_trained, _ = get_task(body_cfg).load_training(tiny_mnist, False)
    head_trained, validated = get_task(refit_cfg).load_training(tiny_mnist, False)
    calibrated = get_task(refit_cfg).calibration_data(EvalOptions(data_dir=tiny_mnist, download=False), "cpu")
    assert len(validated) == len(calibrated) == 100
    overlap = len(_digits(validated) & _digits(body_trained))
    assert overlap == 0, overlap
    assert len(_digits(calibrated) & (_digits(body_trained) | _digits(head_trained))) == 0
    assert refit_cfg.training.seed == 1 and refit_cfg.task.split_seed == 1234  # the body's split, the refit's seed
    # the body's own held-out digits are the refit's: what it chose its best epoch on, none a weight saw
    assert _digits(validated) == _digits(train_val_split(load_mnist(tiny_mnist, train=True), val_size=100,
                                                         train_size=300, seed=1234)[1])
    # a refit of the refit keeps the same split, whatever its seed
    again = ponder("train", "--init-from", tmp_path / "refit" / "last.pt", "--epochs", "1", "--seed", "9",
                   "--print-config", "-f", "json")
    assert json.loads(again.stdout)["task"]["split_seed"] == 1234


def test_a_fresh_run_keeps_its_seeds_split(tiny_mnist, ponder):
    printed = json.loads(ponder("train", "--seed", "7", "--print-config", "-f", "json").stdout)
    assert "split_seed" not in printed["task"]  # none: the run's seed splits, as before
    fresh = PonderConfig.of(seed=7, val_size=100)
    train_set, val_set = get_task(fresh).load_training(tiny_mnist, False)
    expected = train_val_split(load_mnist(tiny_mnist, train=True), val_size=100, train_size=0, seed=7)
    assert torch.equal(val_set.images, expected[1].images) and torch.equal(train_set.images, expected[0].images)


def test_init_from_refuses_a_split_that_would_validate_on_trained_digits(body, tiny_mnist, tmp_path, ponder,
                                                                         one_error_line):
    for extra, named in ((["--val-size", "150"], "--val-size"), (["--split-seed", "1"], "--split-seed")):
        for printing in ([], ["--print-config"]):
            result = ponder("train", "--init-from", body, *REFIT, "--seed", "1", *extra, *printing,
                            "--data-dir", tiny_mnist, "--out", tmp_path / "no")
            line = one_error_line(result)
            assert result.exit_code == 2 and named in line and "--init-from" in line
    assert not (tmp_path / "no").exists()
    # fewer held-out digits are the body's held-out digits still
    fewer = ponder("train", "--init-from", body, *REFIT, "--seed", "1", "--val-size", "60", "--data-dir", tiny_mnist,
                   "--out", tmp_path / "fewer")
    assert fewer.exit_code == 0, fewer.output
    refit_cfg = load_checkpoint(tmp_path / "fewer" / "last.pt").config
    body_trained, _ = get_task(load_checkpoint(body / "best.pt").config).load_training(tiny_mnist, False)
    _, validated = get_task(refit_cfg).load_training(tiny_mnist, False)
    assert len(validated) == 60 and not _digits(validated) & _digits(body_trained)
