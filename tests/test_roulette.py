"""Training truncation by roulette (method.truncation_rule = "roulette"): an input whose remaining
halting mass S is below epsilon goes on with probability S / epsilon, and the loss weighs the
steps it computed by the inverse of their probability, so that the loss and its gradient equal
the full computation's in expectation."""

import math

import pytest
import torch
from synthetic_data import synthetic_digits

from ponder_cli import PonderError
from ponder_cli.checkpoint import new_model
from ponder_cli.config import PonderConfig
from ponder_cli.tasks.mnist import prepare_batch
from ponder_cli.model import (FORCED_HALT_LOGIT, Roulette, get_method, halting_as_computed, halting_log_probs,
                              roulette_weights)

STEPS = 5


def logit(p: float) -> float:
    return math.log(p / (1 - p))


def test_weights_by_hand():
    """lambda = 0.5, 0.8, 0.5, ... at epsilon 0.25: S_1 = 0.5, S_2 = 0.1, S_3 = 0.05, so step n is
    reached with probability r_n = min(1, S_{n-1} / 0.25) = 1, 1, 0.4, 0.2, 0.1 (S_4 = 0.025)."""
    lambda_logits = torch.tensor([logit(0.5), logit(0.8), logit(0.5), logit(0.5), logit(0.5)])[:, None].repeat(1, 3)
    weights = roulette_weights(lambda_logits, torch.tensor([5, 3, 1]), 0.25)
    expected = torch.tensor([[1, 1, 1], [1, 1, 0], [2.5, 2.5, 0], [5, 0, 0], [10, 0, 0]], dtype=torch.float32)
    assert torch.allclose(weights, expected, rtol=1e-6)


def test_the_rule_goes_on_with_the_ratio_of_reach_probabilities():
    """The same lambdas: after step 1 r_2 / r_1 = 1 (S_1 = 0.5 is above epsilon), after step 2
    r_3 / r_2 = 0.4, after step 3 0.2 / 0.4 = 0.5. Coins at or above the ratio stop the row (each
    step's decision on its own: no row is dropped between them here)."""
    lambda_logits = torch.tensor([logit(0.5), logit(0.8), logit(0.5)])
    uniforms = torch.tensor([[0.99, 0.39, 0.0], [0.99, 0.41, 0.0], [0.99, 0.0, 0.49], [0.99, 0.0, 0.51]]).t()
    rule = Roulette(0.25, uniforms)  # four rows: (steps, 4) coins
    decisions = [rule.decide(n, False, None, lambda_logits[n].expand(4))[0].tolist() for n in range(3)]
    assert decisions == [[False] * 4, [False, True, False, False], [False, False, False, True]]


def _model(epsilon: float):
    torch.manual_seed(0)
    cfg = PonderConfig.of(step="align", hidden=16, hidden_cnn=16, max_steps=STEPS, cnn_dropout=0.0, lambda_p=0.2,
                          halting_input="state", turn_gate=0.0, truncation=epsilon, truncation_rule="roulette")
    model = new_model(cfg).train()
    with torch.no_grad():
        model.halting_head.bias.fill_(0.5)
        model.halting_head.weight.normal_(0, 0.5)
        model.step.turn.weight.normal_(0, 0.3)
    data = synthetic_digits(6, seed=4)
    return model, get_method(cfg), prepare_batch(data.images, torch.linspace(-40, 40, 6)), data.labels


def _stop_at(t: int) -> torch.Tensor:
    """Coins (steps, 1) that go on through step t - 1 and stop after step t wherever the rule
    gives it a choice."""
    uniforms = torch.zeros(STEPS, 1)
    uniforms[t - 1:] = 1.0
    return uniforms


@pytest.mark.parametrize("epsilon", [0.3, 0.9])
def test_the_expected_loss_and_gradient_are_the_full_computations(epsilon):
    """For each image, sum over every step t it may stop at, P(stop at t) times the loss and
    gradient of the forward stopped there, equals the loss and gradient over every step."""
    model, method, x, labels = _model(epsilon)
    params = [p for p in model.parameters() if p.requires_grad]
    for b in range(x.shape[0]):
        xb, yb = x[b:b + 1], labels[b:b + 1]
        full = model(xb)
        full_loss = method.loss(full.logits, full.lambda_logits, yb).total
        full_grads = torch.autograd.grad(full_loss, params)
        log_s = torch.cumsum(torch.nn.functional.logsigmoid(-full.lambda_logits[:, 0].double()), 0)
        reach = [1.0] + [min(1.0, math.exp(v) / epsilon) for v in log_s[:-1].tolist()] + [0.0]  # r_1 .. r_{N+1}
        expected_loss, expected_grads, stops = 0.0, [torch.zeros_like(p) for p in params], 0
        for t in range(1, STEPS + 1):
            chance = reach[t - 1] - reach[t]  # P(stop after step t)
            if chance <= 0:
                continue
            out = model(xb, stop=Roulette(epsilon, _stop_at(t)))
            assert out.computed.item() == t
            loss = method.loss(out.logits, out.lambda_logits, yb, out.computed).total
            expected_loss += chance * loss.item()
            grads = torch.autograd.grad(loss, params, allow_unused=True)  # after one step the turn is unused
            expected_grads = [e if g is None else e + chance * g for e, g in zip(expected_grads, grads)]
            stops += 1
        assert stops >= 2  # the image really may stop at several steps
        assert math.isclose(expected_loss, full_loss.item(), rel_tol=1e-5)
        for expected, exact in zip(expected_grads, full_grads):
            assert torch.allclose(expected, exact, rtol=1e-4, atol=1e-6)


def test_the_last_computed_step_keeps_its_own_halting():
    """Unlike the cut rule, no mass is moved: the steps computed keep their lambdas, and the
    training metrics halt by the last computed step at the latest (halting_as_computed)."""
    model, _, x, _ = _model(0.9)
    full = model(x)
    out = model(x, stop=Roulette(0.9, torch.ones(STEPS, x.shape[0])))  # stop wherever allowed
    computed = out.computed
    assert computed.min() < STEPS
    for b in range(x.shape[0]):
        n = int(computed[b])
        assert torch.allclose(out.lambda_logits[:n, b], full.lambda_logits[:n, b], atol=1e-6)
        assert (out.lambda_logits[n:, b] == FORCED_HALT_LOGIT).all()
    forced = halting_as_computed(out)
    p = halting_log_probs(forced).exp()
    steps = torch.arange(1, STEPS + 1)[:, None]
    assert (p[steps > computed] < 1e-30).all() and torch.allclose(p.sum(0), torch.ones(x.shape[0]))


def test_the_rule_is_pondernets_and_one_of_two():
    assert PonderConfig.of(step="align", truncation_rule="roulette").method.truncation_rule == "roulette"
    with pytest.raises(PonderError, match="truncation-rule must be one of cut, roulette"):
        PonderConfig.of(truncation_rule="coin")
    with pytest.raises(PonderError, match="truncation-rule applies to --method pondernet"):
        PonderConfig.of(method="act", truncation_rule="roulette")
