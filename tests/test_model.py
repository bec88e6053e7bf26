import torch

from ponder_cli.config import PonderConfig
from ponder_cli.model import PonderNet, logits_at, sample_halting_steps


def small_model(max_steps=6, seed=0):
    torch.manual_seed(seed)
    return PonderNet(PonderConfig(max_steps=max_steps, hidden=16, hidden_cnn=16, hidden_lin=16)).eval()


def test_forward_shapes():
    out = small_model()(torch.randn(5, 1, 28, 28))
    assert out.logits.shape == (6, 5, 10)
    assert out.lambda_logits.shape == (6, 5)


def test_split_first_layer_equals_linear_on_concatenation():
    model = small_model()
    mlp = model.step_mlp
    e, h = torch.randn(3, 16), torch.randn(3, 16)
    weight = torch.cat([mlp.from_embedding.weight, mlp.from_state.weight], dim=1)
    concatenated = torch.relu(torch.nn.functional.linear(torch.cat([e, h], 1), weight, mlp.from_embedding.bias))
    expected = torch.relu(mlp.to_state(concatenated))
    assert torch.allclose(mlp(mlp.embedding_part(e), h), expected, atol=1e-6)


def test_sample_halting_takes_first_firing_step():
    lam_logits = torch.logit(torch.tensor([[0.5, 0.1, 0.1], [0.5, 0.9, 0.1], [0.5, 0.9, 0.1]]))
    uniforms = torch.tensor([[0.4, 0.4, 0.4], [0.4, 0.4, 0.4], [0.9, 0.9, 0.9]])
    # image 0 fires at step 1; image 1 at step 2; image 2 never fires and halts at the last step
    assert sample_halting_steps(lam_logits, uniforms).tolist() == [1, 2, 3]


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
    logits, steps = model.infer(x, uniforms)
    with torch.no_grad():
        out = model(x)
    full_steps = sample_halting_steps(out.lambda_logits, uniforms)
    assert torch.equal(steps, full_steps)
    assert len(set(steps.tolist())) > 2
    assert torch.allclose(logits, logits_at(out.logits, full_steps), atol=1e-5)


def test_confidence_input_feeds_the_top_class_probability_to_the_halting_head():
    torch.manual_seed(0)
    cfg = PonderConfig(max_steps=4, hidden=16, hidden_cnn=16, hidden_lin=16, halting_input="state+confidence")
    model = PonderNet(cfg).eval()
    assert model.halting_head.in_features == 17
    h = torch.randn(5, 16)
    logits, lam = model.heads(h)
    top = torch.softmax(logits, -1).max(-1).values
    w, b = model.halting_head.weight[0], model.halting_head.bias
    assert torch.allclose(lam, h @ w[:16] + top * w[16] + b, atol=1e-6)
    x = torch.randn(32, 1, 28, 28) * torch.linspace(0, 3, 32).view(-1, 1, 1, 1)
    uniforms = torch.rand(4, 32, generator=torch.Generator().manual_seed(2))
    _, steps = model.infer(x, uniforms)
    with torch.no_grad():
        assert torch.equal(steps, sample_halting_steps(model(x).lambda_logits, uniforms))
