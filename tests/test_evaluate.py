"""Evaluation: early exit against forced full steps, and device-side accumulation against a
straightforward per-image computation."""

import math

import pytest
import torch

from ponder_cli.config import PonderConfig
from ponder_cli.data import prepare_batch
from synthetic_data import synthetic_digits
from ponder_cli.tasks.mnist import evaluate, evaluation_draws
from ponder_cli.halting import logits_at, sample_halting_steps
from ponder_cli.methods import geometric_log_prior, ponder_loss
from ponder_cli.checkpoint import load_model, new_model
from ponder_cli.data import load_mnist
from ponder_cli.methods import get_method
from ponder_cli.train import batch_step, train_one_epoch

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
            step = int(sample_halting_steps(out.lambda_logits, uniforms[:, i:i + 1])[0])
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
    assert math.isclose(result.loss, full, rel_tol=1e-5)  # batches of 50, 50, 30 re-weighted exactly


def test_training_metrics_accumulated_on_device_equal_per_batch_values(monkeypatch):
    model, data = _model_and_data(230)  # batches of 50, 50, 50, 50, 30
    method = get_method(CFG)
    recorded = []
    loss = method.loss

    def recording(logits, lambda_logits, targets, computed=None):
        parts = loss(logits, lambda_logits, targets, computed)
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
