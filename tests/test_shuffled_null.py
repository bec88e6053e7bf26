"""The controls beside the best fixed policy in --detail and compare: the shuffled-halting null (the
same halting steps dealt to a bucket's inputs at random) with adapting minus it and its standard
error, and the premature and late halts."""

import dataclasses
import json

import pytest
import torch

from ponder_cli.checkpoint import load_checkpoint, save_checkpoint
from ponder_cli.evaluate import EvalSamples, shuffled_null, uncertainty
from ponder_cli.registry import SHUFFLES


def test_equal_halting_steps_leave_nothing_to_shuffle():
    right = torch.rand(6, 500, generator=torch.Generator().manual_seed(1)) < 0.7
    steps = torch.full((500,), 4.0, dtype=torch.float64)
    correct = right[3]
    shuffled, controls = shuffled_null(right, steps, correct)
    assert controls["shuffled_accuracy"] == float(correct.double().mean())
    assert controls["adapting_minus_shuffled"] == 0.0
    assert torch.equal(shuffled, correct.double())


def test_premature_and_late_halts_on_a_hand_made_bucket():
    # rows: steps 1..3; columns: inputs; each input's halting step below
    right = torch.tensor([[False, True, True, True],
                          [True, False, False, True],
                          [True, False, True, True]])
    steps = torch.tensor([1.0, 3.0, 2.0, 1.0], dtype=torch.float64)
    correct = right[steps.long() - 1, torch.arange(4)]  # False, False, False, True
    _, controls = shuffled_null(right, steps, correct)
    # input 0: wrong at step 1, right at the last: premature (nothing before step 1: not late)
    # input 1: wrong at step 3 (the last), right at step 1: late
    # input 2: wrong at step 2, right at step 1 and at the last: both; input 3: right where it halted
    assert (controls["premature_halts"], controls["late_halts"]) == (2 / 4, 2 / 4)


def test_halting_that_adapts_beats_its_shuffled_null():
    # each input right at its own halting step alone, half at step 1 and half at step 2: adapting is
    # right everywhere; dealt a step at random, an input is right when it is dealt its own (1/2)
    count = 4000
    steps = torch.tensor([1.0, 2.0], dtype=torch.float64).repeat(count // 2)
    right = torch.stack([steps == 1, steps == 2])
    shuffled, controls = shuffled_null(right, steps, torch.ones(count, dtype=torch.bool))
    assert controls["shuffled_accuracy"] == pytest.approx(0.5, abs=0.01)
    assert controls["adapting_minus_shuffled"] == 1 - controls["shuffled_accuracy"]
    # the null's expectation over every permutation: the step shares times the per-step accuracies
    shares = torch.bincount(steps.long() - 1).double() / count
    expected = float((shares * right.double().mean(dim=1)).sum())  # 0.5 * 0.5 + 0.5 * 0.5
    assert expected == 0.5 and controls["shuffled_accuracy"] == pytest.approx(expected, abs=0.01)
    again, _ = shuffled_null(right, steps, torch.ones(count, dtype=torch.bool))
    assert torch.equal(again, shuffled)  # seeded: the same permutations every time
    # its standard error, input by input: each difference is 1 - (share of SHUFFLES dealt its own)
    samples = EvalSamples(torch.zeros(count), steps, torch.ones(count, dtype=torch.bool), shuffled)
    differences = 1 - shuffled
    assert uncertainty([samples])["adapting_minus_shuffled_se"] == pytest.approx(
        float(differences.std()) / count ** 0.5, rel=1e-9)
    assert "adapting_minus_shuffled_se" not in uncertainty([dataclasses.replace(samples, shuffled=None)])


@pytest.fixture(scope="module")
def fixed_model(checkpoint, tmp_path_factory):
    """The tiny checkpoint with its heads set: lambda = 1/2 at every step, class 3 everywhere."""
    state = load_checkpoint(checkpoint)
    weights = dict(state.model)
    for name in ("halting_head.weight", "halting_head.bias", "output_head.weight"):
        weights[name] = torch.zeros_like(weights[name])
    weights["output_head.bias"] = torch.nn.functional.one_hot(torch.tensor(3), 10).float()
    path = tmp_path_factory.mktemp("fixed") / "fixed.pt"
    save_checkpoint(dataclasses.replace(state, model=weights), path)
    return path


def test_detail_reports_the_controls(fixed_model, tiny_mnist, ponder):
    # quantile:0.5 halts every input at step 1 (lambda = 1/2): the null is the rule itself
    args = ["eval", fixed_model, "--data-dir", tiny_mnist, "--halting", "quantile:0.5", "-f", "json"]
    report = json.loads(ponder(*args, "--detail").stdout)
    bucket = report["buckets"][0]
    assert bucket["shuffled_accuracy"] == bucket["accuracy"] and bucket["adapting_minus_shuffled"] == 0
    assert bucket["adapting_minus_shuffled_se"] == 0 and bucket["premature_halts"] == bucket["late_halts"] == 0
    assert list(bucket)[-5:] == ["shuffled_accuracy", "adapting_minus_shuffled", "adapting_minus_shuffled_se",
                                 "premature_halts", "late_halts"]  # after every key there was before
    plain = json.loads(ponder(*args).stdout)["buckets"][0]
    assert not {"shuffled_accuracy", "premature_halts", "adapting_minus_shuffled_se"} & set(plain)
    table = ponder(*args[:-2], "--detail").stdout
    assert "Controls" in table and f"mean of {SHUFFLES}" in table
    csv_header = ponder(*args[:-2], "--detail", "-f", "csv").stdout.splitlines()[0]
    assert csv_header.endswith("shuffled_accuracy,adapting_minus_shuffled,adapting_minus_shuffled_se,"
                               "premature_halts,late_halts")


def test_compare_reports_the_controls_and_act_has_none(runs, tiny_mnist, ponder):
    result = ponder("compare", runs / "pn1", runs / "act", "--data-dir", tiny_mnist, "--angles", 45, "-f", "json")
    assert result.exit_code == 0, result.output
    by_method = {b["method"]: b for b in json.loads(result.stdout)["buckets"]}
    pn, act = by_method["pondernet"], by_method["act"]
    assert pn["adapting_minus_shuffled"] == pytest.approx(pn["accuracy"] - pn["shuffled_accuracy"])
    assert 0 <= pn["premature_halts"] <= 1 and pn["adapting_minus_shuffled_se"] > 0
    # ACT predicts from the p-weighted mean of its steps, not its halting step's answer: no null
    assert act["shuffled_accuracy"] is None and act["premature_halts"] is None
    args = ["compare", runs / "pn1", runs / "act", "--data-dir", tiny_mnist, "--angles", 45]
    assert "Controls" in ponder(*args, "--detail").stdout and "Controls" not in ponder(*args).stdout
