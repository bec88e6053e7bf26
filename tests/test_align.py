"""The align step function: the warp, gradients to the turn head, truncated training, early exit."""

import json
import math

import pytest
import torch

from ponder_cli import PonderError, PonderWarning
from ponder_cli.config import PonderConfig
from ponder_cli.tasks.mnist import evaluate, prepare_batch
from synthetic_data import synthetic_digits
from ponder_cli.model import FORCED_HALT_LOGIT, get_method, halting_log_probs
from ponder_cli.checkpoint import load_checkpoint, new_model
from ponder_cli.folders import shipped_path
from ponder_cli.steps.align import rotate_bilinear

SMALL = dict(step="align", hidden=16, hidden_cnn=16, max_steps=6)


@pytest.mark.parametrize("degrees", [90.0, -90.0, 180.0])
def test_warp_is_a_rotation_about_the_centre(degrees, tv):
    """Quarter and half turns map pixel centres onto pixel centres: bilinear sampling is exact
    there, so the warp must equal torchvision's rotation (counter-clockwise positive)."""
    images = synthetic_digits(3, seed=1).images.unsqueeze(1).float()
    ours = rotate_bilinear(images, torch.full((3,), math.radians(degrees)))
    T, TF = tv
    theirs = TF.rotate(images, degrees, interpolation=T.InterpolationMode.BILINEAR)
    assert torch.allclose(ours, theirs, atol=1e-3)


def test_warp_keeps_the_background_and_turns_a_bar():
    image = torch.zeros(1, 28, 28, dtype=torch.uint8)
    image[0, 13:15, 6:22] = 255  # a horizontal bar through the centre
    x = prepare_batch(image)  # normalised: the background is negative
    turned = rotate_bilinear(x, torch.tensor([math.radians(90)]))[0, 0]
    assert torch.allclose(turned[0], x[0, 0, 0])  # the corners read background, not zero
    bright = turned > 0
    assert bright[:, 13:15].sum() >= 28 and bright.sum(1).max() <= 3  # now a vertical bar


def test_gradient_reaches_the_turn_head():
    torch.manual_seed(0)
    cfg = PonderConfig.of(**SMALL)
    model, method = new_model(cfg), get_method(cfg)
    data = synthetic_digits(8, seed=3)
    out = model(prepare_batch(data.images, torch.full((8,), 30.0)))
    method.loss(out.logits, out.lambda_logits, data.labels).total.backward()
    turn = model.step.turn
    assert turn.weight.grad.abs().sum() > 0 and turn.bias.grad.abs() > 0  # zero-initialised, yet learns


def _truncated_and_full(epsilon, method_name="pondernet", bias=-1.0):
    torch.manual_seed(0)
    cfg = PonderConfig.of(**SMALL, method=method_name, truncation=epsilon, cnn_dropout=0.0)
    model, method = new_model(cfg).train(), get_method(cfg)
    with torch.no_grad():
        model.halting_head.bias.fill_(bias)
        model.halting_head.weight.normal_(0, 0.5)  # halting that varies from image to image
    data = synthetic_digits(64, seed=4)
    x = prepare_batch(data.images, torch.linspace(-40, 40, 64))
    full = model(x)
    truncated = model(x, stop=method.truncation(64, "cpu"))
    loss = lambda out: method.loss(out.logits, out.lambda_logits, data.labels)  # noqa: E731
    return model, full, truncated, loss(full), loss(truncated)


def test_truncation_with_epsilon_to_zero_equals_the_full_computation():
    model, full, truncated, full_loss, truncated_loss = _truncated_and_full(1e-30)
    assert (truncated.computed == 6).all()
    assert torch.allclose(truncated.logits, full.logits)
    assert torch.allclose(truncated.lambda_logits[:-1], full.lambda_logits[:-1])  # the last is forced anyway
    assert torch.allclose(truncated_loss.total, full_loss.total, rtol=1e-6)
    grads = [torch.autograd.grad(loss.total, model.halting_head.weight)[0]
             for loss in (full_loss, truncated_loss)]
    assert torch.allclose(*grads, atol=1e-6)


def test_truncation_moves_the_small_remaining_mass_onto_the_last_computed_step():
    epsilon = 0.05
    _, full, truncated, full_loss, truncated_loss = _truncated_and_full(epsilon, bias=0.5)
    computed = truncated.computed
    assert computed.min() < 6 and (computed < 6).sum() > 20  # many images really stopped early
    p_full = halting_log_probs(full.lambda_logits).exp()  # (steps, B)
    p_trunc = halting_log_probs(truncated.lambda_logits).exp()
    for b in range(64):
        n = int(computed[b])
        assert torch.allclose(p_trunc[:n - 1, b], p_full[:n - 1, b])  # earlier steps untouched
        assert torch.isclose(p_trunc[n - 1, b], p_full[n - 1:, b].sum(), atol=1e-6)  # the tail, moved
        assert (p_trunc[n:, b] < 1e-30).all()  # sigmoid(-FORCED_HALT_LOGIT) underflows
        if n < 6:
            assert p_full[n:, b].sum() < epsilon  # only a tail below epsilon was dropped
            assert truncated.lambda_logits[n - 1, b] == FORCED_HALT_LOGIT
    # the loss changes by at most epsilon times the largest per-step cross-entropy
    ce = torch.nn.functional.cross_entropy(full.logits.transpose(1, 2), synthetic_digits(64, seed=4).labels.expand(6, 64),
                                           reduction="none")
    assert abs(truncated_loss.reconstruction - full_loss.reconstruction) <= epsilon * ce.max()


def test_act_truncation_is_exact():
    _, full, truncated, full_loss, truncated_loss = _truncated_and_full(0.5, method_name="act", bias=0.0)
    assert truncated.computed.min() < 6
    assert torch.allclose(truncated_loss.total, full_loss.total, rtol=1e-6)


@pytest.mark.parametrize("method_name", ["pondernet", "act"])
@pytest.mark.parametrize("halting", ["sample", "median"])
def test_align_early_exit_equals_every_step(method_name, halting):
    torch.manual_seed(1)
    cfg = PonderConfig.of(**SMALL, method=method_name, halting_input="state+turn")
    model = new_model(cfg).eval()
    with torch.no_grad():
        model.step.turn.weight.normal_(0, 0.5)  # really turning
        model.halting_head.bias.fill_(-1.5 if method_name == "pondernet" else -0.3)
    data = synthetic_digits(150, seed=5)
    early = evaluate(model, data, cfg, max_angle=60, seed=2, halting=halting, batch_size=64)
    forced = evaluate(model, data, cfg, max_angle=60, seed=2, halting=halting, batch_size=64, early_exit=False)
    assert early == forced and 1 < early.mean_steps < 6


def test_turn_input_needs_a_step_that_turns():
    with pytest.raises(PonderError, match="state\\+turn.*mlp"):  # the input asked for, and the step lacking it
        PonderConfig.of(halting_input="state+turn")
    assert new_model(PonderConfig.of(**SMALL, halting_input="state+confidence+turn")).halting_head.in_features == 18


def test_a_setting_of_another_step_is_refused_when_given_and_a_warning_when_saved():
    with pytest.raises(PonderError, match="^--cnn-dropout-mask.*--step mlp.*align"):
        PonderConfig.of(**SMALL, cnn_dropout_mask="per-step")
    saved = {**PonderConfig.of(**SMALL).to_dict(), "cnn_dropout_mask": "per-step"}
    with pytest.warns(PonderWarning, match=r"^run x: cnn_dropout_mask = 'per-step'.*--step mlp.*align"):
        assert PonderConfig.from_dict(saved, saved="run x").step.cnn_dropout_mask == "per-step"


def test_prior_halting_bias():
    cfg = PonderConfig.of(**SMALL, lambda_p=0.2, halting_bias="prior")
    assert math.isclose(cfg.method.halting_bias, math.log(0.2 / 0.8))
    assert torch.isclose(torch.sigmoid(new_model(cfg).halting_head.bias), torch.tensor(0.2))


def test_turn_gate_holds_halting_back_while_turning():
    from ponder_cli.steps.align import gated_logit
    z = torch.tensor([-3.0, 0.0, 3.0, 20.0])
    work = torch.tensor([0.0, 0.5, 0.9, 1.0])
    # lambda = sigmoid(z) * (1 - work): 0.0474, 0.25, 0.0953, ~0 (a full turn never halts)
    expected = torch.sigmoid(z) * (1 - work)
    assert torch.allclose(torch.sigmoid(gated_logit(z, work)), expected, atol=2e-6)
    torch.manual_seed(2)
    cfg = PonderConfig.of(**SMALL, turn_gate=0.5)
    model = new_model(cfg).eval()
    with torch.no_grad():
        model.step.turn.weight.normal_(0, 0.5)
    data = synthetic_digits(100, seed=6)
    early = evaluate(model, data, cfg, max_angle=60, seed=2, halting="median", batch_size=32)
    assert early == evaluate(model, data, cfg, max_angle=60, seed=2, halting="median", early_exit=False)
    with pytest.raises(PonderError, match="^--turn-gate.*--step align.*mlp"):
        PonderConfig.of(turn_gate=0.5)


@pytest.mark.parametrize("method_name", ["pondernet", "act", "plain"])
def test_align_through_every_command(method_name, tiny_mnist, tmp_path, ponder):
    """Train, resume, then eval / extrapolate / sweep / compare an align model of each method."""
    out = tmp_path / method_name
    common = ["--step", "align", "--method", method_name, "--val-size", 100, "--batch-size", 100, "--no-progress",
              "--train-size", 300, "--data-dir", tiny_mnist]
    steps = [] if method_name == "plain" else ["--max-steps", 4, "--truncation", 0.01, "--halting-input", "state+turn"]
    first = ponder("train", *common, *steps, "--epochs", 1, "--out", out)
    assert first.exit_code == 0, first.output
    resumed = ponder("train", "--resume", out / "last.pt", "--epochs", 2, "--data-dir", tiny_mnist, "--no-progress")
    assert resumed.exit_code == 0, resumed.output
    assert "resuming after epoch 1" in resumed.stderr and "epoch  2/2" in resumed.stderr
    state = torch.load(out / "last.pt", weights_only=True)
    assert state["epoch"] == 2 and state["config"]["step"] == "align" and state["config"]["method"] == method_name
    for command, args in (("eval", []), ("extrapolate", ["--angles", 45, 90]), ("sweep", ["--every", 45])):
        result = ponder(command, out / "best.pt", *args, "-f", "json", "--limit", 50, "--data-dir", tiny_mnist)
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["step"] == "align" and data["method"] == method_name
        assert all(1 <= b["mean_steps"] <= (1 if method_name == "plain" else 4) for b in data["buckets"])
    table = ponder("compare", out / "best.pt", "--angles", 30, "--limit", 50, "--data-dir", tiny_mnist)
    assert table.exit_code == 0 and "align" in table.stdout


def test_align_implies_its_halting_settings_unless_given():
    cfg = PonderConfig.of(step="align")
    assert (cfg.method.max_steps, cfg.method.lambda_p, cfg.method.truncation, cfg.method.halting_input,
            cfg.step.turn_gate) == \
        (12, 0.5, 0.1, "state+turn", 0.2)
    assert math.isclose(cfg.method.halting_bias, 0.0)  # logit(0.5)
    assert math.isclose(PonderConfig.of(step="align", lambda_p=0.2).method.halting_bias, math.log(0.25))
    assert PonderConfig.of(step="align", method="plain").method.max_steps == 1
    given = PonderConfig.of(step="align", truncation=0.0, turn_gate=0.0, halting_input="state")
    assert (given.method.truncation, given.step.turn_gate, given.method.halting_input) == (0.0, 0.0, "state")
    assert PonderConfig.of().method.truncation == 0.0  # the mlp reference is untouched


@pytest.mark.parametrize("angle", [0.0, math.pi / 2, 0.3, -1.1])
def test_warp_gradient_in_the_angle_is_the_central_difference_at_every_pixel(angle):
    """Each output pixel's derivative in theta against a float64 central difference. At 0 (where
    every image starts: the turn heads are zero) and at pi/2 the samples sit on pixel centres,
    where bilinear sampling has a kink: the gradient must be the mean of both sides along each
    axis, the central difference's limit (grid_sample's own backward takes one side; averaging
    over a diagonal move instead is off by up to 2.5e-3 on 118 of these 1,568 pixels). Elsewhere it is
    the ordinary derivative. eps 1e-8: on the kink the difference's own error is O(eps) (the two
    sides' curvatures differ), about 1e-6 here."""
    x = prepare_batch(synthetic_digits(2, seed=3).images, torch.full((2,), 30.0)).double()
    angles = torch.full((2,), angle, dtype=torch.float64, requires_grad=True)
    out = rotate_bilinear(x, angles)
    # gradcheck's comparison, each pixel's backward batched into one call: the whole Jacobian
    # (pixels x angles, the cross terms zero) against the central difference in each angle
    rows = torch.eye(out.numel(), dtype=torch.float64).reshape(-1, *out.shape)
    (analytic,) = torch.autograd.grad(out, angles, rows, is_grads_batched=True)
    eps, numeric = 1e-8, torch.empty_like(analytic)
    with torch.no_grad():
        for j, step in enumerate(torch.eye(2, dtype=torch.float64) * eps):
            numeric[:, j] = ((rotate_bilinear(x, angles + step) - rotate_bilinear(x, angles - step)) / (2 * eps)).flatten()
    torch.testing.assert_close(analytic, numeric, rtol=1e-3, atol=1e-5)  # gradcheck's tolerances


def test_the_rotation_grid_is_affine_grids():
    """rotation_grid computes affine_grid's grid for the rotation matrices elementwise; on this
    project's CPUs the floats are the same, and within a unit in the last place on any."""
    import torch.nn.functional as F
    from ponder_cli.steps.align import rotation_grid

    angles = torch.randn(64, generator=torch.Generator().manual_seed(0)) * 2
    cos, sin, zeros = torch.cos(angles), torch.sin(angles), torch.zeros(64)
    matrices = torch.stack([torch.stack([cos, -sin, zeros], -1), torch.stack([sin, cos, zeros], -1)], 1)
    for size in ((64, 1, 28, 28), (64, 3, 5, 8)):
        expected = F.affine_grid(matrices, list(size), align_corners=False)
        assert torch.allclose(rotation_grid(angles, size), expected, rtol=0, atol=2.4e-7)


def test_warp_forward_and_image_gradient_are_grid_samples():
    import torch.nn.functional as F
    from ponder_cli.steps.align import rotation_grid

    x = prepare_batch(synthetic_digits(4, seed=3).images, torch.full((4,), 30.0)).requires_grad_()
    angles = torch.tensor([0.0, 0.3, -1.0, 2.0])
    ours = rotate_bilinear(x, angles)
    background = x.amin(dim=(1, 2, 3), keepdim=True)
    theirs = F.grid_sample(x - background, rotation_grid(angles, x.shape), mode="bilinear", padding_mode="zeros",
                           align_corners=False) + background
    assert torch.equal(ours, theirs)
    weights = torch.randn(ours.shape, generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.autograd.grad((weights * ours).sum(), x)[0],
                       torch.autograd.grad((weights * theirs).sum(), x)[0])


def test_halting_input_does_not_reach_the_turn():
    """With the halting head blind to the readout, the halting logits depend on the turn heads
    only through the turn they read (state+turn): that input is detached, so no gradient."""
    torch.manual_seed(0)
    cfg = PonderConfig.of(**{**SMALL, "max_steps": 3}, halting_input="state+turn", cnn_dropout=0.0)
    model = new_model(cfg)
    with torch.no_grad():
        model.halting_head.weight.normal_(0, 1.0)
        model.halting_head.weight[:, :-1] = 0  # only the turn feature is read
        for layer in (model.step.turn, model.step.view_turn):
            layer.weight.normal_(0, 0.5)
    x = prepare_batch(synthetic_digits(4, seed=3).images, torch.full((4,), 30.0))
    out = model(x)
    turn = [*model.step.turn.parameters(), *model.step.view_turn.parameters()]
    grads = torch.autograd.grad(out.lambda_logits.sum(), turn, allow_unused=True)
    assert all(g is None or torch.count_nonzero(g) == 0 for g in grads)
    extra = torch.rand(3, 4, 1, requires_grad=True)  # the heads alone: no gradient to the extra
    lambda_logits = model.heads(torch.randn(3, 4, cfg.step.hidden), extra)[1]
    assert torch.autograd.grad(lambda_logits.sum(), extra, allow_unused=True)[0] is None


def test_the_work_is_the_net_turn_of_two_steps():
    """A turn that swings back by as much as it last turned does no work (the shipped model's
    two-step cycle, docs/align.md), one that keeps turning the same way does: the work is
    |delta_n + delta_{n-1}| / (2 align-turn) = |theta_n - theta_{n-2}| / (2 align-turn)."""
    step = new_model(PonderConfig.of(**SMALL)).step.eval()
    with torch.no_grad():
        step.turn.bias.fill_(math.atanh(0.5))  # the turn heads' weights are zero: every step turns by +15°
    x = prepare_batch(synthetic_digits(3, seed=1).images)
    context, (h, _, _) = step.start(x, SMALL["max_steps"])
    before = torch.deg2rad(torch.tensor([10.0, 10.0, -20.0]))
    previous = torch.deg2rad(torch.tensor([-15.0, 15.0, 5.0]))  # the last turns: back, on, on a little
    (_, after, delta), _, work = step(context, (h, before, previous), 1)
    assert torch.allclose(torch.rad2deg(delta), torch.full((3,), 15.0))
    assert torch.allclose(torch.rad2deg(after), torch.tensor([25.0, 25.0, -5.0]))
    assert torch.allclose(work.squeeze(-1), torch.tensor([0.0, 30 / 60, 20 / 60]), atol=1e-6)


def test_act_keeps_graves_bias_on_align_unless_given():
    act = PonderConfig.of(step="align", method="act")
    assert act.method.halting_bias == 1.0  # Graves' bias: the method's implied value wins over the step's
    assert act.sources({"step": "align", "method": "act"})["halting_bias"] == "implied by --method act"
    assert PonderConfig.of(step="align", method="act", halting_bias="-2").method.halting_bias == -2.0
    assert PonderConfig.of(step="align", method="pondernet").method.halting_bias == 0.0  # logit(0.5)
    assert torch.equal(new_model(act).halting_head.bias, torch.tensor([1.0]))
    # the "deep start" of the halting study: -3 given, on both methods, is the head's bias
    for method in ("act", "pondernet"):
        deep = PonderConfig.of(**SMALL, method=method, halting_bias=-3.0)
        assert torch.equal(new_model(deep).halting_head.bias, torch.tensor([-3.0]))


def test_a_saved_config_keeps_the_truncation_it_was_trained_with():
    """Checkpoints hold every resolved value, not what a step implied: the shipped align model
    trained at truncation 0.01, the implied value then, and loads with 0.01."""
    state = load_checkpoint(shipped_path("align"))
    assert state.config.method.truncation == 0.01
    assert PonderConfig.of(step="align").method.truncation == 0.1
