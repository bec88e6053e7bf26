"""The vector step functions (rnn, gru) on parity inputs: the first step reads the input, the
updates are the stated equations, early exit equals the full forward, and PonderNet's loss on
two-class logits equals a float64 brute force."""

import math

import pytest
import torch

from ponder_cli import registry
from ponder_cli.config import PonderConfig
from ponder_cli.model import Act, PonderNet, Sample, get_method, halting_steps
from ponder_cli.steps.vectors import GRUStep
from ponder_cli.tasks.declared import CLASSES
from ponder_cli.tasks.parity import parity_batch


def vector_model(vector_config, step, seed=0, **fields):
    torch.manual_seed(seed)
    fields = {"elems": 8, "hidden": 16, "max_steps": 6, **fields}
    return PonderNet(vector_config(step=step, **fields), classes=CLASSES, input_shape=(fields["elems"],))


def inputs(batch=32, elems=8, seed=0):
    return parity_batch(batch, elems, 1, elems, torch.Generator().manual_seed(seed)).x


def test_vector_steps_are_registered_and_the_class_count_is_the_models_choice(vector_config):
    assert {"rnn", "gru"} <= set(registry.STEPS)
    assert PonderConfig.of(task="parity", step="rnn").step.name == "rnn"
    model = vector_model(vector_config, "gru")
    assert model.output_head.out_features == 2
    out = model(inputs())
    assert out.logits.shape == (6, 32, 2) and out.lambda_logits.shape == (6, 32)
    assert PonderNet(vector_config(step="rnn"), classes=3, input_shape=(8,)).output_head.out_features == 3  # the task's count


@pytest.mark.parametrize("step", ["rnn", "gru"])
def test_the_first_step_already_reads_the_input(vector_config, step):
    model = vector_model(vector_config, step)
    x = inputs(2)
    changed = x.clone()
    changed[:, 0] = -changed[:, 0] + (changed[:, 0] == 0).float()  # flip or set the first entry
    with torch.no_grad():
        a, b = model(x), model(changed)
    assert (a.logits[0] - b.logits[0]).abs().min() > 1e-6
    assert (a.lambda_logits[0] - b.lambda_logits[0]).abs().min() > 1e-6


def test_rnn_step_is_the_papers_tanh_recurrence(vector_config):
    step = vector_model(vector_config, "rnn").step
    x = inputs(4)
    w_x, b, w_h = step.from_input.weight, step.from_input.bias, step.from_state.weight
    h1 = torch.tanh(x @ w_x.T + b)  # h_0 = 0
    h2 = torch.tanh(x @ w_x.T + h1 @ w_h.T + b)
    with torch.no_grad():
        context, state = step.start(x, 2)
        state, readout1, extra = step(context, state, 0)
        _, readout2, _ = step(context, state, 1)
    assert extra is None
    assert torch.allclose(readout1, h1, atol=1e-6) and torch.allclose(readout2, h2, atol=1e-6)


def test_gru_step_equals_torchs_gru_cell_from_a_zero_state(vector_config):
    step = vector_model(vector_config, "gru", gru_layer_norm=False, gru_orthogonal=False, gru_update_bias=0.0).step
    x = inputs(4)
    h = torch.zeros(4, 16)
    with torch.no_grad():
        context, state = step.start(x, 3)
        for n in range(3):
            state, readout, _ = step(context, state, n)
            h = step.cell(x, h)
            assert torch.allclose(readout, h, atol=1e-6)


@pytest.mark.parametrize("layer_norm", [True, False])
def test_the_gru_steps_run_at_once_give_the_loops_loss_and_gradients_to_the_bit(vector_config, layer_norm):
    # the training forward on the CPU (GRURecurrence) against the step-by-step loop (what a
    # forward with traces runs), and PonderNet's loss and every gradient through it
    model = vector_model(vector_config, "gru", seed=3, gru_layer_norm=layer_norm, max_steps=7)
    x, targets = inputs(48, seed=5), torch.randint(0, CLASSES, (48,), generator=torch.Generator().manual_seed(6))
    method = get_method(vector_config(step="gru", max_steps=7))
    context, state = model.step.start(x, 7)
    assert model.step.all_steps(context, state, 7) is not None  # the fast path is the one taken

    def loss_and_gradients(traces):
        model.zero_grad(set_to_none=True)
        out = model(x, traces=traces)
        loss = method.loss(out.logits, out.lambda_logits, targets).total
        loss.backward()
        return out, loss, {name: p.grad.clone() for name, p in model.named_parameters()}

    at_once, loop = loss_and_gradients(None), loss_and_gradients([])
    assert torch.equal(at_once[0].logits, loop[0].logits)
    assert torch.equal(at_once[0].lambda_logits, loop[0].lambda_logits)
    assert torch.equal(at_once[1], loop[1])
    assert at_once[2].keys() == loop[2].keys()
    for name, grad in loop[2].items():
        assert grad.abs().sum() > 0, name
        assert torch.equal(at_once[2][name], grad), name
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts per operator: the loop runs
        assert model.step.all_steps(context, state, 7) is None


def test_gru_recipe_orthogonal_blocks_update_bias_and_normalised_state(vector_config):
    torch.manual_seed(0)
    plain = GRUStep(vector_config(step="gru", elems=8, hidden=16, gru_layer_norm=False, gru_orthogonal=False,
                                  gru_update_bias=0.0), (8,))
    torch.manual_seed(0)
    recipe = GRUStep(vector_config(step="gru", elems=8, hidden=16, gru_layer_norm=True, gru_orthogonal=True,
                                   gru_update_bias=1.0), (8,))
    for block in recipe.cell.weight_hh.split(16):
        assert torch.allclose(block @ block.T, torch.eye(16), atol=1e-5)
    # the same draw, plus 1 on the update gate's input bias only (gate order: reset, update, new)
    shift = recipe.cell.bias_ih - plain.cell.bias_ih
    assert torch.allclose(shift, torch.cat([torch.zeros(16), torch.ones(16), torch.zeros(16)]))
    with torch.no_grad():
        context, state = recipe.start(inputs(4), 1)
        _, readout, _ = recipe(context, state, 0)
    assert torch.allclose(readout.mean(1), torch.zeros(4), atol=1e-5)
    assert torch.allclose(readout.var(1, unbiased=False), torch.ones(4), atol=1e-2)  # LayerNorm eps


@pytest.mark.parametrize("step", ["rnn", "gru"])
def test_early_exit_equals_the_full_forward(vector_config, step):
    x = inputs(64, seed=4)
    uniforms = torch.rand(6, 64, generator=torch.Generator().manual_seed(1))
    model = vector_model(vector_config, step, seed=2)
    with torch.no_grad():
        model.halting_head.bias.fill_(-1.0)  # spread halting over several steps
        out = model(x)
    logits, steps = model.infer(x, Sample(uniforms))
    full_steps = halting_steps(Sample(uniforms), None, out.lambda_logits)[0]
    assert len(set(full_steps.tolist())) > 2
    assert torch.equal(steps, full_steps)
    assert torch.allclose(logits, out.logits[full_steps - 1, torch.arange(64)], atol=1e-5)

    act = vector_model(vector_config, step, seed=2, method="act")
    with torch.no_grad():
        act.halting_head.bias.fill_(-1.5)
        out = act(x)
    logits, steps = act.infer(x, Act(0.01))
    full_logits, full_steps = halting_steps(Act(0.01), out.logits, out.lambda_logits)[::-1]
    assert len(set(full_steps.tolist())) > 1
    assert torch.equal(steps, full_steps) and torch.allclose(logits, full_logits, atol=1e-5)


def brute_force_ponder_loss(logits, lambda_logits, targets, lambda_p, beta):
    """sum_n p_n CE_n + beta KL(p || geometric prior truncated at N and renormalised), mean
    over the batch, by plain Python loops in float64."""
    steps, batch, _ = logits.shape
    prior = [lambda_p * (1 - lambda_p) ** n for n in range(steps)]
    prior = [g / sum(prior) for g in prior]
    total = 0.0
    for b in range(batch):
        survive, reconstruction, kl = 1.0, 0.0, 0.0
        for n in range(steps):
            lam = 1.0 if n == steps - 1 else 1 / (1 + math.exp(-float(lambda_logits[n, b])))
            p = survive * lam
            survive *= 1 - lam
            row = [float(v) for v in logits[n, b]]
            log_sum = math.log(sum(math.exp(v) for v in row))
            reconstruction += p * (log_sum - row[int(targets[b])])
            kl += p * math.log(p / prior[n]) if p > 0 else 0.0
        total += reconstruction + beta * kl
    return total / batch


@pytest.mark.parametrize("lambda_p,beta", [(0.1, 0.01), (0.5, 1.0)])
def test_pondernet_loss_on_parity_logits_equals_a_float64_brute_force(vector_config, lambda_p, beta):
    model = vector_model(vector_config, "gru", seed=5, lambda_p=lambda_p, beta=beta)
    batch = parity_batch(16, 8, 1, 8, torch.Generator().manual_seed(9))
    with torch.no_grad():
        out = model(batch.x)
    loss = get_method(vector_config(step="gru", max_steps=6, lambda_p=lambda_p, beta=beta)).loss(
        out.logits, out.lambda_logits, batch.labels)
    expected = brute_force_ponder_loss(out.logits.double(), out.lambda_logits.double(), batch.labels, lambda_p, beta)
    assert float(loss.total) == pytest.approx(expected, rel=1e-5)
