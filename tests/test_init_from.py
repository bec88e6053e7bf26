"""A run started from another's weights (--init-from, a refit: --refit-halting): the digits it
validates and calibrates on are none its source trained on, and a setting means what it says."""

import hashlib
import json

import pytest
import torch

from ponder_cli.api import EvalOptions
from ponder_cli.checkpoint import load_checkpoint
from ponder_cli.config import PonderConfig
from ponder_cli.tasks.mnist import load_mnist, train_val_split
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


def test_init_from_refuses_a_setting_that_changes_what_a_copied_tensor_means(body, checkpoint, runs, ponder,
                                                                              one_error_line, tmp_path):
    source = load_checkpoint(body / "best.pt").config
    other = "state+confidence" if source.method.halting_input != "state+confidence" else "state+turn"
    refused = {
        # the same width on align, another meaning: the turn's weight would be read as the confidence's
        (str(body), "--halting-input", other): "--halting-input",
        (str(checkpoint), "--method", "act"): "--method",  # ACT would keep PonderNet's head
        (str(body), "--align-turn", "45"): "--align-turn",
        # what the copied weights override: the head's bias is the source's, whatever --halting-bias says
        (str(checkpoint), "--halting-bias", "-3"): "--halting-bias",
        # a refit's frozen body runs without dropout; a plain model's one step reads no halting head
        (str(checkpoint), "--refit-halting", "--cnn-dropout", "0.9"): "--cnn-dropout",
        (str(runs / "plain"), "--refit-halting"): "--refit-halting",
    }
    for (model, *args), named in refused.items():
        for printing in ([], ["--print-config"]):  # --print-config refuses what training refuses
            result = ponder("train", "--init-from", model, *args, *printing, "--epochs", "1", "--out",
                            tmp_path / "never")
            line = one_error_line(result)
            assert result.exit_code == 2 and named in line and "--init-from" in line, line
    assert not (tmp_path / "never").exists()
    # where the head starts anew, a new input and a new bias are what it gets
    refit = ponder("train", "--init-from", body, "--refit-halting", "--halting-input", other, "--halting-bias", "-3",
                   "--print-config", "-f", "json")
    assert refit.exit_code == 0, refit.output
    printed = json.loads(refit.stdout)["method"]
    assert printed["halting_input"] == other and printed["halting_bias"] == -3


def test_print_config_refuses_weights_that_do_not_fit_and_names_the_cause(checkpoint, ponder, one_error_line):
    result = ponder("train", "--init-from", checkpoint, "--hidden", "32", "--print-config")
    line = one_error_line(result)
    assert result.exit_code == 2 and "do not fit" in line and "--hidden 32" in line


def test_a_run_from_anothers_weights_reproduces_by_its_command(tiny_mnist, tmp_path, ponder):
    common = ["--max-steps", "3", "--val-size", "100", "--train-size", "100", "--batch-size", "100", "--epochs", "1",
              "--no-progress", "--data-dir", tiny_mnist]
    assert ponder("train", *common, "--halting-bias", "-3", "--out", tmp_path / "a").exit_code == 0
    assert ponder("train", *common, "--init-from", tmp_path / "a", "--out", tmp_path / "b").exit_code == 0
    command = json.loads(ponder("info", tmp_path / "b", "-f", "json").stdout)["train_command"].split()
    assert command[command.index("--halting-bias") + 1] == "-3.0"  # the source's, carried: no refusal
    assert ponder(*command[1:], "--print-config").exit_code == 0
