"""`ponder calibrate --max-loss E --risk D`: the exact binomial bound, fixed-sequence testing of the
candidates from the most steps down, the refusal when none passes, and `--save`, the run's saved
rule that eval, extrapolate, sweep and info then read."""

import dataclasses
import json
import shutil

import pytest
import torch

from ponder_cli.checkpoint import load_checkpoint, save_checkpoint
from ponder_cli.evaluate import RuleOutcome, fixed_sequences, risk_controlled_rule
from ponder_cli.reports import binomial_cdf, clopper_pearson_upper
from ponder_cli.runs import HALTING_FILE


# the bound ------------------------------------------------------------------------------------

@pytest.mark.parametrize("k, n, risk", [(0, 100, 0.1), (3, 5000, 0.1), (15, 5000, 0.05), (0, 5000, 0.1 / 3),
                                        (2, 10, 0.05), (49, 50, 0.1), (400, 50000, 0.1), (2500, 5000, 0.1)])
def test_the_clopper_pearson_bound_is_the_beta_quantile(k, n, risk, scipy_stats):
    assert clopper_pearson_upper(k, n, risk) == pytest.approx(scipy_stats.beta.ppf(1 - risk, k + 1, n - k), rel=1e-9)
    for p in (0.001, 0.003, 0.01, 0.5):
        assert binomial_cdf(k, n, p) == pytest.approx(scipy_stats.binom.cdf(k, n, p), rel=1e-9, abs=1e-300)


def test_the_bound_in_closed_form_where_there_is_one():
    # no loss in n: P(Binomial(n, p) = 0) = (1 - p)^n = D at p = 1 - D^(1/n)
    assert clopper_pearson_upper(0, 1000, 0.1) == pytest.approx(1 - 0.1 ** (1 / 1000), rel=1e-12)
    assert clopper_pearson_upper(0, 1000, 0.1) == pytest.approx(0.0023000, abs=1e-7)
    # every input lost: nothing below 1 can be ruled out
    assert clopper_pearson_upper(7, 7, 0.1) == 1.0
    assert binomial_cdf(5, 5, 0.3) == 1.0 and binomial_cdf(-1, 5, 0.3) == 0.0


# fixed-sequence testing ------------------------------------------------------------------------

def outcome(rule, losses, steps, n=1000):
    return RuleOutcome(rule, n, 0.9, 1 - losses / n, 0.9, steps)


def test_each_family_is_tested_from_its_largest_parameter_down():
    rules = ["quantile:0.5", "confidence:0.9", "quantile:0.9", "median", "patience:1", "confidence:0.99",
             "patience:3", "sample"]
    assert fixed_sequences(rules) == {
        "quantile": ["quantile:0.9", "quantile:0.5", "median"],  # median is quantile:0.5: a tie, as given
        "confidence": ["confidence:0.99", "confidence:0.9"], "patience": ["patience:3", "patience:1"],
        "sample": ["sample"]}


def test_fixed_sequence_stops_at_the_first_failure(scipy_stats):
    # 1000 inputs, max loss 0.003, risk 0.1, one family: 0 losses give the bound 0.0023 (passes),
    # 1 loss 0.00389 (fails: scipy.stats.beta.ppf(0.9, 2, 999))
    outcomes = [outcome("quantile:0.5", 0, 1.5), outcome("quantile:0.9", 0, 4.0), outcome("quantile:0.8", 1, 3.0),
                outcome("quantile:0.7", 0, 2.0)]
    chosen, tests = risk_controlled_rule(outcomes, 0.003, 0.1)
    assert chosen == "quantile:0.9"  # quantile:0.7 and 0.5 lose nothing, but follow the failure: not tested
    assert [(t.halting, t.losses, t.tested, t.passed) for t in tests] == [
        ("quantile:0.9", 0, True, True), ("quantile:0.8", 1, True, False), ("quantile:0.7", 0, False, False),
        ("quantile:0.5", 0, False, False)]
    assert tests[0].bound == pytest.approx(1 - 0.1 ** (1 / 1000), rel=1e-12)
    assert tests[1].bound == pytest.approx(scipy_stats.beta.ppf(0.9, 2, 999), rel=1e-9) and tests[1].bound > 0.003
    assert tests[1].p_value == pytest.approx(scipy_stats.binom.cdf(1, 1000, 0.003), rel=1e-9)
    assert tests[1].p_value > 0.1
    assert all(t.level == 0.1 and t.family == "quantile" for t in tests)


def test_families_share_the_risk_and_the_cheapest_pass_is_chosen():
    # two families: each tested at 0.05; 0 losses in 1000 bound 1 - 0.05^(1/1000) = 0.002991 <= 0.003
    outcomes = [outcome("quantile:0.9", 0, 4.0), outcome("quantile:0.5", 0, 3.0), outcome("confidence:0.99", 0, 2.5),
                outcome("confidence:0.9", 0, 1.5)]
    chosen, tests = risk_controlled_rule(outcomes, 0.003, 0.1)
    assert chosen == "confidence:0.9" and all(t.passed and t.level == 0.05 for t in tests)
    assert tests[0].bound == pytest.approx(1 - 0.05 ** (1 / 1000), rel=1e-12)
    # at 0.0029 none passes, 0 losses included
    assert risk_controlled_rule(outcomes, 0.0029, 0.1)[0] is None


# the command -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fixed_weights(checkpoint):
    """The tiny checkpoint's weights with its heads set: lambda = 1/2 at every step, class 3
    everywhere (every rule agrees with the last step; quantile:0.5 halts at step 1)."""
    state = load_checkpoint(checkpoint)
    weights = dict(state.model)
    for name in ("halting_head.weight", "halting_head.bias", "output_head.weight"):
        weights[name] = torch.zeros_like(weights[name])
    weights["output_head.bias"] = torch.nn.functional.one_hot(torch.tensor(3), 10).float()
    return dataclasses.replace(state, model=weights)


@pytest.fixture
def fixed_run(checkpoint, fixed_weights, tmp_path):
    """A run folder (a copy of the tiny run's) whose best.pt holds the fixed weights."""
    run = tmp_path / "run"
    shutil.copytree(checkpoint.parent, run)
    save_checkpoint(fixed_weights, run / "best.pt")
    return run


def test_calibrate_with_a_risk_chooses_and_reports(fixed_run, tiny_mnist, ponder):
    result = ponder("calibrate", fixed_run, "--data-dir", tiny_mnist, "--max-loss", 0.05, "--risk", 0.1, "-f", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # three families (the default candidates), each at 0.1 / 3; 100 inputs, none differing:
    # bound 1 - (0.1 / 3)^(1 / 100) = 0.03344 <= 0.05 for every candidate
    assert (report["criterion"], report["families"], report["images"]) == ("risk", 3, 100)
    assert report["level"] == pytest.approx(0.1 / 3)
    assert report["chosen"] == "quantile:0.5" and report["chosen_mean_steps"] == 1
    assert report["chosen_bound"] == pytest.approx(1 - (0.1 / 3) ** (1 / 100), rel=1e-12)
    assert [b["halting"] for b in report["buckets"]][:3] == ["quantile:0.99", "quantile:0.95", "quantile:0.9"]
    assert all(b["passed"] and b["losses"] == 0 for b in report["buckets"])
    table = ponder("calibrate", fixed_run, "--data-dir", tiny_mnist, "--max-loss", 0.05, "--risk", 0.1)
    assert table.stdout.splitlines()[-1].startswith("chosen: quantile:0.5 ")
    assert not (fixed_run / HALTING_FILE).exists()  # nothing saved unasked


def test_calibrate_refuses_when_no_candidate_meets_the_bound(fixed_run, tiny_mnist, ponder, one_error_line):
    # 100 inputs cannot bound a loss at 0.01: even none differing gives 0.0334
    result = ponder("calibrate", fixed_run, "--data-dir", tiny_mnist, "--max-loss", 0.01, "--risk", 0.1, "--save")
    line = one_error_line(result)
    assert result.exit_code == 1 and "--max-loss" in line and result.stdout == ""
    assert not (fixed_run / HALTING_FILE).exists()


@pytest.mark.parametrize("args, option", [
    (["--max-loss", "0.01"], "--risk"), (["--risk", "0.1"], "--max-loss"),
    (["--max-loss", "0", "--risk", "0.1"], "--max-loss"), (["--max-loss", "0.01", "--risk", "1"], "--risk"),
    (["--max-loss", "0.01", "--risk", "0.1", "--tolerance", "0.01"], "--tolerance"),
    (["--max-loss", "0.01", "--risk", "0.1", "--angles", "30", "60"], "--angles"),
    (["--max-loss", "0.01", "--risk", "0.1", "--repeats", "2"], "--repeats"),
])
def test_calibrate_refuses_a_bad_risk_setting(args, option, fixed_run, tiny_mnist, ponder, one_error_line):
    result = ponder("calibrate", fixed_run, "--data-dir", tiny_mnist, *args)
    assert option in one_error_line(result) and result.exit_code == 2


def test_save_then_the_evaluating_commands_halt_by_the_saved_rule(fixed_run, fixed_weights, tiny_mnist, ponder):
    saved = ponder("calibrate", fixed_run, "--data-dir", tiny_mnist, "--max-loss", 0.05, "--risk", 0.1, "--save",
                   "-f", "json")
    assert saved.exit_code == 0, saved.output
    record = json.loads((fixed_run / HALTING_FILE).read_text())
    assert (record["halting"], record["checkpoint"], record["criterion"], record["max_loss"], record["risk"],
            record["images"], record["mean_steps"]) == ("quantile:0.5", "best.pt", "risk", 0.05, 0.1, 100, 1)
    assert json.loads(saved.stdout)["saved"] == str(fixed_run / HALTING_FILE)

    for command in ("eval", "extrapolate"):
        result = ponder(command, fixed_run, "--data-dir", tiny_mnist, "-f", "json")
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        assert report["halting"] == "quantile:0.5" and all(b["mean_steps"] == 1 for b in report["buckets"])
        assert "saved rule" in result.stderr
    told = json.loads(ponder("eval", fixed_run, "--data-dir", tiny_mnist, "--halting", "median", "-f", "json").stdout)
    assert told["halting"] == "median"  # --halting says otherwise
    info = json.loads(ponder("info", fixed_run / "best.pt", "-f", "json").stdout)
    assert info["halting_rule"] == "quantile:0.5" and info["saved_halting"]["current"]
    assert "quantile:0.5" in ponder("info", fixed_run / "best.pt").stdout

    # last.pt holds other weights: the rule calibrated on best.pt is not its own
    other = json.loads(ponder("eval", fixed_run / "last.pt", "--data-dir", tiny_mnist, "-f", "json").stdout)
    assert other["halting"] == "sample"
    # best.pt trained on since (new weights): not used, and said so
    weights = {k: v + 0.01 if v.is_floating_point() else v for k, v in fixed_weights.model.items()}
    save_checkpoint(dataclasses.replace(fixed_weights, model=weights), fixed_run / "best.pt")
    result = ponder("eval", fixed_run, "--data-dir", tiny_mnist, "-f", "json")
    assert json.loads(result.stdout)["halting"] == "sample" and "not used" in result.stderr
    assert json.loads(ponder("info", fixed_run / "best.pt", "-f", "json").stdout)["halting_rule"] is None


def test_save_replaces_its_own_rule_and_nothing_else(fixed_run, tiny_mnist, ponder, one_error_line):
    args = ["calibrate", fixed_run, "--data-dir", tiny_mnist, "--save"]
    assert ponder(*args, "--rules", "patience:1", "--tolerance", 0.03).exit_code == 0  # 100 agreeing: bound 0.9737
    assert json.loads((fixed_run / HALTING_FILE).read_text())["halting"] == "patience:1"
    again = ponder(*args, "--max-loss", 0.05, "--risk", 0.1)
    assert again.exit_code == 0 and "replacing patience:1" in again.stderr
    assert json.loads((fixed_run / HALTING_FILE).read_text())["halting"] == "quantile:0.5"
    (fixed_run / HALTING_FILE).write_text('{"mine": 1}\n')  # the user's own file: never replaced
    assert HALTING_FILE in one_error_line(ponder(*args, "--max-loss", 0.05, "--risk", 0.1))
    assert (fixed_run / HALTING_FILE).read_text() == '{"mine": 1}\n'


def test_save_refuses_a_shipped_model_and_a_loose_file(fixed_weights, tmp_path, tiny_mnist, ponder, one_error_line):
    line = one_error_line(ponder("calibrate", "reference", "--save", "--max-loss", 0.05, "--risk", 0.1))
    assert "shipped" in line and "--save" in line
    loose = tmp_path / "loose.pt"
    save_checkpoint(fixed_weights, loose)
    line = one_error_line(ponder("calibrate", loose, "--data-dir", tiny_mnist, "--save", "--max-loss", 0.05,
                                 "--risk", 0.1))
    assert "run folder" in line and not (tmp_path / HALTING_FILE).exists()
