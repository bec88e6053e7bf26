"""Evaluation: early exit against forced full steps, and device-side accumulation against a
straightforward per-image computation."""

import json
import math

import pytest
import torch

from ponder_cli.config import PonderConfig
from ponder_cli.tasks.mnist import evaluate, evaluation_draws, load_mnist, prepare_batch
from synthetic_data import synthetic_digits
from ponder_cli.model import Sample, geometric_log_prior, get_method, halting_steps, logits_at, ponder_loss
from ponder_cli.checkpoint import load_model, new_model
from ponder_cli.train import batch_step, train_one_epoch
from ponder_cli.api.evaluation import EvalOptions
from ponder_cli.evaluate import evaluate_bucket
from ponder_cli.tasks import derived_seed, get_task, uniforms

CFG = PonderConfig.of(max_steps=8, hidden=16, hidden_cnn=16, hidden_lin=16, batch_size=50)


def _model_and_data(count=300):
    torch.manual_seed(0)
    model = new_model(CFG)
    with torch.no_grad():
        model.halting_head.bias.fill_(-1.5)  # halting spread over many steps
    return model, synthetic_digits(count, seed=3)


def test_early_exit_and_forced_steps_agree_exactly():
    model, data = _model_and_data()
    for batch_size in (64, 300):
        early = evaluate(model, data, CFG, max_angle=45, seed=9, batch_size=batch_size)
        forced = evaluate(model, data, CFG, max_angle=45, seed=9, batch_size=batch_size, early_exit=False)
        assert early == forced
        assert 1.5 < early.mean_steps < 7 and early.std_steps > 0.5
    # the draws do not depend on batching: any batch size gives the same numbers
    assert evaluate(model, data, CFG, max_angle=45, seed=9, batch_size=7) == early
    assert evaluate(model, data, CFG, max_angle=45, seed=10, batch_size=64) != early


@pytest.mark.parametrize("run, rule", [("pn1", "sample"), ("pn1", "median"), ("pn1", "quantile:0.9"),
                                       ("pn1", "patience:2"), ("pn1", "confidence:0.9"), ("pn1", "expected"),
                                       ("act", "sample"), ("plain", "sample")])
def test_the_gpus_full_forward_gives_the_cpus_early_exit_results_for_every_rule(run, rule, runs, tiny_mnist):
    """A GPU evaluates by the full forward and the rule applied on the device (early_exit=False,
    its default there); the CPU by early exit: the same predictions, steps and figures."""
    model, cfg, _ = load_model(runs / run / "best.pt", "cpu")
    data = load_mnist(tiny_mnist, train=False, download=False)
    early = evaluate(model, data, cfg, max_angle=45, seed=9, batch_size=64, halting=rule)
    full = evaluate(model, data, cfg, max_angle=45, seed=9, batch_size=64, halting=rule, early_exit=False)
    assert early == full
    assert torch.equal(early.samples.steps, full.samples.steps)
    assert torch.equal(early.samples.correct, full.samples.correct)
    assert early.images == 200 and 0 < early.accuracy < 1


def test_evaluate_equals_a_per_image_computation():
    model, data = _model_and_data()
    model.eval()
    angles, uniforms = evaluation_draws(len(data), CFG.method.max_steps, 30.0, 4, "cpu")
    steps_list, correct = [], 0
    with torch.no_grad():
        for i in range(len(data)):  # one image at a time, plain Python sums
            out = model(prepare_batch(data.images[i:i + 1], angles[i:i + 1]))
            step = int(halting_steps(Sample(uniforms[:, i:i + 1]), None, out.lambda_logits)[0][0])
            correct += int(logits_at(out.logits, torch.tensor([step])).argmax() == data.labels[i])
            steps_list.append(step)
    mean = sum(steps_list) / len(steps_list)
    std = math.sqrt(sum((s - mean) ** 2 for s in steps_list) / len(steps_list))
    result = evaluate(model, data, CFG, max_angle=30.0, seed=4, batch_size=64)
    assert result.images == len(data)
    assert result.accuracy == correct / len(data)
    assert math.isclose(result.mean_steps, mean, rel_tol=1e-12)
    assert math.isclose(result.std_steps, std, rel_tol=1e-9)


def test_eval_loss_equals_batch_weighted_mean_of_batch_losses():
    model, data = _model_and_data(130)
    model.eval()
    log_prior = geometric_log_prior(CFG.method.lambda_p, CFG.method.max_steps)
    with torch.no_grad():
        out = model(prepare_batch(data.images))
        full = ponder_loss(out.logits, out.lambda_logits, data.labels, log_prior, CFG.method.beta).total.item()
    result = evaluate(model, data, CFG, max_angle=0, seed=1, batch_size=50, with_loss=True)
    assert math.isclose(result.objective, full, rel_tol=1e-5)  # batches of 50, 50, 30 re-weighted exactly


@pytest.mark.parametrize("rule", ["fixed:1", "fixed:8", "sample", "median", "patience:1", "expected"])
def test_eval_loss_is_the_cross_entropy_of_the_prediction_under_the_halting_used(rule):
    """fixed:N: y_N's cross-entropy; an exit rule: each input's at the step it halted at;
    expected: the p-weighted mean prediction's. The training objective stays what it was."""
    model, data = _model_and_data(130)
    model.eval()
    with torch.no_grad():
        out = model(prepare_batch(data.images))
    steps, images = out.logits.shape[:2]
    ce = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), data.labels.repeat(steps),
                                           reduction="none").view(steps, images).double()  # (steps, B)
    result = evaluate(model, data, CFG, max_angle=0, seed=1, batch_size=50, with_loss=True, halting=rule)
    if rule == "expected":
        p = get_method(CFG).halting_distribution(out.lambda_logits)  # (steps, B)
        mixed = (p[..., None] * torch.softmax(out.logits, -1)).sum(0)  # (B, classes)
        direct = -mixed.gather(1, data.labels[:, None]).log().mean().item()
    else:
        halted = result.samples.steps.long()  # each input's halting step, as evaluated
        direct = ce.gather(0, halted[None] - 1).mean().item()
    assert math.isclose(result.loss, direct, rel_tol=1e-5)
    if rule.startswith("fixed:"):
        assert math.isclose(result.loss, ce[int(rule[6:]) - 1].mean().item(), rel_tol=1e-5)
    log_prior = geometric_log_prior(CFG.method.lambda_p, CFG.method.max_steps)
    objective = ponder_loss(out.logits, out.lambda_logits, data.labels, log_prior, CFG.method.beta)
    assert math.isclose(result.objective, objective.total.item(), rel_tol=1e-5)
    assert math.isclose(result.reconstruction, objective.reconstruction.item(), rel_tol=1e-5)


def test_training_metrics_accumulated_on_device_equal_per_batch_values(monkeypatch):
    model, data = _model_and_data(230)  # batches of 50, 50, 50, 50, 30
    method = get_method(CFG)
    recorded = []
    loss = method.loss

    def recording(logits, lambda_logits, targets, computed=None, progress=None):
        parts = loss(logits, lambda_logits, targets, computed, progress)
        recorded.append((parts.total.item(), parts.regularisation.item(), targets.shape[0]))
        return parts

    monkeypatch.setattr(method, "loss", recording)
    step = batch_step(model, CFG, data)
    step.method = method
    stats = train_one_epoch(step, progress=False)
    assert [n for *_, n in recorded] == [50, 50, 50, 50]  # whole batches: the last 30 images wait for another epoch
    expected_loss = sum(loss * n for loss, _, n in recorded) / 200
    expected_reg = sum(reg * n for _, reg, n in recorded) / 200
    assert math.isclose(stats["loss"], expected_loss, rel_tol=1e-6)
    assert math.isclose(stats["regularisation"], expected_reg, rel_tol=1e-6)
    assert stats["skipped_batches"] == 0 and stats["batches"] == 4
    assert 0 <= stats["accuracy"] <= 1 and 1 <= stats["steps"] <= CFG.method.max_steps


# Evaluation's draws: per input, from (seed, stream, bucket, index) ----------------------------------

def _splitmix64_uniform(seed, stream, key, index, column):
    """tasks.uniforms written out in Python integers: splitmix64's finaliser over the input's
    counter, then over the column's."""
    mask, golden = (1 << 64) - 1, 0x9E3779B97F4A7C15

    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    row = mix((index * golden + derived_seed(stream, seed, *key)) & mask)
    return (mix((row + (column + 1) * golden) & mask) >> 11) * 2.0 ** -53


def test_uniforms_are_splitmix64_bit_for_bit_whatever_the_inputs_around_them():
    index = torch.tensor([0, 1, 7, 9999, 2 ** 40])
    drawn = uniforms(5, "coins", ("uniform", 45.0), index, 3)
    assert drawn.dtype == torch.float64
    assert drawn.tolist() == [[_splitmix64_uniform(5, "coins", ("uniform", 45.0), i, j) for j in range(3)]
                              for i in index.tolist()]
    # an input's numbers do not depend on which inputs are drawn beside it, nor on the row's length
    assert torch.equal(uniforms(5, "coins", ("uniform", 45.0), torch.tensor([7]), 5)[0, :3], drawn[2])
    coins = uniforms(5, "coins", ("uniform", 45.0), torch.arange(20_000), 20, torch.float32)
    assert coins.dtype == torch.float32 and 0 <= coins.min() and coins.max() < 1  # 24 bits: never 1.0
    assert abs(float(coins.mean()) - 0.5) < 0.005 and abs(float(coins.std()) - 12 ** -0.5) < 0.005


def test_a_limited_evaluation_is_exactly_the_first_images_of_the_full_one(runs, tiny_mnist):
    """`--limit 50` (the task's test data, as every command reads it) gives the first 50 images
    of the full evaluation, image by image: the same rotation, steps and answer each."""
    model, cfg, _ = load_model(runs / "pn1" / "best.pt", "cpu")
    task = get_task(cfg)
    for protocol, spec, specs in (("uniform", 45.0, [45.0]), ("band", 90.0, [45.0, 90.0]), ("fixed", 30.0, [30.0])):
        results = {}
        for limit in (50, 0):
            data = task.test_data(EvalOptions(limit=limit, data_dir=tiny_mnist, download=False), "cpu")
            bucket = task.bucket(data, spec, specs, model.max_steps, 9, protocol)
            results[limit] = evaluate_bucket(model, bucket, cfg, batch_size=64 if limit else 37).samples
        limited, full = results[50], results[0]
        assert len(full.steps) == 200 and len(limited.steps) == 50
        for field in ("difficulty", "steps", "correct"):
            assert torch.equal(getattr(limited, field), getattr(full, field)[:50]), (protocol, field)
        assert full.steps.std() > 0 and full.difficulty.max() > 0


def test_each_bucket_draws_its_own_rotations_and_coins_whatever_buckets_stand_beside_it():
    draws = {spec: evaluation_draws(2000, 8, spec[1], 4, "cpu", protocol=spec[0], lower=spec[2])
             for spec in (("uniform", 45.0, 0.0), ("uniform", 45.0, 22.5), ("uniform", 90.0, 45.0),
                          ("band", 90.0, 45.0), ("band", 90.0, 67.5), ("fixed", 90.0, 0.0))}
    # a uniform bucket has no inner edge: the same draws whichever bucket comes before it
    first, again = draws[("uniform", 45.0, 0.0)], draws[("uniform", 45.0, 22.5)]
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    # every other pair of buckets: unrelated coins, and unrelated rotations (as fractions of the bucket)
    distinct = [spec for spec in draws if spec != ("uniform", 45.0, 22.5)]
    for a, b in ((a, b) for i, a in enumerate(distinct) for b in distinct[i + 1:]):
        coins = torch.corrcoef(torch.stack([draws[a][1].flatten(), draws[b][1].flatten()]).double())[0, 1]
        assert abs(float(coins)) < 0.03, (a, b)
        signs = torch.corrcoef(torch.stack([draws[a][0].sign(), draws[b][0].sign()]))[0, 1]
        assert abs(float(signs)) < 0.1, (a, b)
    assert draws[("fixed", 90.0, 0.0)][0].abs().eq(90).all()
    band = draws[("band", 90.0, 67.5)][0].abs()
    assert band.min() >= 67.5 and band.max() <= 90


def test_every_command_draws_with_the_checkpoints_training_seed_by_default(runs, tiny_mnist, ponder):
    """One seed rule: --seed, else the checkpoint's training seed (pn1: seed 1); compare takes its
    checkpoints' when they share one (a model's figures there are its eval figures), else 1234,
    whatever order they are named in."""
    common = ["--angles", 45, 90, "--limit", 120, "--data-dir", tiny_mnist, "-f", "json"]
    alone = json.loads(ponder("extrapolate", runs / "pn1", *common).stdout)
    beside = json.loads(ponder("compare", runs / "pn1", runs / "pn1" / "last.pt", *common).stdout)
    swept = json.loads(ponder("sweep", runs / "pn1", "--to", 0, "--limit", 20, "--data-dir", tiny_mnist, "-f", "json").stdout)
    calibrated = json.loads(ponder("calibrate", runs / "pn1", "--limit", 50, "--data-dir", tiny_mnist, "-f", "json").stdout)
    assert alone["seed"] == beside["seed"] == swept["seed"] == calibrated["seed"] == 1
    mine = [b for b in beside["buckets"] if b["method"] == "pondernet"]
    assert [(b["accuracy"], b["mean_steps"]) for b in mine] == [(b["accuracy"], b["mean_steps"]) for b in alone["buckets"]]
    mixed = [json.loads(ponder("compare", *pair, *common).stdout) for pair in ((runs / "act", runs / "pn1"),
                                                                               (runs / "pn1", runs / "act"))]
    assert mixed[0]["seed"] == mixed[1]["seed"] == 1234
    rows = [sorted((b["method"], b["rotation"], b["accuracy"], b["mean_steps"]) for b in m["buckets"]) for m in mixed]
    assert rows[0] == rows[1]  # the same figures in either order
    given = json.loads(ponder("compare", runs / "act", runs / "pn1", *common, "--seed", 1).stdout)
    assert given["seed"] == 1
    assert [b["accuracy"] for b in given["buckets"] if b["method"] == "pondernet"] == [b["accuracy"] for b in mine]
