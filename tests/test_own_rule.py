"""A model halts by the rule it was trained for when none is asked: a head trained on the answer
(--halting-target final | correct) by its threshold, saved with it (--halting-threshold), in
validation (best.pt's choice), eval, compare and calibrate's candidates; one trained towards the
prior by PonderNet's coins (sample)."""

import json

import pytest

from ponder_cli.checkpoint import load_checkpoint, load_model
from ponder_cli.config import PonderConfig, default_halting
from ponder_cli.tasks import get_task
from ponder_cli.tasks.mnist import evaluate

SMALL = ["--max-steps", "4", "--hidden", "16", "--hidden-cnn", "16", "--hidden-lin", "16", "--val-size", "100",
         "--train-size", "200", "--batch-size", "100", "--train-rotation", "0", "--no-progress"]
FINAL = ["--halting-target", "final", "--halting-input", "state+answer", "--truncation", "0"]


@pytest.fixture(scope="module")
def final_run(tiny_mnist, tmp_path_factory, ponder):
    out = tmp_path_factory.mktemp("final")
    result = ponder("train", *SMALL, *FINAL, "--halting-threshold", "0.9", "--epochs", "3", "--lr", "0.01",
                    "--data-dir", tiny_mnist, "--out", out, "-f", "json")
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout)


def test_the_rule_is_the_one_trained_for():
    assert default_halting(PonderConfig.of()) == "sample"
    assert default_halting(PonderConfig.of(halting_target="final", truncation=0.0)) == "threshold:0.99"
    assert default_halting(PonderConfig.of(halting_target="correct", truncation=0.0,
                                           halting_threshold=0.998)) == "threshold:0.998"
    assert default_halting(PonderConfig.of(method="act")) == "sample"  # ACT halts by its own whatever the name


def test_an_answer_trained_head_validates_and_chooses_best_by_its_threshold(final_run, tiny_mnist):
    out, report = final_run
    assert report["halting"] == "threshold:0.9"
    history = {epoch["epoch"]: epoch for epoch in report["buckets"]}
    cfg = load_checkpoint(out / "last.pt").config
    assert cfg.method.halting_threshold == 0.9  # saved with the model
    _, val_set = get_task(cfg).load_training(tiny_mnist, False)
    model, _, state = load_model(out / "best.pt", "cpu")
    by_threshold = evaluate(model, val_set, cfg, max_angle=0.0, seed=cfg.training.seed, halting="threshold:0.9")
    sampled = evaluate(model, val_set, cfg, max_angle=0.0, seed=cfg.training.seed, halting="sample")
    best = history[state.epoch]
    assert best["val_accuracy"] == pytest.approx(by_threshold.accuracy)
    assert best["val_steps"] == pytest.approx(by_threshold.mean_steps)
    assert by_threshold.mean_steps != pytest.approx(sampled.mean_steps)  # the two rules differ on it
    assert best["val_accuracy"] == max(epoch["val_accuracy"] for epoch in history.values())


def test_eval_compare_info_and_calibrate_use_the_heads_own_rule(final_run, tiny_mnist, runs, ponder):
    out, _ = final_run
    common = ["--limit", "60", "--data-dir", tiny_mnist, "-f", "json"]
    own = json.loads(ponder("eval", out, *common).stdout)
    asked = json.loads(ponder("eval", out, "--halting", "threshold:0.9", *common).stdout)
    assert own["halting"] == own["buckets"][0]["halting"] == "threshold:0.9"
    assert own["buckets"][0]["mean_steps"] == asked["buckets"][0]["mean_steps"]
    assert own["buckets"][0]["accuracy"] == asked["buckets"][0]["accuracy"]
    prior = json.loads(ponder("eval", runs / "pn1", *common).stdout)
    assert prior["halting"] == "sample"  # a head trained towards the prior keeps its coins
    compared = ponder("compare", out, runs / "pn1", "--limit", "40", "--data-dir", tiny_mnist, "-f", "json")
    rules = {bucket["checkpoints"][0]: bucket["halting"] for bucket in json.loads(compared.stdout)["buckets"]}
    assert sorted(rules.values()) == ["sample", "threshold:0.9"]
    assert json.loads(compared.stdout)["halting"] is None  # each its own, which its buckets name
    table = ponder("compare", out, runs / "pn1", "--limit", "40", "--data-dir", tiny_mnist).stdout
    assert "threshold:0.9" in table and "sample" in table
    info = json.loads(ponder("info", out, "-f", "json").stdout)
    assert info["config"]["halting_threshold"] == 0.9
    calibrated = json.loads(ponder("calibrate", out, *common).stdout)
    candidates = [bucket["halting"] for bucket in calibrated["buckets"]]
    assert "threshold:0.99" in candidates and not any(rule.startswith("quantile:") for rule in candidates)
    prior_candidates = [b["halting"] for b in json.loads(ponder("calibrate", runs / "pn1", *common).stdout)["buckets"]]
    assert not any(rule.startswith("threshold:") for rule in prior_candidates)


def test_calibrates_advice_names_the_options_that_calibrate_on_more(runs, tiny_mnist, ponder):
    result = ponder("calibrate", runs / "pn1", "--limit", "20", "--tolerance", "0", "--rules", "fixed:1",
                    "--data-dir", tiny_mnist)
    footer = result.stdout.strip().splitlines()[-1]
    assert result.exit_code == 0 and footer.startswith("chosen: none")
    assert "--limit 0" in footer and "--repeats" in footer


def test_the_threshold_is_a_setting_of_an_answer_trained_head_alone(ponder, one_error_line):
    result = ponder("train", "--halting-threshold", "0.9", "--print-config")
    line = one_error_line(result)
    assert result.exit_code == 2 and "--halting-threshold" in line and "--halting-target" in line
