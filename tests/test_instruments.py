"""Rotation protocols, halting rules, per-bucket statistics, Spearman's rho, plots."""

import builtins
import csv
import io
import json
import math

import pytest
import torch

from ponder_cli import PonderError
from ponder_cli.config import PonderConfig
from synthetic_data import synthetic_digits
from ponder_cli.evaluate import spearman
from ponder_cli.tasks.mnist import evaluate, protocol_angles
from ponder_cli.model import Quantile, halting_log_probs, halting_steps
from ponder_cli.checkpoint import new_model
from ponder_cli.plot import require_matplotlib
from ponder_cli.render import sparkline

CFG = PonderConfig.of(max_steps=6, hidden=16, hidden_cnn=16, hidden_lin=16)


@pytest.fixture(scope="module")
def model_and_data():
    torch.manual_seed(0)
    model = new_model(CFG).eval()
    with torch.no_grad():
        model.halting_head.bias.fill_(-1.0)
    return model, synthetic_digits(240, seed=5)


def test_protocol_angles_lie_in_their_bucket():
    draws = torch.rand(5000, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    uniform = protocol_angles(draws, 45.0, "uniform")
    band = protocol_angles(draws, 45.0, "band", lower=22.5)
    fixed = protocol_angles(draws, 45.0, "fixed", lower=22.5)
    assert uniform.abs().max() <= 45 and uniform.min() < -40 and uniform.max() > 40
    assert band.abs().min() >= 22.5 and band.abs().max() <= 45
    assert (band < 0).any() and (band > 0).any()
    assert set(fixed.tolist()) == {-45.0, 45.0}
    with pytest.raises(ValueError):
        protocol_angles(draws[:3], 10.0, "spiral")


def test_median_rule_by_hand():
    # lambda = 0.2, 0.2, 0.5, ...: cumulative 0.2, 0.36, 0.68 -> halts at step 3
    # lambda = 0.6: cumulative 0.6 at step 1 -> halts at step 1; never reaching 1/2 -> last step
    lam = torch.tensor([[0.2, 0.6, 0.01], [0.2, 0.1, 0.01], [0.5, 0.1, 0.01], [0.1, 0.1, 0.01]])
    assert halting_steps(Quantile(0.5), None, torch.logit(lam))[0].tolist() == [3, 1, 4]


def test_median_is_deterministic_and_early_exit_agrees(model_and_data):
    model, data = model_and_data
    a = evaluate(model, data, CFG, seed=1, halting="median")
    b = evaluate(model, data, CFG, seed=2, halting="median")
    forced = evaluate(model, data, CFG, seed=3, halting="median", early_exit=False)
    assert a == b == forced
    assert torch.equal(a.samples.steps, b.samples.steps)


def test_expected_steps_equal_sum_of_n_p_n(model_and_data):
    model, data = model_and_data
    result = evaluate(model, data, CFG, seed=1, halting="expected", batch_size=100)
    with torch.no_grad():
        from ponder_cli.tasks.mnist import prepare_batch
        out = model(prepare_batch(data.images))
        p = halting_log_probs(out.lambda_logits).exp().double()  # (steps, N)
        expected = (torch.arange(1, 7, dtype=torch.float64)[:, None] * p).sum(0)
        probs = (p[..., None] * torch.softmax(out.logits.double(), -1)).sum(0)
    assert torch.allclose(result.samples.steps, expected, atol=1e-5)
    assert math.isclose(result.mean_steps, expected.mean().item(), rel_tol=1e-5)
    assert result.accuracy == (probs.argmax(1) == data.labels).double().mean().item()
    assert math.isclose(sum(result.histogram), len(data), rel_tol=1e-6)


@pytest.mark.parametrize("halting", ["sample", "median"])
def test_histogram_and_conditional_steps(model_and_data, halting):
    model, data = model_and_data
    r = evaluate(model, data, CFG, max_angle=30, seed=4, halting=halting, detail=True)
    assert sum(r.histogram) == r.images == 240 and len(r.histogram) == 6
    assert all(isinstance(h, int) for h in r.histogram)
    steps = r.samples.steps
    assert r.histogram == tuple(int((steps == k).sum()) for k in range(1, 7))
    correct = r.samples.correct
    assert math.isclose(r.steps_correct, steps[correct].mean().item())
    assert math.isclose(r.steps_wrong, steps[~correct].mean().item())
    assert len(r.accuracy_at_step) == 6 and all(0 <= a <= 1 for a in r.accuracy_at_step)
    assert r.samples.difficulty.max() <= 30


def test_accuracy_at_step_by_direct_computation(model_and_data):
    model, data = model_and_data
    r = evaluate(model, data, CFG, seed=4, detail=True, batch_size=64)
    from ponder_cli.tasks.mnist import prepare_batch
    with torch.no_grad():
        logits = model(prepare_batch(data.images)).logits  # (steps, N, classes)
    direct = (logits.argmax(-1) == data.labels).double().mean(1)
    assert torch.allclose(torch.tensor(r.accuracy_at_step, dtype=torch.float64), direct)


def test_spearman_by_hand():
    assert math.isclose(spearman(torch.tensor([1., 2, 3, 4]), torch.tensor([1., 3, 2, 4])), 0.8)
    # ties share their average rank: x ranks (1, 2.5, 2.5, 4) -> rho = 4.5 / sqrt(4.5 * 5)
    assert math.isclose(spearman(torch.tensor([1., 2, 2, 3]), torch.tensor([1., 2, 3, 4])), 4.5 / math.sqrt(22.5))
    assert math.isclose(spearman(torch.tensor([3., 2, 1]), torch.tensor([10., 20, 30])), -1.0)
    assert spearman(torch.tensor([1., 2, 3]), torch.tensor([5., 5, 5])) is None


def test_spearman_equals_scipy(scipy_stats):
    g = torch.Generator().manual_seed(0)
    angles = (torch.rand(3000, generator=g) * 90).round()  # many ties, as |angle| buckets have
    steps = (angles / 30 + torch.rand(3000, generator=g) * 4).floor() + 1  # ties and a trend
    expected = scipy_stats.spearmanr(angles.numpy(), steps.numpy()).statistic
    assert math.isclose(spearman(angles, steps), expected, rel_tol=1e-12)


def test_sparkline():
    # bar index round(v / max * 7) into ▁▂▃▄▅▆▇█; empty bins are blank
    assert sparkline([0, 1, 2, 4, 8]) == " ▂▃▅█"
    assert sparkline([]) == ""
    # merged into at most `width` bins of (nearly) equal size: (1+1), (2+0), (0+4) -> 2, 2, 4
    assert sparkline([1, 1, 2, 0, 0, 4], width=3) == "▅▅█"
    assert len(sparkline(list(range(100)), width=20)) == 20


# --- CLI ----------------------------------------------------------------------------------------

def test_extrapolate_json_with_protocol_halting_and_detail(checkpoint, tiny_mnist, ponder):
    result = ponder("extrapolate", checkpoint, "--angles", "30", "60", "--protocol", "band",
                    "--halting", "median", "--detail", "-f", "json", "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["protocol"] == "band" and data["halting"] == "median"
    assert data["checkpoints"] == [str(checkpoint)] and data["train_rotation"] == 22.5
    assert data["spearman"]["images"] == 400
    rho = data["spearman"]["rho"]
    assert rho is None or -1 <= rho <= 1
    for row in data["buckets"]:
        assert sum(row["histogram"]) == 200 and len(row["histogram"]) == 5
        assert len(row["accuracy_at_step"]) == 5
        assert {"steps_correct", "steps_wrong", "mean_steps", "std_steps"} <= set(row)


def test_extrapolate_csv_carries_lists_and_metadata(checkpoint, tiny_mnist, ponder):
    result = ponder("extrapolate", checkpoint, "--angles", "45", "-f", "csv", "--halting", "expected",
                    "--data-dir", tiny_mnist)
    row = next(csv.DictReader(io.StringIO(result.stdout)))
    json_row = json.loads(ponder("extrapolate", checkpoint, "--angles", "45", "-f", "json", "--halting", "expected",
                                 "--data-dir", tiny_mnist).stdout)["buckets"][0]
    # lists as `;`-separated items, never a comma: `cut -d,` reads every column
    assert [float(v) for v in row["histogram"].split(";")] == json_row["histogram"]
    assert math.isclose(sum(float(v) for v in row["histogram"].split(";")), 200, rel_tol=1e-6)
    assert [float(v) for v in row["accuracy_wilson"].split(";")] == json_row["accuracy_wilson"]
    assert row["checkpoints"] == str(checkpoint)
    assert row["halting"] == "expected" and row["checkpoint"] == str(checkpoint)
    assert row["method"] == "pondernet" and row["step"] == "mlp" and row["command"] == "extrapolate"


def test_table_shows_trend_and_detail(checkpoint, tiny_mnist, ponder):
    result = ponder("eval", checkpoint, "--rotation", "40", "--detail", "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    assert "Spearman ρ(|angle|, steps)" in result.stdout and "Per halting step" in result.stdout
    assert "±40° acc if stop" in result.stdout


def test_plot_is_a_png(checkpoint, tiny_mnist, tmp_path, ponder):
    pytest.importorskip("matplotlib")
    png = tmp_path / "plot.png"
    result = ponder("extrapolate", checkpoint, "--angles", "20", "40", "--plot", png, "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert str(png) in result.stderr


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, checkpoint, tiny_mnist, tmp_path, ponder):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(PonderError, match="^--plot needs matplotlib: pip install matplotlib$"):
        require_matplotlib()
    result = ponder("extrapolate", checkpoint, "--plot", tmp_path / "p.png", "--data-dir", tiny_mnist)
    assert result.exit_code == 1 and "Error: --plot needs matplotlib" in result.stderr
    assert not (tmp_path / "p.png").exists()


def test_repeats_interval_by_hand():
    from ponder_cli.reports import combine_draws, mean_ci
    # mean 0.92, sample sd 0.02, t(0.975, 2 df) = 4.303: half-width 4.303 * 0.02 / sqrt(3) = 0.049686
    mean, (low, high) = mean_ci([0.90, 0.92, 0.94])
    assert math.isclose(mean, 0.92) and math.isclose(high - mean, 0.049686, rel_tol=1e-4)
    assert math.isclose(mean - low, high - mean)
    assert mean_ci([0.5]) == (0.5, None)
    draws = [{"rotation": 45.0, "images": 100, "accuracy": a, "mean_steps": s, "steps_wrong": w,
              "histogram": h, "halting": "sample"}
             for a, s, w, h in ((0.90, 4.0, 5.0, [60, 40]), (0.92, 5.0, None, [50, 50]), (0.94, 6.0, 7.0, [40, 60]))]
    bucket = combine_draws(draws)
    assert bucket["repeats"] == 3 and bucket["images"] == 100 and bucket["halting"] == "sample"
    assert math.isclose(bucket["accuracy"], 0.92) and math.isclose(bucket["accuracy_ci"][1], 0.92 + 0.049686, rel_tol=1e-4)
    assert math.isclose(bucket["mean_steps"], 5.0) and math.isclose(bucket["mean_steps_ci"][0], 5 - 4.303 / 3 ** 0.5, rel_tol=1e-4)
    assert bucket["histogram"] == [50, 50] and bucket["steps_wrong"] == 6.0  # a draw without errors is left out


def test_an_accuracy_interval_stays_within_0_and_1():
    from ponder_cli.reports import combine_draws

    # mean 0.996667, sample sd 0.0057735, half-width 4.303 * 0.0057735 / sqrt(3) = 0.014343:
    # 0.982324 to 1.011010, of which an accuracy can reach 1 at most
    draws = [{"images": 100, "accuracy": a, "mean_steps": 3.0, "histogram": [1, 0]} for a in (1.0, 1.0, 0.99)]
    low, high = combine_draws(draws)["accuracy_ci"]
    assert math.isclose(low, 0.982324, rel_tol=1e-5) and high == 1.0


def test_repeats_from_the_cli(checkpoint, tiny_mnist, ponder):
    once = json.loads(ponder("extrapolate", checkpoint, "--angles", 30, "-f", "json", "--data-dir", tiny_mnist).stdout)
    three = json.loads(ponder("extrapolate", checkpoint, "--angles", 30, "--repeats", 3, "-f", "json",
                              "--data-dir", tiny_mnist).stdout)
    singles = [json.loads(ponder("extrapolate", checkpoint, "--angles", 30, "--seed", seed, "-f", "json",
                                 "--data-dir", tiny_mnist).stdout)["buckets"][0]["accuracy"] for seed in (1234, 1235, 1236)]
    assert once["buckets"][0]["accuracy"] == singles[0] and once["buckets"][0]["accuracy_ci"] is None
    bucket = three["buckets"][0]
    assert three["repeats"] == 3 and bucket["repeats"] == 3
    assert math.isclose(bucket["accuracy"], sum(singles) / 3)
    low, high = bucket["accuracy_ci"]
    assert low <= bucket["accuracy"] <= high


def test_least_squares_by_hand():
    from ponder_cli.reports import least_squares
    # y = 2 + 0.1 x exactly, then one point off the line: slope (sum dx dy / sum dx^2)
    assert least_squares([0, 10, 20], [2, 3, 4]) == pytest.approx((0.1, 2.0, 1.0))
    slope, intercept, r2 = least_squares([0, 10, 20, 30], [1, 2, 2, 4])
    # mean x 15, mean y 2.25; sxy = (-15)(-1.25) + (-5)(-0.25) + 5(-0.25) + 15(1.75) = 45; sxx = 500
    assert slope == pytest.approx(0.09) and intercept == pytest.approx(2.25 - 0.09 * 15)
    assert r2 == pytest.approx(45 ** 2 / (500 * 4.75))


def test_sweep_exact_angles_and_slope(checkpoint, tiny_mnist, ponder, tmp_path):
    result = ponder("sweep", checkpoint, "--from", 0, "--to", 90, "--every", 30, "--halting", "median", "-f", "json",
                    "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["command"] == "sweep" and data["protocol"] == "fixed" and data["halting"] == "median"
    buckets = data["buckets"]
    assert [b["rotation"] for b in buckets] == [0, 30, 60, 90]
    xs, ys = [b["rotation"] for b in buckets], [b["mean_steps"] for b in buckets]
    mx, my = sum(xs) / 4, sum(ys) / 4
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    assert data["fit"]["steps_per_10_degrees"] == pytest.approx(10 * slope)
    # fixed protocol: every image of the 30-degree bucket is turned by exactly +-30 degrees
    single = json.loads(ponder("extrapolate", checkpoint, "--angles", 30, "--protocol", "fixed", "--halting", "median",
                               "-f", "json", "--data-dir", tiny_mnist).stdout)["buckets"][0]
    assert single["accuracy"] == buckets[1]["accuracy"]


def test_align_targets_reads_the_fixed_protocol_figures():
    steps = [3.0, 3.5, 4.5, 5.5, 6.25]
    right, wrong = [3.0, 3.4, 4.4, 5.0, 6.5], [5.0, 6.0, 6.6, 7.2, 6.0]  # wrong < right at 90
    halting = [0.99, 0.98, 0.96, 0.82, 0.60]
    last = [0.989, 0.981, 0.965, 0.85, 0.62]  # 0.1 below at 0, then 0.1, 0.5, 3 points above
    report = {"protocol": "fixed", "checkpoints": ["runs/x/best.pt"], "spearman": {"rho": 0.61}, "halting": "median",
              "buckets": [{"rotation": a, "mean_steps": s, "steps_correct": r, "steps_wrong": w, "accuracy": h,
                           "accuracy_at_step": [0.1, l]}
                          for a, s, r, w, h, l in zip((0, 22.5, 45, 67.5, 90), steps, right, wrong, halting, last)]}
    f = _benchmark("align_targets").figures(report)
    assert (f["acc45"], f["acc67"], f["rho"]) == (0.96, 0.82, 0.61)
    assert f["rise"] == 3.25 and f["strict"] and f["wrong_more"] == 4
    assert abs(f["gap"] - 3.0) < 1e-9 and abs(f["gap67"] - 3.0) < 1e-9 and f["halting"] == "median"


def _benchmark(name):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "tools" / "figures" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_align_targets_tabulates_uniform_reports_per_seed_with_mean_and_sd(capsys):
    def report(run, accuracies):
        return {"protocol": "uniform", "method": "pondernet", "halting": "sample", "checkpoints": [f"runs/{run}/best.pt"],
                "buckets": [{"rotation": a, "accuracy": x} for a, x in zip((22.5, 90), accuracies)]}
    _benchmark("align_targets").uniform_table([report("a", [0.99, 0.80]), report("b", [0.97, 0.90])])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == ["| a | 0.9900 | 0.8000 |", "| b | 0.9700 | 0.9000 |",
                         # sd of two values x, y: |x - y| / sqrt(2)
                         "| **pondernet, sample, mean ± sd of 2** | 0.9800 ± 0.0141 | 0.8500 ± 0.0707 |"]


def test_exit_rules_summary_is_the_mean_and_sd_over_checkpoints(capsys):
    def report(gaps, steps):
        return {"buckets": [{"rotation": 45.0, "halting": rule, "gap": g, "mean_steps": n}
                            for rule, g, n in zip(("median", "confidence:0.99"), gaps, steps)]}
    _benchmark("exit_rules").summarise([report([2.0, 0.5], [4.0, 6.0]), report([4.0, 0.1], [5.0, 7.0])])
    lines = capsys.readouterr().out.splitlines()
    assert lines[3:] == ["| median | +3.00 ± 1.41 / 4.50 |", "| confidence:0.99 | +0.30 ± 0.28 / 6.50 |"]


def test_align_cycle_pass_is_the_models_and_damps_from_step_3():
    """tools/figures/align_cycle.py re-runs the align step by hand to damp its turn: at gain 1 it is
    the model's own forward; at gain 0.5 the first two steps are unchanged and step 3 turns half
    as far as the model would from the same view."""
    from ponder_cli.tasks.mnist import prepare_batch
    torch.manual_seed(0)
    model = new_model(PonderConfig.of(step="align", hidden=16, hidden_cnn=16, max_steps=4)).eval()
    with torch.no_grad():
        for layer in (model.step.turn, model.step.view_turn):
            layer.weight.normal_(0, 0.5)
    x = prepare_batch(synthetic_digits(5, seed=2).images, torch.full((5,), 40.0))
    damped_pass = _benchmark("align_cycle").damped_pass
    logits, lambda_logits, turns = damped_pass(model, x)
    with torch.no_grad():
        out = model(x)
    assert torch.allclose(logits, out.logits, atol=1e-5) and torch.allclose(lambda_logits, out.lambda_logits, atol=1e-5)
    _, _, halved = damped_pass(model, x, gain=0.5)
    assert torch.equal(halved[:2], turns[:2]) and torch.count_nonzero(turns[2] - turns[1]) == 5
    assert torch.allclose(halved[2] - halved[1], (turns[2] - turns[1]) / 2, atol=1e-4)
