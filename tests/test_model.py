import torch

from ponder_cli.config import PonderConfig
from ponder_cli.model import PonderNet, Sample, halting_steps, logits_at
from ponder_cli.checkpoint import new_model


def small_model(max_steps=6, seed=0, **changes):
    torch.manual_seed(seed)
    return new_model(PonderConfig.of(max_steps=max_steps, hidden=16, hidden_cnn=16, hidden_lin=16, **changes)).eval()


def test_forward_shapes():
    out = small_model()(torch.randn(5, 1, 28, 28))
    assert out.logits.shape == (6, 5, 10)
    assert out.lambda_logits.shape == (6, 5)


def test_split_first_layer_equals_linear_on_concatenation():
    mlp = small_model().step.mlp
    e, h = torch.randn(3, 16), torch.randn(3, 16)
    weight = torch.cat([mlp.from_embedding.weight, mlp.from_state.weight], dim=1)
    concatenated = torch.relu(torch.nn.functional.linear(torch.cat([e, h], 1), weight, mlp.from_embedding.bias))
    expected = torch.relu(mlp.to_state(concatenated))
    assert torch.allclose(mlp(mlp.from_embedding(e), h), expected, atol=1e-6)


def test_mlp_step_dropout_masks_differ_per_step_and_vanish_in_eval():
    model = small_model().train()
    context, _ = model.step.start(torch.randn(4, 1, 28, 28), 6)
    masks = context[0]  # (B, steps, L), scaled by 1 / (1 - p)
    assert masks.shape == (4, 6, 16) and set(masks.unique().tolist()) <= {0.0, 1 / 0.8}
    assert not torch.equal(masks[:, 0], masks[:, 1])
    assert model.eval().step.start(torch.randn(4, 1, 28, 28), 6)[0][0] is None


def test_per_step_cnn_mask_on_pooled_maps_equals_masking_conv2_output():
    """Dropout2d scales whole channels by 0 or 1/(1-p); pooling and relu commute with that."""
    encoder = small_model(cnn_dropout_mask="per-step").step.encoder
    x = torch.randn(3, 1, 28, 28)
    channel_mask = torch.tensor([0.0, 2.0]).repeat(10)[torch.randperm(20)].view(1, 20, 1, 1)  # p = 0.5
    after_conv1 = torch.relu(torch.nn.functional.max_pool2d(encoder.conv1(x), 2))
    masked_conv2 = torch.relu(torch.nn.functional.max_pool2d(encoder.conv2(after_conv1) * channel_mask, 2))
    assert torch.allclose(encoder.maps(x, dropout=False) * channel_mask, masked_conv2, atol=1e-6)


def test_per_step_cnn_mask_gives_each_step_its_own_embedding_only_in_training():
    x = torch.randn(64, 1, 28, 28)
    shared = small_model(max_steps=4, cnn_dropout_mask="shared")
    fresh = small_model(max_steps=4, cnn_dropout_mask="per-step")
    assert torch.equal(shared(x).logits, fresh(x).logits)  # same weights; eval mode has no dropout

    encoder = fresh.train().step.encoder
    channel_masks = encoder.channel_masks(4, encoder.maps(x, dropout=False))  # (B, steps, 20, 1, 1)
    assert channel_masks.shape == (64, 4, 20, 1, 1) and set(channel_masks.unique().tolist()) == {0.0, 2.0}
    assert 0.4 < (channel_masks == 0).float().mean() < 0.6  # Dropout2d's p = 0.5
    assert not torch.equal(channel_masks[:, 0], channel_masks[:, 1])
    context, _ = fresh.step.start(x, 4)
    assert len(context) == 1 + 4  # the MLP's masks, then one embedding share per step
    assert not torch.equal(context[1], context[2])
    state, _, _ = fresh.step(context, (None,), 2)  # step n reads its own embedding
    assert torch.equal(state[0], fresh.step.mlp(context[3], None, context[0][:, 2]))
    assert len(shared.train().step.start(x, 4)[0]) == 2  # shared: one embedding for every step


def _start_as_rerunning_fc(step, x, steps):
    """The per-step masks as first written: fc reruns on each step's masked maps. Draws what
    `start` draws, in the same order: the channel masks, then the MLP's masks."""
    encoder = step.encoder
    maps = encoder.maps(x, dropout=False)
    channel_masks = encoder.channel_masks(steps, maps)  # (B, steps, 20, 1, 1)
    masks = step.mlp.dropout_masks(steps, x.shape[0], maps)
    heads = [encoder.head((maps * channel_masks[:, n]).flatten(1)) for n in range(steps)]  # (B, hidden_cnn) each
    # the bound on reordering each head's sum: every term |mask * map * weight|, summed
    term_sums = [(maps * channel_masks[:, n]).flatten(1).abs() @ encoder.fc.weight.abs().T + encoder.fc.bias.abs()
                 for n in range(steps)]
    return masks, heads, term_sums, maps, channel_masks


def test_per_step_cnn_masks_project_each_channel_once_exactly_as_rerunning_fc():
    """fc on the masked maps, rerun at every step, against the channel projections weighed by
    each step's mask: the same products (a mask of 0 or 2 scales exactly) summed in another order.

    Tolerances. A float32 sum of n terms in any order is within n * eps/2 * sum|terms| of the
    exact sum, so two orders differ by at most n * eps * sum|terms| (n = 320 + the bias): that
    bound is checked per element for the embeddings. Gradients are sums over the batch, the steps
    and the pixels (thousands of terms) reordered the same way; they are checked to 1e-5 of each
    tensor's largest entry, about ten times the largest difference seen (2e-6, conv1's bias).
    """
    torch.manual_seed(0)
    model = new_model(PonderConfig.of(max_steps=20, cnn_dropout_mask="per-step")).train()  # the default sizes
    step, x, steps = model.step, torch.randn(128, 1, 28, 28), 20

    torch.manual_seed(1)
    masks, heads, term_sums, maps, channel_masks = _start_as_rerunning_fc(step, x, steps)
    after_reference = torch.get_rng_state()
    torch.manual_seed(1)
    context, _ = step.start(x, steps)
    # the same random draws, in the same order: a seeded run's dropout stream is unchanged
    assert torch.equal(torch.get_rng_state(), after_reference)
    assert torch.equal(context[0], masks)

    new_heads = step.encoder.masked_heads(maps, channel_masks)  # (B, steps, hidden_cnn)
    n_terms = step.encoder.fc.in_features + 1
    for n in range(steps):
        bound = n_terms * torch.finfo(torch.float32).eps * term_sums[n]
        assert ((new_heads[:, n] - heads[n]).abs() <= bound).all()

    weights = torch.randn(steps, 128, 64)  # a loss that weighs every step's embedding differently
    params = [p for name, p in step.named_parameters() if not name.startswith(("mlp.from_state", "mlp.to_state"))]
    reference = torch.stack([step.mlp.from_embedding(h) for h in heads])  # (steps, B, L)
    ours = torch.stack(context[1:])
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)
    expected = torch.autograd.grad((reference * weights).sum(), params)
    got = torch.autograd.grad((ours * weights).sum(), params)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5 * e.abs().max().item())


def test_per_step_cnn_masks_cost_about_as_many_flops_as_one_shared_mask():
    """Training forward and backward of the default model: fc rerunning on every step's masked
    maps made per-step masks cost 1.76 times the shared mask's FLOPs; weighing each channel's
    projection leaves the first MLP layer, now run per step, as the only extra (1.15 times)."""
    from torch.utils.flop_counter import FlopCounterMode

    def training_flops(mask):
        torch.manual_seed(0)
        model = new_model(PonderConfig.of(cnn_dropout_mask=mask)).train()
        with FlopCounterMode(display=False) as counter:
            out = model(torch.randn(128, 1, 28, 28))
            (out.logits.sum() + out.lambda_logits.sum()).backward()
        return counter.get_total_flops()

    assert training_flops("per-step") <= 1.2 * training_flops("shared")


def test_sample_halting_takes_first_firing_step():
    lam_logits = torch.logit(torch.tensor([[0.5, 0.1, 0.1], [0.5, 0.9, 0.1], [0.5, 0.9, 0.1]]))
    uniforms = torch.tensor([[0.4, 0.4, 0.4], [0.4, 0.4, 0.4], [0.9, 0.9, 0.9]])
    # image 0 fires at step 1; image 1 at step 2; image 2 never fires and halts at the last step
    assert halting_steps(Sample(uniforms), None, lam_logits)[0].tolist() == [1, 2, 3]


def test_logits_at_picks_the_halting_step():
    logits = torch.arange(3 * 2 * 4, dtype=torch.float).view(3, 2, 4)
    picked = logits_at(logits, torch.tensor([3, 1]))
    assert torch.equal(picked, torch.stack([logits[2, 0], logits[0, 1]]))


def test_early_exit_matches_running_every_step():
    model = small_model(max_steps=8, seed=3)
    with torch.no_grad():
        model.halting_head.bias.fill_(-1.0)  # spread halting over several steps
    x = torch.randn(64, 1, 28, 28)
    uniforms = torch.rand(8, 64, generator=torch.Generator().manual_seed(1))
    logits, steps = model.infer(x, Sample(uniforms))
    with torch.no_grad():
        out = model(x)
    full_steps = halting_steps(Sample(uniforms), None, out.lambda_logits)[0]
    assert torch.equal(steps, full_steps)
    assert len(set(steps.tolist())) > 2
    assert torch.allclose(logits, logits_at(out.logits, full_steps), atol=1e-5)


def test_confidence_input_feeds_the_top_class_probability_to_the_halting_head():
    model = small_model(max_steps=4, halting_input="state+confidence")
    assert model.halting_head.in_features == 17
    h = torch.randn(5, 16)
    logits, lam = model.heads(h)
    top = torch.softmax(logits, -1).max(-1).values
    w, b = model.halting_head.weight[0], model.halting_head.bias
    assert torch.allclose(lam, h @ w[:16] + top * w[16] + b, atol=1e-6)
    x = torch.randn(32, 1, 28, 28) * torch.linspace(0, 3, 32).view(-1, 1, 1, 1)
    uniforms = torch.rand(4, 32, generator=torch.Generator().manual_seed(2))
    _, steps = model.infer(x, Sample(uniforms))
    with torch.no_grad():
        assert torch.equal(steps, halting_steps(Sample(uniforms), None, model(x).lambda_logits)[0])


def test_the_halting_loss_does_not_reach_the_class_head_through_the_confidence_input():
    """The halting head reads how sure the class head is, but its loss (the KL pull towards
    halting early) must not teach the class head to be surer, or less sure, to halt sooner."""
    model = small_model(max_steps=4, halting_input="state+confidence").train()
    with torch.no_grad():
        model.halting_head.weight[:, :16] = 0  # the halting head reads only the confidence
        model.halting_head.weight[:, 16] = 3.0
    lambda_logits = model(torch.randn(8, 1, 28, 28)).lambda_logits  # what every halting loss is made of
    class_head = list(model.output_head.parameters())
    assert all(g is None for g in torch.autograd.grad(lambda_logits.sum(), class_head, allow_unused=True,
                                                      retain_graph=True))
    assert torch.autograd.grad(lambda_logits.sum(), model.halting_head.weight)[0][0, 16] != 0  # still read


def test_previous_input_shows_the_halting_head_this_and_the_last_step():
    model = small_model(max_steps=4, halting_input="state+previous")
    assert model.halting_head.in_features == 32
    x = torch.randn(32, 1, 28, 28) * torch.linspace(0, 3, 32).view(-1, 1, 1, 1)
    with torch.no_grad():
        out = model(x)
        context, state = model.step.start(x, 4)
        readouts = []
        for n in range(4):
            state, readout, _ = model.step(context, state, n)
            readouts.append(readout)
    w, b = model.halting_head.weight[0], model.halting_head.bias
    # [h_n, h_{n-1}], with zeros before the first step
    expected = [readouts[n] @ w[:16] + (readouts[n - 1] @ w[16:] if n else 0) + b for n in range(4)]
    assert torch.allclose(out.lambda_logits, torch.stack(expected), atol=1e-5)
    assert not torch.allclose(out.lambda_logits[1:], torch.stack(
        [readouts[n] @ w[:16] + b for n in range(1, 4)]), atol=1e-3)
    # the early-exit loop carries each running row's own previous readout
    uniforms = torch.rand(4, 32, generator=torch.Generator().manual_seed(3))
    _, steps = model.infer(x, Sample(uniforms))
    assert len(set(steps.tolist())) > 2
    assert torch.equal(steps, halting_steps(Sample(uniforms), None, out.lambda_logits)[0])


def test_a_new_step_function_plugs_in_through_the_registry(monkeypatch):
    """The seam: a step function defined here, registered by one line, drives the same loop,
    early exit included, with its own halting feature reaching the halting head and its own gate
    deciding where halting may happen; the model knows neither."""
    from ponder_cli import registry
    from ponder_cli.steps import StepFunction

    class CountingStep(StepFunction):
        readout_size, halting_extra_size, halting_feature = 3, 1, "turn"

        def gate_halting(self, lambda_logits, extra):  # no halting before the third step (extra: n)
            return torch.where(extra[..., 0] < 2, torch.full_like(lambda_logits, -80.0), lambda_logits)

        def __init__(self, cfg, input_shape):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(()))

        def start(self, x, steps):
            return (x.flatten(1).mean(1, keepdim=True),), (torch.zeros(x.shape[0], 3),)

        def forward(self, context, state, n):
            h = state[0] + self.scale * context[0]  # (B, 3)
            return (h,), h, torch.full((h.shape[0], 1), float(n))

    monkeypatch.setitem(registry.STEPS, "counting", f"{__name__}:CountingStep")
    globals()["CountingStep"] = CountingStep
    cfg = PonderConfig.of(step="counting", max_steps=5, halting_input="state+turn")
    model = PonderNet(cfg, classes=10, input_shape=(1, 28, 28)).eval()
    assert model.halting_head.in_features == 4
    x = torch.randn(10, 1, 28, 28)
    out = model(x)
    assert out.logits.shape == (5, 10, 10)
    uniforms = torch.rand(5, 10, generator=torch.Generator().manual_seed(0))
    _, steps = model.infer(x, Sample(uniforms))
    assert torch.equal(steps, halting_steps(Sample(uniforms), None, out.lambda_logits)[0])
    assert torch.sigmoid(out.lambda_logits[:2]).max() < 1e-30 and steps.min() >= 3  # the step's gate held


def test_mlp_draws_a_fresh_cnn_mask_per_step_unless_told_to_share():
    assert PonderConfig.of().step.cnn_dropout_mask == "per-step"  # the reference's behaviour
    assert PonderConfig.of(cnn_dropout_mask="shared").step.cnn_dropout_mask == "shared"
    # checkpoints saved before the option trained with the shared mask, and keep it
    old = {k: v for k, v in PonderConfig.of().to_dict().items() if k != "cnn_dropout_mask"}
    assert PonderConfig.from_dict(old).step.cnn_dropout_mask == "shared"
