import math

import pytest

import torch

from ponder_cli.model import geometric_log_prior, halting_log_probs, kl_to_prior, ponder_loss, reconstruction_loss


def test_halting_distribution_by_hand():
    # lambda_1 = sigmoid(0) = 1/2, lambda_2 = sigmoid(ln 3) = 3/4, lambda_3 forced to 1:
    # p = (1/2, 1/2 * 3/4, 1/2 * 1/4 * 1) = (0.5, 0.375, 0.125)
    z = torch.tensor([[0.0], [math.log(3)], [-5.0]])
    p = halting_log_probs(z).exp()[:, 0]
    assert torch.allclose(p, torch.tensor([0.5, 0.375, 0.125]), atol=1e-7)


def test_p_sums_to_one_per_sample():
    z = torch.randn(20, 64) * 4
    assert torch.allclose(halting_log_probs(z).exp().sum(0), torch.ones(64), atol=1e-5)


def test_geometric_prior_is_normalised_truncated_geometric():
    # lambda_p = 0.5, 3 steps: (1/2, 1/4, 1/8) / (7/8) = (4/7, 2/7, 1/7)
    prior = geometric_log_prior(0.5, 3).exp()
    assert torch.allclose(prior, torch.tensor([4 / 7, 2 / 7, 1 / 7]), atol=1e-7)
    # lambda_p = 0.2, 20 steps: lambda (1 - lambda)^(k-1) / (1 - 0.8^20)
    prior = geometric_log_prior(0.2, 20).exp()
    expected = torch.tensor([0.2 * 0.8 ** k for k in range(20)]) / (1 - 0.8 ** 20)
    assert torch.allclose(prior, expected, atol=1e-7)
    assert geometric_log_prior(1.0, 4).isfinite().all()  # all mass on step 1, log 0 clamped


def test_losses_by_hand():
    # Two steps, one image, two classes, target 0.
    # Step 1: lambda = 1/2, logits (0, 0): CE = ln 2.  Step 2: p = 1/2, logits (ln 3, 0): CE = ln(4/3).
    logits = torch.tensor([[[0.0, 0.0]], [[math.log(3), 0.0]]])
    lambda_logits = torch.tensor([[0.0], [7.0]])
    target = torch.tensor([0])
    log_prior = geometric_log_prior(0.5, 2)  # (2/3, 1/3)
    parts = ponder_loss(logits, lambda_logits, target, log_prior, beta=0.1)
    rec = 0.5 * math.log(2) + 0.5 * math.log(4 / 3)  # 0.5 ln(8/3) = 0.490415
    kl = 0.5 * math.log(0.5 / (2 / 3)) + 0.5 * math.log(0.5 / (1 / 3))  # 0.5 ln(9/8) = 0.058892
    assert math.isclose(parts.reconstruction.item(), rec, rel_tol=1e-6)
    assert math.isclose(parts.regularisation.item(), kl, rel_tol=1e-5)
    assert math.isclose(parts.total.item(), rec + 0.1 * kl, rel_tol=1e-6)


def test_reconstruction_weights_each_sample_by_its_own_p():
    # Image A is right at step 1 and wrong at step 2; image B the opposite. Each puts all its
    # halting mass on the step where it is right, so the per-sample expected loss is small.
    right, wrong = [10.0, -10.0], [-10.0, 10.0]
    logits = torch.tensor([[right, wrong], [wrong, right]])  # (steps=2, B=2, classes=2)
    targets = torch.tensor([0, 0])
    p = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # (steps, B)
    ours = reconstruction_loss(logits, targets, p).item()
    assert ours < 1e-8
    # The reference's flaw: p_n times a batch-mean CE, which is 10 at both steps here.
    ce_mean = torch.stack([torch.nn.functional.cross_entropy(logits[n], targets) for n in range(2)])
    flawed = (p.mean(1) * ce_mean).sum().item()
    assert math.isclose(flawed, 10.0, rel_tol=1e-4)


def test_kl_finite_when_p_underflows_to_zero():
    z = torch.full((20, 4), -200.0)  # lambda ~ e^-200: p_n underflows to 0 for n < 20
    z[0, 1] = 200.0  # lambda_1 ~ 1: every later p_n is 0
    log_p = halting_log_probs(z)
    p = log_p.exp()
    assert (p == 0).any()
    kl = kl_to_prior(p, log_p, geometric_log_prior(0.2, 20))
    assert torch.isfinite(kl)
    z.requires_grad_(True)
    loss = ponder_loss(torch.zeros(20, 4, 10), z, torch.zeros(4, dtype=torch.long), geometric_log_prior(0.2, 20), 0.01).total
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(z.grad).all()


def test_kl_by_hand_in_the_papers_direction():
    # Three steps, lambda_p = 1/2: the truncated prior is (4/7, 2/7, 1/7).
    # Image A: lambda = (1/2, 3/4, 1) gives p = (1/2, 3/8, 1/8), as in the test above.
    # Image B: lambda = (4/7, 2/3, 1) gives p = (4/7, 2/7, 1/7), the prior itself.
    z = torch.tensor([[0.0, math.log(4 / 3)], [math.log(3), math.log(2)], [-5.0, -5.0]])
    log_p = halting_log_probs(z)
    log_prior = geometric_log_prior(0.5, 3)
    # KL(p_A || prior) = 1/2 ln(7/8) + 3/8 ln(21/16) + 1/8 ln(7/8) = 0.0185181; the other
    # direction, KL(prior || p_A) = 5/7 ln(8/7) + 2/7 ln(16/21) = 0.0176842, would fail
    kl_a = 0.5 * math.log(7 / 8) + 0.375 * math.log(21 / 16) + 0.125 * math.log(7 / 8)
    assert math.isclose(kl_to_prior(log_p.exp()[:, :1], log_p[:, :1], log_prior).item(), kl_a, rel_tol=1e-5)
    assert abs(kl_to_prior(log_p.exp()[:, 1:], log_p[:, 1:], log_prior).item()) < 1e-7
    # the batch's KL is the mean over its images
    assert math.isclose(kl_to_prior(log_p.exp(), log_p, log_prior).item(), kl_a / 2, rel_tol=1e-5)


# The halting study's training settings: the prior's shape, the KL warm-up ----------------------

def test_the_uniform_prior_is_one_over_the_steps_and_pulls_towards_even_halting():
    from ponder_cli.model import log_prior
    assert torch.allclose(log_prior("uniform", 0.2, 4).exp(), torch.full((4,), 0.25))
    assert torch.equal(log_prior("geometric", 0.2, 4), geometric_log_prior(0.2, 4))
    # halting spread evenly over 4 steps is at KL 0 from the uniform prior, not from the geometric one
    even = torch.tensor([[1 / 4], [1 / 3], [1 / 2], [0.0]]).logit()  # lambda_n = 1 / (steps left)
    log_p = halting_log_probs(even)
    assert torch.allclose(log_p.exp()[:, 0], torch.full((4,), 0.25), atol=1e-6)
    assert kl_to_prior(log_p.exp(), log_p, log_prior("uniform", 0.2, 4)).abs() < 1e-6
    # 1/4 sum_n log((1/4) / p_G(n)), p_G(n) = 0.2 * 0.8^(n-1) / (1 - 0.8^4): 0.0309
    assert float(kl_to_prior(log_p.exp(), log_p, log_prior("geometric", 0.2, 4))) == pytest.approx(0.03090, abs=1e-4)


def test_the_kl_weight_warms_up_linearly_over_the_optimizer_steps_then_stays_at_beta():
    from ponder_cli.config import PonderConfig
    from ponder_cli.model import get_method
    method = get_method(PonderConfig.of(beta=0.04, beta_warmup=8, max_steps=3))
    weights = [float(method.kl_weight(torch.tensor(float(t)))) for t in (0, 2, 4, 8, 100)]
    assert weights == pytest.approx([0.0, 0.01, 0.02, 0.04, 0.04])
    assert method.kl_weight(None) == 0.04  # an evaluation's loss: the trained weight
    assert get_method(PonderConfig.of(beta=0.04, max_steps=3)).kl_weight(torch.tensor(0.0)) == 0.04  # off
    # the loss reads it: at step 0 of the warm-up the total is the reconstruction alone
    logits, lambda_logits, targets = torch.randn(3, 5, 10), torch.randn(3, 5), torch.arange(5)
    parts = method.loss(logits, lambda_logits, targets, progress=torch.tensor(0.0))
    assert parts.regularisation > 0 and parts.total == parts.reconstruction
    parts = method.loss(logits, lambda_logits, targets, progress=torch.tensor(4.0))
    torch.testing.assert_close(parts.total, parts.reconstruction + 0.02 * parts.regularisation)
