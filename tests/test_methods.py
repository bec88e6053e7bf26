"""ACT and the one-step baseline: halting arithmetic, training, evaluation and `compare`."""

import json
import math

import pytest
import torch

from ponder_cli import PonderError
from ponder_cli.checkpoint import load_checkpoint
from ponder_cli.config import PonderConfig
from ponder_cli.checkpoint import new_model
from ponder_cli.model import Act, act_halting, act_loss, get_method, halting_steps
from ponder_cli.registry import METHODS


def test_act_halting_by_hand():
    # Graves' example: halting units 0.1, 0.3, 0.5, 0.5 and epsilon 0.1: 0.1 + 0.3 + 0.5 = 0.9 >= 0.9,
    # so N = 3, R = 1 - (0.1 + 0.3) = 0.6 and p = (0.1, 0.3, 0.6, 0).
    h = torch.tensor([[0.1], [0.3], [0.5], [0.5]])
    halting = act_halting(torch.logit(h), epsilon=0.1)
    assert halting.steps.tolist() == [3]
    assert math.isclose(halting.remainder.item(), 0.6, rel_tol=1e-6)
    assert torch.allclose(halting.p[:, 0], torch.tensor([0.1, 0.3, 0.6, 0.0]), atol=1e-6)
    # epsilon 0.01: 0.9 < 0.99, the fourth unit crosses: N = 4, R = 0.1
    halting = act_halting(torch.logit(h), epsilon=0.01)
    assert halting.steps.tolist() == [4]
    assert torch.allclose(halting.p[:, 0], torch.tensor([0.1, 0.3, 0.5, 0.1]), atol=1e-6)
    # never reaching 1 - epsilon: max_steps caps N and R takes the rest
    halting = act_halting(torch.logit(torch.full((3, 1), 0.1)), epsilon=0.01)
    assert halting.steps.tolist() == [3] and math.isclose(halting.remainder.item(), 0.8, rel_tol=1e-6)
    # a first unit above 1 - epsilon halts at once with R = 1
    halting = act_halting(torch.logit(torch.tensor([[0.995], [0.5]])), epsilon=0.01)
    assert halting.steps.tolist() == [1] and halting.p[:, 0].tolist() == [1.0, 0.0]


# Halting units summing to 1 - epsilon = 0.99 at step 3 up to float32 rounding; the sums by hand in
# float32 (0.99 rounds to 0.99000001): each form must add the same float32 units in the same order.
ACT_NEAR_THRESHOLD = [
    # 0.157795563, 0.6009202, 0.98999995: below 0.99000001, so N = 4
    ([-1.67472243, -0.228490338, -0.451182127, 0], 4),
    # 0.0761759356, 0.262972623, 0.99000001: reaches it, so N = 3
    ([-2.49547601, -1.47096038, 0.979592621, 0], 3),
]


@pytest.mark.parametrize("row, steps", ACT_NEAR_THRESHOLD)
def test_act_halts_alike_near_its_threshold(row, steps, drive):
    z, logits = torch.tensor(row)[:, None], torch.tensor([[[1.0, 0.0]], [[0.0, 2.0]], [[3.0, 0.0]], [[0.0, 4.0]]])
    halting = act_halting(z, epsilon=0.01)
    assert halting.steps.tolist() == [steps]
    assert drive(Act(0.01), logits, z).tolist() == [steps]
    assert drive(Act(0.01), None, z).tolist() == [steps]  # training drops it there


def test_act_weights_sum_to_one():
    halting = act_halting(torch.randn(12, 500) * 3, epsilon=0.01)
    assert torch.allclose(halting.p.sum(0), torch.ones(500), atol=1e-5)
    assert (halting.p >= 0).all()


def test_act_loss_by_hand():
    # p = (0.1, 0.3, 0.6, 0): mean-field logits = 0.1 * (0, 0) + 0.3 * (2, 0) + 0.6 * (1, 0) = (1.2, 0)
    h = torch.tensor([[0.1], [0.3], [0.5], [0.5]])
    logits = torch.tensor([[[0.0, 0.0]], [[2.0, 0.0]], [[1.0, 0.0]], [[9.0, 0.0]]])
    parts = act_loss(logits, torch.logit(h), torch.tensor([0]), tau=0.5, epsilon=0.1)
    task = math.log(1 + math.exp(-1.2))  # CE of logits (1.2, 0) for class 0
    assert math.isclose(parts.reconstruction.item(), task, rel_tol=1e-5)
    assert math.isclose(parts.regularisation.item(), 3 + 0.6, rel_tol=1e-6)  # N + R
    assert math.isclose(parts.total.item(), task + 0.5 * 3.6, rel_tol=1e-5)


def test_act_early_exit_matches_all_steps():
    cfg = PonderConfig.of(method="act", max_steps=8, hidden=16, hidden_cnn=16, hidden_lin=16)
    torch.manual_seed(0)
    model = new_model(cfg).eval()
    assert model.halting_head.bias.item() == 1.0  # Graves' positive initial halting bias
    with torch.no_grad():
        model.halting_head.bias.fill_(-1.0)
        model.halting_head.weight.mul_(10)
    x = torch.randn(200, 1, 28, 28) * torch.linspace(0, 4, 200).view(-1, 1, 1, 1)  # images of varied contrast
    logits, steps = model.infer(x, Act(cfg.method.act_epsilon))
    with torch.no_grad():
        out = model(x)
        full_logits, full_steps = halting_steps(Act(cfg.method.act_epsilon), out.logits, out.lambda_logits)[::-1]
    assert torch.equal(steps, full_steps) and len(set(steps.tolist())) > 1
    assert torch.equal(logits, full_logits)


def test_plain_needs_one_step():
    with pytest.raises(PonderError, match="^--max-steps applies to --method pondernet, act, not plain$"):
        PonderConfig.of(method="plain", max_steps=5)
    with pytest.raises(PonderError, match="plain runs exactly one step"):  # a saved config is checked all the same
        PonderConfig.from_dict({"method": "plain", "max_steps": 5})
    with pytest.raises(PonderError, match="method must be one of pondernet, act, plain"):
        PonderConfig.of(method="ut")
    assert PonderConfig.of(method="plain").method.max_steps == 1
    assert PonderConfig.of(method="act").method.max_steps == 20


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_predicts_the_same_with_early_exit(name):
    """The one early-exit loop, driven by each method's own rule, equals its prediction from a
    forward pass over every step."""
    cfg = PonderConfig.of(method=name, **({} if name == "plain" else {"max_steps": 6}),
                          hidden=16, hidden_cnn=16, hidden_lin=16)
    torch.manual_seed(0)
    model, method = new_model(cfg).eval(), get_method(cfg)
    with torch.no_grad():
        model.halting_head.bias.fill_(-1.0)
    x = torch.randn(100, 1, 28, 28) * torch.linspace(0, 3, 100).view(-1, 1, 1, 1)
    uniforms = torch.rand(cfg.method.max_steps, 100, generator=torch.Generator().manual_seed(3))
    for rule in ("sample", "median"):
        early, early_steps = model.infer(x, method.exit_rule(rule, uniforms))
        with torch.no_grad():
            out = model(x)
        full, full_steps = method.predict(out.logits, out.lambda_logits, uniforms, rule)
        assert torch.equal(early_steps, full_steps)
        assert torch.equal(early.argmax(1), full.argmax(1))


def test_methods_are_stored_and_read_back(runs, tiny_mnist, ponder):
    assert load_checkpoint(runs / "act" / "best.pt").config.method.name == "act"
    plain = load_checkpoint(runs / "plain" / "best.pt").config
    assert plain.method.name == "plain" and plain.method.max_steps == 1
    report = json.loads(ponder("eval", runs / "act" / "best.pt", "-f", "json", "--data-dir", tiny_mnist).stdout)
    act = report["buckets"][0]
    assert report["method"] == "act" and report["halting"] == "act" and 1 <= act["mean_steps"] <= 5
    assert act["accuracy"] > 0.3 and act["loss"] > 0
    one = json.loads(ponder("extrapolate", runs / "plain" / "best.pt", "--angles", 10, "-f", "json",
                            "--data-dir", tiny_mnist).stdout)["buckets"][0]
    assert one["mean_steps"] == 1.0 and one["std_steps"] == 0.0 and one["histogram"] == [200]


def test_compare_groups_seeds_and_methods(runs, tiny_mnist, ponder):
    result = ponder("compare", "--angles", 15, 45, runs / "pn1" / "best.pt", runs / "pn2" / "best.pt",
                    runs / "act" / "best.pt", runs / "plain" / "best.pt", "-f", "json", "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows = report["buckets"]
    assert report["command"] == "compare" and report["method"] is None and report["step"] == "mlp"
    assert [(r["method"], r["rotation"], r["seeds"]) for r in rows] == [
        ("pondernet", 15.0, 2), ("pondernet", 45.0, 2), ("act", 15.0, 1), ("act", 45.0, 1),
        ("plain", 15.0, 1), ("plain", 45.0, 1)]
    # mean and sample sd over the two seeds, checked against extrapolate on each checkpoint with
    # compare's draws: the checkpoints trained with different seeds, so the default seed's, 1234
    singles = [json.loads(ponder("extrapolate", runs / n / "best.pt", "--angles", 15, 45, "--seed", 1234, "-f",
                                 "json", "--data-dir", tiny_mnist).stdout)["buckets"][0]["accuracy"]
               for n in ("pn1", "pn2")]
    assert math.isclose(rows[0]["accuracy"], sum(singles) / 2)
    assert math.isclose(rows[0]["accuracy_sd"], abs(singles[0] - singles[1]) / math.sqrt(2))
    assert rows[4]["mean_steps"] == 1.0 and rows[2]["halting"] == "act"
    assert rows[2]["accuracy_sd"] is None and "±" not in rows[2]["accuracy_text"]  # one seed: no spread


def test_compare_counts_a_model_given_twice_once(runs, tiny_mnist, ponder, tmp_path):
    copy = tmp_path / "copy.pt"
    copy.write_bytes((runs / "pn1" / "best.pt").read_bytes())
    result = ponder("compare", runs / "pn1" / "best.pt", runs / "pn1" / "best.pt", copy, "--angles", 10, "-f", "json",
                    "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["buckets"][0]["seeds"] == 1
    assert "the same model as" in result.stderr


def test_compare_table_and_plot(runs, tiny_mnist, tmp_path, ponder):
    pytest.importorskip("matplotlib")
    png = tmp_path / "cmp.png"
    result = ponder("compare", runs / "pn1" / "best.pt", runs / "act" / "best.pt", "--angles", 30,
                    "--plot", png, "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    assert "Methods compared" in result.stdout and "act" in result.stdout and "±" in result.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_compare_labels_name_only_what_sets_a_group_apart():
    from ponder_cli.reports import group_by_configuration
    mlp, align = PonderConfig.of(), PonderConfig.of(step="align")
    other_lr = PonderConfig.of(lr=3e-3)
    groups = group_by_configuration([("a", mlp), ("b", align), ("c", other_lr), ("d", mlp.replace(seed=1))])
    # mlp and align differ in many settings, but the step has its own column; the two mlp
    # groups differ in the learning rate alone
    assert [(g.label, len(g.members)) for g in groups] == [
        ("pondernet (lr=0.001)", 2), ("pondernet", 1), ("pondernet (lr=0.003)", 1)]
