"""`ponder train --deterministic`: deterministic kernels only, and two runs with one seed give one
set of weights."""

import pytest
import torch

from ponder_cli.checkpoint import load_checkpoint


PARITY = ["--task", "parity", "--elems", "6", "--batches-per-epoch", "3", "--hidden", "8", "--max-steps", "3",
          "--epochs", "1", "--batch-size", "32"]


@pytest.mark.parametrize("task", ["mnist", "parity"])
def test_two_deterministic_cpu_runs_with_one_seed_give_identical_checkpoints(task, tiny_mnist, quick, ponder,
                                                                               tmp_path):
    common = [*(quick if task == "mnist" else PARITY), "--seed", "5", "--device", "cpu", "--deterministic",
              "--data-dir", tiny_mnist]
    for name in ("a", "b"):
        result = ponder("train", *common, "--out", tmp_path / name)
        assert result.exit_code == 0, result.output
    first, second = (load_checkpoint(tmp_path / name / "last.pt").model for name in ("a", "b"))
    assert first.keys() == second.keys()
    assert all(torch.equal(first[key], second[key]) for key in first)
    assert not torch.are_deterministic_algorithms_enabled()  # the process is left as it was


def test_deterministic_is_a_training_option_not_a_model_setting(tiny_mnist, quick, ponder, tmp_path):
    result = ponder("train", *quick, "--deterministic", "--data-dir", tiny_mnist, "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "deterministic" not in load_checkpoint(tmp_path / "run" / "best.pt").config.to_dict()
