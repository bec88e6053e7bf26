"""Exit rules with a parameter (quantile:Q, patience:K, confidence:C) and `ponder calibrate`, which picks one on
held-out data: the spellings, the batch rules on hand-built halting probabilities and
predictions, their early-exit forms, and calibration on a model whose every output is set."""

import dataclasses
import json
import math

import pytest
import torch
from rich.cells import cell_len

from ponder_cli.api import EvalOptions, calibrate_checkpoint
from ponder_cli.checkpoint import load_checkpoint, save_checkpoint
from ponder_cli.config import PonderConfig
from ponder_cli.tasks.mnist import evaluate, load_mnist, train_val_split
from ponder_cli.evaluate import RuleOutcome, choose_rule
from ponder_cli.model import (Act, Confidence, Cut, Patience, Quantile, Sample, Threshold, act_halting, get_method,
                              halting_steps, log_survivals, rule_of)
from ponder_cli.registry import CALIBRATION_RULES, HaltingRule, parse_halting_rule
from ponder_cli.checkpoint import new_model
from ponder_cli.reports import META_KEYS

# spellings ------------------------------------------------------------------------------------


def test_spellings_parse_to_a_rule_that_keeps_them():
    assert parse_halting_rule("median") == HaltingRule("median", None, "median")
    assert parse_halting_rule("Quantile:0.90") == HaltingRule("quantile", 0.9, "quantile:0.90")
    assert parse_halting_rule("patience:3") == HaltingRule("patience", 3, "patience:3")
    assert parse_halting_rule("median").quantile == 0.5 and parse_halting_rule("quantile:0.7").quantile == 0.7
    assert parse_halting_rule("patience:2").quantile is None
    assert parse_halting_rule("confidence:0.95") == HaltingRule("confidence", 0.95, "confidence:0.95")
    assert parse_halting_rule("confidence:0.95").quantile is None


# each message names what was given and the spelling it should have had
@pytest.mark.parametrize("text, named", [
    ("quantile:1.5", ["'1.5'", "quantile:Q", "0 < Q < 1"]),
    ("quantile:0", ["'0'", "quantile:Q", "0 < Q < 1"]),
    ("quantile:nan", ["'nan'", "quantile:Q", "0 < Q < 1"]),
    ("quantile:abc", ["'abc'", "quantile:Q", "0 < Q < 1"]),
    ("quantile", ["'quantile'", "quantile:Q", "0 < Q < 1"]),
    ("confidence:1", ["'1'", "confidence:C", "0 < C < 1"]),
    ("confidence", ["'confidence'", "confidence:C", "0 < C < 1"]),
    ("patience:0", ["'0'", "patience:K", "K >= 1"]),
    ("patience:1.5", ["'1.5'", "patience:K", "K >= 1"]),
    ("median:2", ["'median:2'", "median"]),
    ("foo", ["'foo'", "sample, median, expected, quantile:Q, patience:K, confidence:C, threshold:T, fixed:N"]),
])
def test_bad_spellings_are_one_error_line(text, named, ponder, error):
    with pytest.raises(ValueError) as caught:
        parse_halting_rule(text)
    assert all(part in str(caught.value) for part in named), str(caught.value)
    error(ponder("extrapolate", "--halting", text), 2, "--halting", *named)


def test_help_shows_the_spellings(ponder):
    text = " ".join(ponder("extrapolate", "--help").stdout.split())
    assert "--halting RULE" in text and "sample, median, expected, quantile:Q, patience:K, confidence:C, threshold:T, fixed:N" in text
    assert "median = quantile:0.5" in text


# batch rules on hand-built inputs ---------------------------------------------------------------

def test_quantile_steps_from_a_constant_halting_probability():
    # lambda = 1/2 at every step: the cumulative halting probability after n steps is 1 - 2^-n
    # (0.5, 0.75, 0.875, 0.9375, 0.96875), capped at the fifth and last step
    z = torch.zeros(5, 1)
    got = {q: int(halting_steps(Quantile(q), None, z)[0]) for q in (0.5, 0.6, 0.75, 0.8, 0.9, 0.95, 0.99)}
    assert got == {0.5: 1, 0.6: 2, 0.75: 2, 0.8: 3, 0.9: 4, 0.95: 5, 0.99: 5}


def test_median_is_quantile_one_half_bit_for_bit(tiny_mnist):
    z = torch.randn(12, 4000) * 3 - 1
    old = (log_survivals(z) <= math.log(0.5)).to(torch.uint8)
    old[-1] = 1
    assert torch.equal(halting_steps(Quantile(0.5), None, z)[0], old.argmax(0) + 1)
    cfg = PonderConfig.of(max_steps=6, hidden=16, hidden_cnn=16, hidden_lin=16)
    torch.manual_seed(0)
    model = new_model(cfg)
    with torch.no_grad():
        model.halting_head.bias.fill_(-1.0)
    test = load_mnist(tiny_mnist, train=False)
    for early_exit in (True, False):
        median = evaluate(model, test, cfg, max_angle=60, seed=2, halting="median", early_exit=early_exit)
        assert median == evaluate(model, test, cfg, max_angle=60, seed=2, halting="quantile:0.5",
                                  early_exit=early_exit)


def one_hot_logits(classes_per_step: list[list[int]], classes: int = 4) -> torch.Tensor:
    """(steps, B, classes) logits whose argmax at step n of row b is classes_per_step[b][n]."""
    return torch.nn.functional.one_hot(torch.tensor(classes_per_step).T, classes).float() * 5


# rows: predicted class at steps 1..6
PREDICTIONS = [[3, 3, 3, 3, 3, 3], [1, 2, 2, 1, 1, 1], [0, 1, 0, 1, 0, 1], [2, 2, 0, 0, 0, 0]]
# patience:K halts at the first step whose class is also that of the K steps before it
PATIENCE_STEPS = {1: [2, 3, 6, 2], 2: [3, 6, 6, 5], 3: [4, 6, 6, 6], 5: [6, 6, 6, 6], 9: [6, 6, 6, 6]}


@pytest.mark.parametrize("k", sorted(PATIENCE_STEPS))
def test_patience_steps_on_crafted_predictions(k):
    assert halting_steps(Patience(k), one_hot_logits(PREDICTIONS), torch.zeros(6, 4))[0].tolist() == PATIENCE_STEPS[k]


def logits_with_top_probability(top: list[list[float]], classes: int = 4) -> torch.Tensor:
    """(steps, B, classes) logits whose softmax gives class 0 the probability top[b][n] at step
    n of row b and shares the rest equally: logit log(p) for class 0, log((1 - p) / 3) else."""
    p = torch.tensor(top, dtype=torch.float64).T  # (steps, B)
    rest = ((1 - p) / (classes - 1))[..., None].expand(*p.shape, classes - 1)
    return torch.cat([p[..., None], rest], dim=-1).log().float()


# rows: top class probability at steps 1..5
TOP = [[0.25, 0.6, 0.96, 0.99, 0.5], [0.96, 0.2, 0.2, 0.2, 0.2], [0.4, 0.4, 0.4, 0.4, 0.4], [0.55, 0.91, 0.89, 0.999, 0.3]]
# confidence:C halts at the first step whose top probability reaches C (at the last step otherwise)
CONFIDENCE_STEPS = {0.3: [2, 1, 1, 1], 0.5: [2, 1, 5, 1], 0.9: [3, 1, 5, 2], 0.95: [3, 1, 5, 4], 0.995: [5, 5, 5, 4]}


@pytest.mark.parametrize("c", sorted(CONFIDENCE_STEPS))
def test_confidence_steps_on_crafted_probabilities(c):
    assert halting_steps(Confidence(c), logits_with_top_probability(TOP), torch.zeros(5, 4))[0].tolist() == \
        CONFIDENCE_STEPS[c]


@pytest.mark.parametrize("k", sorted(PATIENCE_STEPS))
def test_patience_exit_step_by_step_equals_the_batch_rule(k, drive):
    logits = one_hot_logits(PREDICTIONS)
    assert drive(Patience(k), logits, torch.zeros(6, 4)).tolist() == PATIENCE_STEPS[k]


@pytest.mark.parametrize("c", sorted(CONFIDENCE_STEPS))
def test_confidence_exit_step_by_step_equals_the_batch_rule(c, drive):
    logits = logits_with_top_probability(TOP)
    assert drive(Confidence(c), logits, torch.zeros(5, 4)).tolist() == CONFIDENCE_STEPS[c]


@pytest.mark.parametrize("q", [0.3, 0.5, 0.7, 0.9, 0.99])
def test_quantile_exit_step_by_step_equals_the_batch_rule(q, drive):
    z = torch.randn(8, 500, generator=torch.Generator().manual_seed(4)) * 2 - 1
    steps = drive(Quantile(q), torch.zeros(8, 500, 3), z)
    assert torch.equal(steps, halting_steps(Quantile(q), None, z)[0])
    assert len(set(steps.tolist())) > 2  # the rows halt at different steps


# Threshold rules near their threshold: the batch form and the early exit must add the same float32
# terms in the same order, or a sum a few units in the last place from the bound halts at another
# step in each. Rows of halting logits z_1..z_4 whose sum of log(1 - lambda_n) lands on the bound at
# step 3 up to float32 rounding; the sums by hand in float32, and the bound as float32 rounds it.

# median: -0.435922652, -0.546736002, -0.693147123, above log 1/2 = -0.693147182: halts at step 4
MEDIAN_ROW = [-0.604423821, -2.14398956, -1.84723806, 0]
# quantile:0.9: -1.33955717, -2.26396132, -2.30258512, exactly log 0.1 = -2.30258512: halts at step 3
QUANTILE_ROW = [1.03579772, 0.418950975, -3.23451257, 0]
# truncation at epsilon 0.05: -0.836192787, -2.38493681, -2.99573207, above log 0.05 = -2.99573231: done at step 4
TRUNCATION_ROW = [0.268166542, 1.30983353, -0.172099128, 0]


@pytest.mark.parametrize("rule, row, step", [("median", MEDIAN_ROW, 4), ("quantile:0.9", QUANTILE_ROW, 3)])
def test_quantile_rules_halt_alike_near_their_threshold(rule, row, step, drive):
    z, q = torch.tensor(row)[:, None], parse_halting_rule(rule).quantile
    assert halting_steps(Quantile(q), None, z)[0].tolist() == [step]
    assert drive(Quantile(q), torch.zeros(4, 1, 3), z).tolist() == [step]


def test_truncation_stops_where_the_quantile_rule_halts_near_the_threshold(drive):
    """Training drops an image once its remaining halting mass is below epsilon: where the batch
    quantile rule with q = 1 - epsilon halts (the two differ only on the bound itself)."""
    z = torch.tensor(TRUNCATION_ROW)[:, None]
    assert drive(Cut(0.05), torch.zeros(4, 1, 3), z).tolist() == [4]
    assert halting_steps(Quantile(0.95), None, z)[0].tolist() == [4]


def near_survival_bound(log_bound: float, rows: int, generator) -> torch.Tensor:
    """Halting logits (4, <= rows) whose log(1 - lambda_n) summed over steps 1-3 is log_bound up to
    float32 rounding: z_1 and z_2 drawn, z_3 solved for in float64, z_4 = 0 (rows whose first two
    steps already pass the bound are dropped)."""
    z = torch.randn(4, rows, generator=generator, dtype=torch.float64) * 1.5 - 1
    rest = log_bound - torch.nn.functional.logsigmoid(-z[:2]).sum(0)  # log(1 - lambda_3) wanted
    z = z[:, rest < 0]
    z[2], z[3] = -torch.logit(rest[rest < 0].exp()), 0
    return z.float()


def near_act_bound(bound: float, rows: int, generator) -> torch.Tensor:
    """Halting logits (4, <= rows) whose halting units summed over steps 1-3 are `bound` up to
    float32 rounding (h_1, h_2 drawn, h_3 solved for, z_4 = 0)."""
    h = torch.rand(2, rows, generator=generator, dtype=torch.float64) * 0.6
    third = bound - h.sum(0)
    kept = (third > 0) & (third < 1)
    return torch.cat([torch.logit(h[:, kept]), torch.logit(third[kept])[None], torch.zeros(1, int(kept.sum()),
                                                                                           dtype=torch.float64)]).float()


def first_step(fires: torch.Tensor) -> torch.Tensor:
    """1-based first step where `fires` (steps, B) holds, else the last step."""
    fires = fires.clone()
    fires[-1] = True
    return fires.to(torch.uint8).argmax(0) + 1


def test_every_threshold_rule_halts_alike_step_by_step_on_many_near_threshold_rows(drive):
    generator = torch.Generator().manual_seed(0)
    float64_differs = {}
    for q in (0.5, 0.9):
        z = near_survival_bound(math.log1p(-q), 20000, generator)
        batch = halting_steps(Quantile(q), None, z)[0]
        assert torch.equal(drive(Quantile(q), torch.zeros(4, z.shape[1], 3), z), batch)
        log_survival = torch.nn.functional.logsigmoid(-z.double()).cumsum(0)
        float64_differs[f"quantile:{q}"] = int((first_step(log_survival <= math.log1p(-q)) != batch).sum())
    z = near_survival_bound(math.log(0.05), 20000, generator)
    done = drive(Cut(0.05), torch.zeros(4, z.shape[1], 3), z)
    assert torch.equal(done, first_step(log_survivals(z) < math.log(0.05)))
    z = near_act_bound(0.99, 20000, generator)
    batch = act_halting(z, 0.01).steps
    logits = torch.randn(4, z.shape[1], 3, generator=generator)
    assert torch.equal(drive(Act(0.01), logits, z), batch)  # early exit, and training's truncation
    assert torch.equal(drive(Act(0.01), None, z), batch)
    float64_differs["act"] = int((first_step(torch.sigmoid(z.double()).cumsum(0) >= 0.99) != batch).sum())
    # the rows are near enough: summed in float64, a share of them would halt at another step
    assert all(count > 100 for count in float64_differs.values()), float64_differs


def test_the_sample_rule_compares_the_same_lambda_step_by_step(drive):
    """Coins equal to lambda_n up to rounding: the batch form and the early exit, which hold a row
    at different positions in a tensor, must round lambda_n alike to flip the same coins."""
    z = torch.randn(6, 5001, generator=torch.Generator().manual_seed(1)) * 3
    uniforms = torch.sigmoid(z.double()).float()
    steps = halting_steps(Sample(uniforms), None, z)[0]
    assert torch.equal(drive(Sample(uniforms), torch.zeros(6, 5001, 3), z), steps)


# confidence:0.1244: near the median top class probability of this untrained model's outputs
# threshold:0.2913: near the median lambda of this untrained model (sigmoid(-1) and what the state adds)
@pytest.mark.parametrize("rule", ["quantile:0.8", "quantile:0.95", "patience:1", "patience:3", "confidence:0.1244",
                                  "threshold:0.2913"])
def test_early_exit_predicts_as_every_step_on_a_model(rule):
    cfg = PonderConfig.of(max_steps=6, hidden=16, hidden_cnn=16, hidden_lin=16)
    torch.manual_seed(0)
    model, method = new_model(cfg).eval(), get_method(cfg)
    with torch.no_grad():
        model.halting_head.bias.fill_(-1.0)
    x = torch.randn(200, 1, 28, 28) * torch.linspace(0, 3, 200).view(-1, 1, 1, 1)
    uniforms = torch.rand(6, 200, generator=torch.Generator().manual_seed(3))
    early, early_steps = model.infer(x, method.exit_rule(rule, uniforms))
    with torch.no_grad():
        out = model(x)
    full, full_steps = method.predict(out.logits, out.lambda_logits, uniforms, rule)
    assert torch.equal(early_steps, full_steps) and torch.equal(early.argmax(1), full.argmax(1))
    assert torch.equal(full_steps, halting_steps(rule_of(rule, uniforms), out.logits, out.lambda_logits)[0])
    if rule.startswith(("confidence", "threshold")):
        assert len(set(full_steps.tolist())) > 1  # some rows halt at once, others run on
    exits = {"quantile": Quantile, "patience": Patience, "confidence": Confidence,
             "threshold": Threshold}
    assert isinstance(rule_of(parse_halting_rule(rule), uniforms), exits[parse_halting_rule(rule).name])


# the rules in the commands ----------------------------------------------------------------------

def test_reports_name_the_rule_as_given(runs, tiny_mnist, ponder):
    result = ponder("extrapolate", runs / "pn1" / "best.pt", "--angles", 30, "--halting", "quantile:0.90", "-f", "json",
                    "--data-dir", tiny_mnist)
    report = json.loads(result.stdout)
    assert report["halting"] == "quantile:0.90" and report["buckets"][0]["halting"] == "quantile:0.90"
    assert "halting patience:2" in ponder("eval", runs / "pn1" / "best.pt", "--halting", "patience:2",
                                          "--data-dir", tiny_mnist).stdout


@pytest.mark.parametrize("rule", ["quantile:0.9", "patience:2", "confidence:0.9", "sample", "median", "expected"])
def test_act_refuses_every_rule_given_in_one_line_but_compare_shows_its_own(rule, runs, tiny_mnist, ponder, error):
    # the rule given, the method it applies to, this one's, and what it takes instead
    error(ponder("eval", runs / "act" / "best.pt", "--halting", rule, "--data-dir", tiny_mnist), 2,
          f"--halting {rule}", "pondernet", "act", "fixed:N")
    result = ponder("compare", runs / "pn1" / "best.pt", runs / "act" / "best.pt", "--angles", 30, "--halting", rule,
                    "--data-dir", tiny_mnist)
    assert result.exit_code == 0 and f"pondernet → {rule} · act → act" in result.stdout


def test_act_without_halting_halts_by_its_own_rule(runs, tiny_mnist, ponder):
    result = ponder("eval", runs / "act" / "best.pt", "--data-dir", tiny_mnist, "-f", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["halting"] == "act"


# calibrate --------------------------------------------------------------------------------------

def test_the_cheapest_rule_whose_lower_bound_clears_the_tolerance_is_chosen():
    def outcome(rule, agreement, steps):
        return RuleOutcome(rule, 1000, 0.9, agreement, 0.9, steps)
    # one-sided 95% Wilson lower bounds over 1000 inputs, by hand (z = 1.6449, z^2 = 2.7055):
    # 1000 agree: 1000 / 1002.7055 = 0.99730; 999: 0.99553; 995: 0.98976; 970: 0.95978
    outcomes = [outcome("quantile:0.5", 0.97, 2.0), outcome("quantile:0.9", 0.995, 3.0),
                outcome("patience:2", 0.999, 3.5), outcome("patience:3", 1.0, 3.5)]
    assert [round(o.agreement_lower, 5) for o in outcomes] == [0.95978, 0.98976, 0.99553, 0.99730]
    # quantile:0.9 measures 0.995, exactly 1 - 0.005, but its bound does not clear it
    assert choose_rule(outcomes, 0.005) == "patience:2"  # 3.5 steps; patience:3 ties it, listed later
    assert choose_rule(outcomes, 0.003) == "patience:3"
    assert choose_rule(outcomes, 0.04) == "quantile:0.9"  # quantile:0.5 misses: 0.95978 < 0.96
    assert choose_rule(outcomes, 0.05) == "quantile:0.5"
    assert choose_rule(outcomes, 0.0) is None


@pytest.fixture(scope="module")
def fixed_model(checkpoint, tmp_path_factory):
    """The tiny checkpoint with its heads set: lambda = 1/2 at every step, class 3 everywhere."""
    state = load_checkpoint(checkpoint)
    weights = dict(state.model)
    weights["halting_head.weight"] = torch.zeros_like(weights["halting_head.weight"])
    weights["halting_head.bias"] = torch.zeros_like(weights["halting_head.bias"])
    weights["output_head.weight"] = torch.zeros_like(weights["output_head.weight"])
    weights["output_head.bias"] = torch.nn.functional.one_hot(torch.tensor(3), 10).float()
    path = tmp_path_factory.mktemp("fixed") / "fixed.pt"
    save_checkpoint(dataclasses.replace(state, model=weights), path)
    return path


def test_calibrate_on_a_model_whose_outputs_are_known(fixed_model, tiny_mnist):
    cfg = load_checkpoint(fixed_model).config
    assert cfg.method.max_steps == 5
    report = calibrate_checkpoint(fixed_model, None, EvalOptions(data_dir=tiny_mnist, download=False))
    _, held_out = train_val_split(load_mnist(tiny_mnist, train=True), val_size=cfg.task.val_size,
                                  train_size=cfg.task.train_size, seed=cfg.training.seed)
    threes = float((held_out.labels == 3).double().mean())
    rows = {b["halting"]: b for b in report.buckets}
    assert list(rows) == list(CALIBRATION_RULES)
    # lambda = 1/2: the steps of test_quantile_steps_from_a_constant_halting_probability; one
    # class throughout: patience:K halts at step K + 1; logits one-hot: the top class
    # probability is e / (e + 9) = 0.23, below every confidence:C, which halt at the last step
    expected_steps = {"quantile:0.5": 1, "quantile:0.6": 2, "quantile:0.7": 2, "quantile:0.8": 3, "quantile:0.9": 4,
                      "quantile:0.95": 5, "quantile:0.99": 5, "patience:1": 2, "patience:2": 3, "patience:3": 4,
                      "patience:4": 5, **{f"confidence:{c}": 5 for c in ("0.5", "0.7", "0.9", "0.95", "0.99", "0.999")}}
    assert {rule: b["mean_steps"] for rule, b in rows.items()} == expected_steps
    for b in rows.values():
        assert b["images"] == cfg.task.val_size == 100 and b["agreement"] == 1.0
        assert b["accuracy"] == b["accuracy_last"] == pytest.approx(threes) and b["gap"] == 0.0
        # every one of 100 agrees: the one-sided 95% Wilson bound is n / (n + z^2) = 100 / 102.7055
        assert b["agreement_lower"] == pytest.approx(0.973658, abs=1e-6)
        assert b["within_tolerance"] and not b["admitted"]
    # 100 inputs cannot show 99.5% agreement with 95% confidence, even all agreeing; 97% they can
    assert report.meta["chosen"] is None and report.meta["images"] == 100
    loose = calibrate_checkpoint(fixed_model, None, EvalOptions(data_dir=tiny_mnist, download=False), tolerance=0.03)
    assert loose.meta["chosen"] == "quantile:0.5" and [b["chosen"] for b in loose.buckets].count(True) == 1
    assert (report.meta["data"], report.meta["sets"], report.meta["halting"], report.meta["bound"]) == (
        "validation", [{"rotation": cfg.task.train_rotation, "protocol": "uniform"}], None, "wilson one-sided 95%")


def test_calibrate_command_contract(fixed_model, tiny_mnist, ponder, monkeypatch):
    # the fixed model (test_calibrate_on_a_model_whose_outputs_are_known): every rule agrees
    # with the last step, quantile:0.5 halts at step 1, the fewest
    args = ["calibrate", fixed_model, "--data-dir", tiny_mnist, "--angles", 30, 60, "--repeats", 2, "--limit", 40]
    result = ponder(*args, "-f", "json", "--tolerance", 0.02)  # 160 agreeing: bound 160 / 162.7055 = 0.9834
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert list(report)[:1 + len(META_KEYS)] == ["format_version", *META_KEYS] and report["command"] == "calibrate"
    assert report["images"] == 40 * 2 * 2  # two angles, two draws, pooled
    assert [b["halting"] for b in report["buckets"]] == list(CALIBRATION_RULES)
    assert report["chosen"] == "quantile:0.5"
    assert [b["halting"] for b in report["buckets"] if b["chosen"]] == ["quantile:0.5"]
    monkeypatch.setenv("COLUMNS", "80")
    lines = ponder(*args, "--tolerance", 0.5).stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    assert lines[-1].startswith("chosen: quantile:0.5 ") and lines[-1].endswith("--halting quantile:0.5")


def test_calibrate_takes_the_candidates_from_rules(fixed_model, tiny_mnist, ponder, error):
    # the fixed model: lambda = 1/2 and one class throughout (test_calibrate_on_a_model_whose_outputs_are_known)
    result = ponder("calibrate", "--rules", "confidence:0.9", "quantile:0.8", "patience:1", fixed_model,
                    "--data-dir", tiny_mnist, "-f", "json", "--tolerance", 0.03)  # 100 inputs: bound 0.9737
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [(b["halting"], b["mean_steps"]) for b in report["buckets"]] == [
        ("confidence:0.9", 5), ("quantile:0.8", 3), ("patience:1", 2)]
    assert report["chosen"] == "patience:1"
    error(ponder("calibrate", fixed_model, "--rules", "confidence:2", "--data-dir", tiny_mnist), 2, "--rules",
          "confidence:C", "'2'")
    error(ponder("calibrate", fixed_model, "--rules", "--data-dir", tiny_mnist), 2, "--rules")


@pytest.mark.parametrize("rules", [["expected"], ["sample", "expected"]])
def test_calibrate_refuses_the_expected_rule_at_the_option(rules, fixed_model, ponder, error):
    # naming the rule refused and the ones calibrate takes
    error(ponder("calibrate", fixed_model, "--rules", *rules, "--limit", 100), 2, "--rules", "expected",
          "sample, median, quantile:Q, patience:K, confidence:C, threshold:T, fixed:N")


def test_calibrate_refuses_the_expected_rule_on_a_shipped_parity_model(ponder, error):
    error(ponder("calibrate", "parity16", "--rules", "expected", "--limit", 4), 2, "--rules", "expected")


def test_calibrate_checkpoint_refuses_the_expected_rule_without_the_cli(fixed_model):
    from ponder_cli import PonderError
    from ponder_cli.api import EvalOptions, calibrate_checkpoint

    with pytest.raises(PonderError, match="^--rules: .*expected"):
        calibrate_checkpoint(fixed_model, None, EvalOptions(), rules=["expected"])


@pytest.mark.parametrize("run, named", [("act", ["calibrate", "pondernet", "act", "fixed:N"]),
                                        ("plain", ["one step"])])
def test_calibrate_refuses_act_and_one_step(run, named, runs, tiny_mnist, ponder, error):
    # a checkpoint calibrate cannot take: a usage mistake, as `eval --halting median` on act is
    error(ponder("calibrate", runs / run / "best.pt", "--data-dir", tiny_mnist), 2, *named)


def test_calibrate_on_act_names_the_rules_given_never_a_halting_option(runs, tiny_mnist, ponder, error):
    line = error(ponder("calibrate", runs / "act" / "best.pt", "--rules", "sample", "patience:2",
                        "--data-dir", tiny_mnist), 2, "--rules sample patience:2", "pondernet", "act")
    assert "--halting" not in line


@pytest.mark.parametrize("tolerance", ["-0.1", "1", "nan"])
def test_calibrate_refuses_a_bad_tolerance(tolerance, checkpoint, ponder, error):
    error(ponder("calibrate", checkpoint, "--tolerance", tolerance), 2, "--tolerance", f"{float(tolerance):g}")


def test_every_calibrate_column_has_a_header(checkpoint, tiny_mnist, ponder):
    result = ponder("calibrate", checkpoint, "--rules", "quantile:0.5", "patience:1", "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    header = next(line for line in result.stdout.splitlines() if "rule" in line and "steps" in line)
    assert [cell.strip() for cell in header.strip("┃").split("┃")] == ["rule", "steps", "accuracy", "gap", "agrees",
                                                                       "bound", "verdict"]
