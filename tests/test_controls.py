"""The controls of an evaluation: the fixed budget `--halting fixed:N` (every input stops at step
N), `--max-steps N` (a model run for other steps than it trained with), and beside a halting
rule the accuracy of a fixed budget at the same mean steps."""

import csv
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from ponder_cli.api import EvalOptions, evaluate_checkpoint
from ponder_cli.checkpoint import load_model
from ponder_cli.config import PonderConfig
from ponder_cli.tasks.mnist import evaluate, load_mnist
from ponder_cli.evaluate import evaluate_bucket
from ponder_cli.model import FixedBudget, get_method, halting_steps, rule_of
from ponder_cli.checkpoint import new_model
from ponder_cli.registry import HaltingRule, parse_halting_rule
from ponder_cli.reports.evaluation import best_fixed_accuracy
from ponder_cli.tasks import get_task

DATA_DIR = os.environ.get("PONDER_DATA_DIR")
REAL_MNIST = bool(DATA_DIR) and (Path(DATA_DIR) / "MNIST" / "raw" / "t10k-images-idx3-ubyte").exists()
needs_mnist = [pytest.mark.mnist, pytest.mark.skipif(not REAL_MNIST, reason="real MNIST not found")]


# the spelling ----------------------------------------------------------------------------------

def test_fixed_is_a_halting_rule_with_a_whole_number_of_steps():
    assert parse_halting_rule("fixed:4") == HaltingRule("fixed", 4, "fixed:4")
    assert parse_halting_rule(" Fixed:12 ").budget == 12
    assert parse_halting_rule("median").budget is None and parse_halting_rule("patience:3").budget is None
    assert parse_halting_rule("fixed:4").halts_at_one_step and parse_halting_rule("fixed:4").quantile is None


@pytest.mark.parametrize("text", ["fixed:0", "fixed:-2", "fixed:2.5", "fixed:four",
                                  "fixed:²",  # a digit to str.isdigit, not to int
                                  "fixed"])
def test_a_bad_budget_is_one_error_line(text, ponder, error):
    named = [repr(text.removeprefix("fixed:")) if ":" in text else repr(text), "fixed:N", "N >= 1"]
    with pytest.raises(ValueError) as caught:
        parse_halting_rule(text)
    assert all(part in str(caught.value) for part in named), str(caught.value)
    for command in ("eval", "extrapolate", "sweep", "compare reference"):
        error(ponder(*command.split(), "--halting", text), 2, "--halting", *named)


# the two forms of the rule ----------------------------------------------------------------------

def test_the_batch_and_early_exit_forms_stop_every_input_at_step_n(drive):
    torch.manual_seed(0)
    logits, lambda_logits = torch.randn(5, 7, 3), torch.randn(5, 7) * 4  # halting would differ per row
    for n in range(1, 6):
        rule = parse_halting_rule(f"fixed:{n}")
        assert isinstance(rule_of(rule), FixedBudget) and rule_of(rule).step == n
        steps, chosen = halting_steps(rule_of(rule), logits, lambda_logits)
        assert torch.equal(steps, torch.full((7,), n)) and torch.equal(chosen, logits[n - 1])
        assert drive(rule_of(rule, torch.rand(5, 7)), logits, lambda_logits).tolist() == [n] * 7
    with pytest.raises(ValueError, match="fixed:6 stops at step 6, beyond the 5 steps run"):
        halting_steps(rule_of("fixed:6"), logits, lambda_logits)
    with pytest.raises(ValueError, match="fixed:6 stops at step 6, beyond the 5 steps run"):
        drive(rule_of("fixed:6", torch.rand(5, 7)), logits, lambda_logits)


def test_only_a_budget_is_a_budget():
    assert not any(isinstance(rule_of(rule, torch.rand(2, 3)), FixedBudget)
                   for rule in ("median", "sample", "patience:2", "confidence:0.9", "threshold:0.5"))
    assert rule_of("Fixed:2").step == 2


def test_a_budget_beyond_the_steps_a_model_runs_is_refused():
    cfg = PonderConfig.of(max_steps=5)
    problem = get_method(cfg).halting_problem("fixed:6")
    assert problem == "--halting fixed:6 stops at step 6, beyond the 5 steps this pondernet model runs " \
                      "(--max-steps runs more)"
    assert get_method(cfg).halting_problem("fixed:5") is None
    act = PonderConfig.of(method="act", max_steps=5)
    assert "fixed:6" in get_method(act).halting_problem("fixed:6") and get_method(act).halting_problem("fixed:5") is None
    assert get_method(act).halting_label("fixed:3") == "fixed:3" and get_method(act).halting_label("median") == "act"


def test_the_early_exit_loop_stops_every_image_at_the_budget_and_reads_that_step():
    cfg = PonderConfig.of(max_steps=6, hidden=16, hidden_cnn=16, hidden_lin=16)
    torch.manual_seed(1)
    model = new_model(cfg).eval()
    x = torch.randn(9, 1, 28, 28)
    out = model(x)
    for n in (1, 3, 6):
        prediction, steps = model.infer(x, rule_of(parse_halting_rule(f"fixed:{n}"), torch.rand(6, 9)))
        assert steps.tolist() == [n] * 9
        assert torch.equal(prediction.argmax(1), out.logits[n - 1].argmax(1))


# its accuracy is the per-step accuracy, exactly ---------------------------------------------------

@pytest.mark.parametrize("run", ["pn1", "act"])
def test_a_fixed_budget_is_exactly_the_per_step_accuracy_of_detail(run, runs, tiny_mnist):
    """fixed:N's accuracy equals --detail's accuracy at step N, under the early exit (the CPU's)
    and the full forward (a GPU's), for PonderNet and ACT alike."""
    model, cfg, _ = load_model(runs / run / "best.pt", "cpu")
    data = load_mnist(tiny_mnist, train=False, download=False)
    detail = evaluate(model, data, cfg, max_angle=90, seed=9, batch_size=64, detail=True)
    per_step = detail.accuracy_at_step
    assert len(per_step) == 5 and len(set(per_step)) > 1  # the steps differ: the test can tell them apart
    for n in range(1, 6):
        for early_exit in (True, False):
            fixed = evaluate(model, data, cfg, max_angle=90, seed=9, batch_size=64, halting=f"fixed:{n}",
                             early_exit=early_exit)
            assert fixed.accuracy == per_step[n - 1], (n, early_exit)
            assert fixed.mean_steps == n and fixed.std_steps == 0
            assert fixed.histogram == tuple(200 if k == n else 0 for k in range(1, 6))


def test_plain_halts_at_its_one_step_and_refuses_a_budget_beyond_it(runs, tiny_mnist, ponder, error):
    model, cfg, _ = load_model(runs / "plain" / "best.pt", "cpu")
    data = load_mnist(tiny_mnist, train=False, download=False)
    one = evaluate(model, data, cfg, max_angle=45, seed=9, halting="fixed:1")
    assert one == evaluate(model, data, cfg, max_angle=45, seed=9)
    problem = get_method(cfg).halting_problem("fixed:2")
    assert "fixed:2" in problem and "1 step" in problem and get_method(cfg).halting_problem("fixed:1") is None
    line = error(ponder("eval", runs / "plain", "--halting", "fixed:2", "--data-dir", tiny_mnist), 2,
                 "--halting fixed:2", "1 step", "plain")
    assert line == f"Error: {problem}"  # the library's reason, as the CLI's one line


def test_act_takes_a_fixed_budget_and_refuses_every_other_rule(runs, tiny_mnist, ponder, error):
    result = ponder("extrapolate", runs / "act", "--halting", "fixed:3", "--angles", "45", "--data-dir", tiny_mnist,
                    "-f", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["halting"] == "fixed:3" and report["buckets"][0]["mean_steps"] == 3.0
    # its own rule beside the best fixed budget: the caption says that a budget is a weak control for ACT
    table = ponder("extrapolate", runs / "act", "--angles", "45", "--detail", "--data-dir", tiny_mnist).stdout
    assert "best fixed ≤ steps" in table and "weak control" in " ".join(table.split())
    error(ponder("extrapolate", runs / "act", "--halting", "median", "--data-dir", tiny_mnist), 2, "--halting median",
          "act", "fixed:N")


@pytest.mark.parametrize("args, named", [  # the option and value given, and the steps the model runs
    (["--halting", "fixed:6"], ["--halting fixed:6", "5 steps", "--max-steps"]),
    (["--max-steps", "7", "--halting", "fixed:8"], ["--halting fixed:8", "7 steps", "--max-steps"]),
    (["--max-steps", "0"], ["--max-steps", "0", "100"]),
    (["--max-steps", "-3"], ["--max-steps", "-3", "100"]),
    (["--max-steps", "101"], ["--max-steps", "101", "100"]),
    (["--max-steps", "many"], ["--max-steps", "'many'"]),
])
def test_budgets_and_step_counts_out_of_range_are_one_error_line(args, named, runs, tiny_mnist, ponder, error):
    for command in ("eval", "extrapolate", "sweep", "calibrate", "compare"):
        given = ["--rules" if a == "--halting" and command == "calibrate" else a for a in args]
        result = ponder(command, runs / "pn1", *given, "--data-dir", tiny_mnist)
        error(result, 2, *[n.replace("--halting", "--rules") if command == "calibrate" else n for n in named])


def test_max_steps_refused_by_a_one_step_model_and_kept_by_it_in_compare(runs, tiny_mnist, ponder, error):
    error(ponder("eval", runs / "plain", "--max-steps", "4", "--data-dir", tiny_mnist), 2, "--max-steps", "plain")
    result = ponder("compare", runs / "pn1", runs / "plain", "--max-steps", "8", "--angles", "45", "--data-dir",
                    tiny_mnist, "-f", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["max_steps"] == 8
    assert {b["method"]: b["max_steps"] for b in report["buckets"]} == {"pondernet": 8, "plain": 1}
    assert report["trained_max_steps"] == {str(runs / "pn1" / "best.pt"): 5, str(runs / "plain" / "best.pt"): 1}


# --max-steps -----------------------------------------------------------------------------------

def test_more_steps_than_trained_run_the_same_first_steps_and_move_the_last_steps_mass_on(runs, tiny_mnist):
    """Run for 8 steps, a 5-step model computes the same first five steps (the step function
    does not know how many follow); step 5's halting is no longer forced, so some inputs go on."""
    five, cfg5, _ = load_model(runs / "pn1" / "best.pt", "cpu")
    eight, cfg8, state = load_model(runs / "pn1" / "best.pt", "cpu", 8)
    assert (five.max_steps, eight.max_steps, cfg8.method.max_steps, state.config.method.max_steps) == (5, 8, 8, 5)
    assert cfg8.replace(max_steps=5) == cfg5  # nothing else changed
    data = load_mnist(tiny_mnist, train=False, download=False)
    a = evaluate(five, data, cfg5, max_angle=90, seed=9, detail=True)
    b = evaluate(eight, data, cfg8, max_angle=90, seed=9, detail=True)
    assert b.accuracy_at_step[:5] == a.accuracy_at_step and len(b.accuracy_at_step) == 8
    assert len(b.histogram) == 8 and sum(b.histogram) == 200
    # the same coins for the first five steps: an input halting before step 5 halts where it did
    assert b.histogram[:4] == a.histogram[:4] and a.histogram[4] == sum(b.histogram[4:])
    assert sum(b.histogram[5:]) > 0 and b.mean_steps > a.mean_steps
    # the batch form and the early exit agree past the trained steps too
    assert evaluate(eight, data, cfg8, max_angle=90, seed=9, early_exit=False) == \
        evaluate(eight, data, cfg8, max_angle=90, seed=9, early_exit=True)


def test_max_steps_on_every_evaluating_command(runs, tiny_mnist, ponder, tmp_path):
    common = ["--max-steps", "9", "--data-dir", tiny_mnist, "-f", "json"]
    reports = {}
    for command in (["eval"], ["extrapolate", "--detail"], ["sweep", "--every", "90"], ["calibrate"],
                    ["compare", runs / "pn2"]):
        result = ponder(command[0], runs / "pn1", *command[1:], *common)
        assert result.exit_code == 0, (command, result.output)
        reports[command[0]] = json.loads(result.stdout)
        assert reports[command[0]]["max_steps"] == 9, command
    for name in ("eval", "extrapolate", "sweep", "calibrate"):
        assert reports[name]["trained_max_steps"] == 5
    for name in ("eval", "extrapolate", "sweep"):
        assert all(len(b["histogram"]) == 9 for b in reports[name]["buckets"])
    assert all(len(b["accuracy_at_step"]) == 9 for b in reports["extrapolate"]["buckets"])
    np.save(tmp_path / "two.npy", np.zeros((2, 28, 28), dtype=np.uint8))
    result = ponder("predict", runs / "pn1", tmp_path / "two.npy", "--max-steps", "9", "--steps", "--halting",
                    "fixed:7", "-f", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["max_steps"], report["trained_max_steps"]) == (9, 5)
    assert [b["halting_step"] for b in report["buckets"]] == [7, 7] and len(report["buckets"][0]["steps"]) == 9
    table = ponder("eval", runs / "pn1", "--max-steps", "9", "--data-dir", tiny_mnist).stdout
    assert "run to 9 steps (--max-steps; trained with 5)" in table and "halting steps 1→9" in table


# a fixed budget at the same mean steps -----------------------------------------------------------

def test_the_best_fixed_budget_on_a_concave_curve_mixes_the_budgets_either_side():
    per_step = (0.5, 0.7, 0.9, 0.9)
    assert best_fixed_accuracy(per_step, 1.0) == 0.5 and best_fixed_accuracy(per_step, 3.0) == 0.9
    assert best_fixed_accuracy(per_step, 1.25) == pytest.approx(0.55, abs=1e-15)
    assert best_fixed_accuracy(per_step, 2.5) == pytest.approx(0.8, abs=1e-15)
    assert best_fixed_accuracy(per_step, 4.0) == 0.9 and best_fixed_accuracy((0.8,), 1.0) == 0.8


def test_the_best_fixed_budget_on_a_non_concave_curve_is_its_upper_concave_envelope():
    # the budgets either side of a mean of 2 give 0.50; step 1 alone gives 0.90 in fewer steps,
    # and half the inputs at step 1, half at step 3 give 0.925 in exactly 2
    per_step = (0.90, 0.50, 0.95)
    assert best_fixed_accuracy(per_step, 2.0) == pytest.approx(0.925, abs=1e-15)
    assert best_fixed_accuracy(per_step, 1.5) == pytest.approx(0.9125, abs=1e-15)  # 3/4 at step 1, 1/4 at step 3
    assert best_fixed_accuracy(per_step, 3.0) == 0.95
    # a curve that falls after step 1: no budget beyond it helps, whatever the mean
    assert best_fixed_accuracy((0.9, 0.8, 0.7, 0.6), 3.3) == 0.9
    # a dip in the middle: the envelope runs from step 2 to step 5 over it
    dip = (0.60, 0.80, 0.70, 0.75, 0.95)
    assert best_fixed_accuracy(dip, 3.5) == pytest.approx(0.80 + 0.5 * 0.15, abs=1e-15)
    for mean in (1.0, 1.7, 2.0, 2.9, 3.5, 4.2, 5.0):  # never below a budget at or under the mean, or a mix
        budgets = [a for n, a in enumerate(dip, 1) if n <= mean]
        assert best_fixed_accuracy(dip, mean) >= max(budgets)


def test_detail_and_compare_show_a_fixed_budget_at_the_rules_mean_steps(runs, tiny_mnist, ponder):
    args = [runs / "pn1", "--angles", "45", "90", "--data-dir", tiny_mnist, "--halting", "median"]
    detail = json.loads(ponder("extrapolate", *args, "--detail", "-f", "json").stdout)
    compared = json.loads(ponder("compare", *args, "-f", "json").stdout)
    plain = json.loads(ponder("extrapolate", *args, "-f", "json").stdout)
    for bucket, other in zip(detail["buckets"], compared["buckets"]):
        per_step, mean = bucket["accuracy_at_step"], bucket["mean_steps"]
        assert bucket["best_fixed_accuracy"] == best_fixed_accuracy(per_step, mean)
        assert bucket["best_fixed_accuracy"] >= max(a for n, a in enumerate(per_step, 1) if n <= mean)
        assert 0 < bucket["best_fixed_accuracy"] < 1 and mean % 1 != 0  # a mix of two budgets
        assert other["best_fixed_accuracy"] == bucket["best_fixed_accuracy"] and other["best_fixed_accuracy_sd"] is None
    assert all("best_fixed_accuracy" not in b for b in plain["buckets"])  # without --detail: not computed
    assert all("budget_accuracy" not in b for b in detail["buckets"] + compared["buckets"])
    rows = list(csv.DictReader(io.StringIO(ponder("extrapolate", *args, "--detail", "-f", "csv").stdout)))
    assert [float(r["best_fixed_accuracy"]) for r in rows] == [b["best_fixed_accuracy"] for b in detail["buckets"]]
    table = ponder("extrapolate", *args, "--detail").stdout
    assert "best fixed ≤ steps" in table and f"{detail['buckets'][1]['best_fixed_accuracy']:.4f}" in table
    assert "best fixed ≤ steps" in ponder("compare", *args).stdout


# the shipped models ------------------------------------------------------------------------------

def test_a_fixed_budget_is_the_per_step_accuracy_on_a_shipped_parity_model(ponder):
    args = ["extrapolate", "parity16-extrapolation", "--counts", "9-16", "--limit", "64", "-f", "json"]
    detail = json.loads(ponder(*args, "--detail").stdout)["buckets"][0]["accuracy_at_step"]
    for n in (1, 5, 20):
        fixed = json.loads(ponder(*args, "--halting", f"fixed:{n}").stdout)["buckets"][0]
        assert fixed["accuracy"] == detail[n - 1] and fixed["mean_steps"] == n


@pytest.mark.parametrize("name", ["reference", "align"])
@needs_mnist[0]
@needs_mnist[1]
def test_a_fixed_budget_is_the_per_step_accuracy_on_the_shipped_mnist_models(name, ponder):
    args = ["extrapolate", name, "--angles", "90", "--limit", "200", "--data-dir", DATA_DIR, "-f", "json"]
    detail = json.loads(ponder(*args, "--detail").stdout)["buckets"][0]["accuracy_at_step"]
    for n in (1, 4, len(detail)):
        fixed = json.loads(ponder(*args, "--halting", f"fixed:{n}").stdout)["buckets"][0]
        assert fixed["accuracy"] == detail[n - 1], (name, n)


@needs_mnist[0]
@needs_mnist[1]
def test_the_shipped_align_model_runs_24_steps_on_every_evaluating_command(ponder, tmp_path):
    common = ["--max-steps", "24", "--limit", "100", "--data-dir", DATA_DIR, "-f", "json"]
    for command in (["eval", "align"], ["extrapolate", "align", "--angles", "90", "--detail"],
                    ["sweep", "align", "--from", "90", "--to", "90"], ["calibrate", "align"],
                    ["compare", "align", "reference", "--angles", "90"]):
        result = ponder(*command, *common)
        assert result.exit_code == 0, (command, result.output)
        assert json.loads(result.stdout)["max_steps"] == 24
    np.save(tmp_path / "one.npy", np.zeros((1, 28, 28), dtype=np.uint8))
    result = ponder("predict", "align", tmp_path / "one.npy", "--max-steps", "24", "--halting", "fixed:24", "-f", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["buckets"][0]["halting_step"] == 24
