"""A halting head trained on the answer (--halting-target final | correct), the answer it reads
(--halting-input ...+answer), the threshold:T rule and the refit of a trained model's halting head
(--init-from CHECKPOINT --refit-halting)."""

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from ponder_cli import PonderError, PonderWarning
from ponder_cli.checkpoint import load_checkpoint, new_model
from ponder_cli.config import PonderConfig
from ponder_cli.tasks.mnist import load_mnist, train_val_split
from ponder_cli.model import (Threshold, answer_features, get_method, halting_bce, halting_steps, halting_targets,
                              rule_of)
from ponder_cli.registry import parse_halting_rule
from ponder_cli.runs import StartingWeights, resolve_config
from ponder_cli.train import train

SMALL = dict(max_steps=4, batch_size=64, val_size=100, hidden=16, hidden_cnn=16, hidden_lin=16)
FINAL = dict(halting_target="final", halting_input="state+answer")


def _answers(rows):
    """Class logits (steps, B, 3) whose argmax at step n, row b is rows[n][b]."""
    return F.one_hot(torch.tensor(rows), 3).float() * 5


def test_the_targets_of_a_hand_made_sequence_of_answers():
    logits = _answers([[0, 1], [1, 1], [0, 1], [0, 2]])  # row 0 settles at step 3, row 1 changes at step 4
    labels = torch.tensor([0, 1])
    assert halting_targets(logits, labels, "final").tolist() == [[0, 0], [0, 0], [1, 0], [1, 1]]
    assert halting_targets(logits, labels, "correct").tolist() == [[1, 1], [0, 1], [1, 1], [1, 0]]
    # computed (B,): row 1 stopped at step 3, so its answer there is its last and step 4 is not looked at
    assert halting_targets(logits, labels, "final", torch.tensor([4, 3]))[:3].tolist() == [[0, 1], [0, 1], [1, 1]]


def test_the_cross_entropy_by_hand_leaves_out_the_last_step():
    logits = _answers([[1], [0], [0]])
    z = torch.tensor([[2.0], [-1.0], [5.0]])  # step 3 is the last: halting is forced there, not trained
    # final: t = 0, 1, (1); -log(1 - sigmoid(2)) = softplus(2), -log sigmoid(-1) = softplus(1)
    softplus = lambda v: math.log1p(math.exp(v))  # noqa: E731
    assert halting_bce(logits, z, torch.tensor([0]), "final").item() == pytest.approx((softplus(2) + softplus(1)) / 2)
    # correct with label 1: t = 1, 0, (0)
    assert halting_bce(logits, z, torch.tensor([1]), "correct").item() == pytest.approx(
        (softplus(-2) + softplus(-1)) / 2)


def test_the_halting_head_learns_from_the_cross_entropy_and_the_class_head_from_the_answers():
    cfg = PonderConfig.of(step="mlp", **SMALL, **FINAL)
    torch.manual_seed(0)
    model, method = new_model(cfg), get_method(cfg)
    x, labels = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    loss = method.loss(*model(x)[:2], labels)
    assert loss.total.item() == pytest.approx(loss.reconstruction.item() + loss.regularisation.item())
    head = list(model.halting_head.parameters())
    grads = torch.autograd.grad(loss.reconstruction, head + list(model.output_head.parameters()), allow_unused=True)
    assert all(g is None or not g.any() for g in grads[:2])  # p is detached: no pull on halting from the loss
    assert grads[2].abs().sum() > 0
    grads = torch.autograd.grad(loss.regularisation, head + list(model.output_head.parameters()), allow_unused=True)
    assert grads[0].abs().sum() > 0
    assert all(g is None or not g.any() for g in grads[2:])  # the answers it reads and learns from are detached


def test_the_answer_features_by_hand_per_step_and_stacked():
    p = torch.tensor([[[0.7, 0.2, 0.1]], [[0.1, 0.6, 0.3]]])  # (steps 2, B 1, classes 3)
    logits = p.log()
    first = answer_features(logits[0], None, 0, True)[0].tolist()
    entropy = -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1)) / math.log(3)
    change = (abs(0.7 - 1 / 3) + abs(0.2 - 1 / 3) + abs(0.1 - 1 / 3)) / 2  # from the uniform distribution
    assert first == pytest.approx([0.7, 0.5, entropy, math.log(0.3) / 10, change, 1.0, 1.0], abs=1e-6)
    second = answer_features(logits[1], logits[0], 1, False)[0].tolist()
    assert second[:2] == pytest.approx([0.6, 0.3]) and second[4:] == pytest.approx([0.6, 1.0, 0.5])
    stacked = answer_features(logits, torch.cat([torch.zeros_like(logits[:1]), logits[:-1]]),
                              torch.arange(2)[:, None], torch.arange(2)[:, None] == 0)
    assert torch.allclose(stacked[0, 0], torch.tensor(first)) and torch.allclose(stacked[1, 0], torch.tensor(second))


def test_threshold_halts_at_the_first_lambda_that_reaches_it_or_the_last_step(drive):
    z = torch.tensor([[-1.0, 2.0, -3.0], [3.0, -5.0, -3.0], [0.0, 0.0, -3.0]])
    assert halting_steps(Threshold(0.5), None, z)[0].tolist() == [2, 1, 3]
    assert halting_steps(Threshold(0.99), None, z)[0].tolist() == [3, 3, 3]
    assert isinstance(rule_of(parse_halting_rule("threshold:0.5"), torch.rand(3, 3)), Threshold)
    assert drive(Threshold(0.5), torch.zeros(3, 3, 2), z).tolist() == [2, 1, 3]


@pytest.mark.parametrize("step", ["mlp", "align"])
def test_a_head_reading_the_answer_exits_early_as_its_full_forward_predicts(step):
    sizes = {key: value for key, value in SMALL.items() if key != "hidden_lin" or step == "mlp"}
    cfg = PonderConfig.of(step=step, **sizes, halting_input="state+answer", halting_target="final", truncation=0.0)
    torch.manual_seed(0)
    model, method = new_model(cfg).eval(), get_method(cfg)
    x = torch.randn(64, 1, 28, 28) * torch.linspace(0, 3, 64).view(-1, 1, 1, 1)
    with torch.no_grad():
        out = model(x)
    threshold = out.lambda_logits[0].sigmoid().median().item()  # half the rows halt at once, the others run on
    rule = f"threshold:{threshold}"
    early, early_steps = model.infer(x, method.exit_rule(rule, torch.rand(4, 64)))
    full, full_steps = method.predict(out.logits, out.lambda_logits, torch.rand(4, 64), rule)
    assert torch.equal(early_steps, full_steps) and torch.allclose(early, full, atol=1e-5)
    assert len(set(full_steps.tolist())) > 1


def test_an_answer_target_refuses_truncation_and_random_depth():
    with pytest.raises(PonderError, match="halting-target final trains on every step's answer: give truncation 0"):
        PonderConfig.of(step="align", halting_target="final")  # align implies truncation 0.1
    with pytest.raises(PonderError, match="depth-min 0"):
        PonderConfig.of(halting_target="correct", depth_min=2)
    with pytest.raises(PonderError, match="--halting-target applies to --method pondernet"):
        PonderConfig.of(method="act", halting_target="final")


@pytest.mark.parametrize("target", ["final", "correct"])
def test_an_answer_target_refuses_the_kl_terms_settings_it_never_reads(target, ponder, error, tmp_path,
                                                                       checkpoint):
    """No KL term under an answer target: --beta, --lambda-p, --prior and --beta-warmup given
    would change nothing, so they are refused as a setting no chosen piece reads is; the same
    values left to the defaults, or in the checkpoint a run starts from, are not (a checkpoint's
    are not carried: they would say the run has a prior it never reads)."""
    answer = dict(halting_target=target, truncation=0.0)
    for key, value in (("beta", 0.1), ("lambda_p", 0.3), ("prior", "uniform"), ("beta_warmup", 5)):
        with pytest.raises(PonderError, match=f"^--{key.replace('_', '-')} applies to --halting-target prior, "
                                              f"not {target}$"):
            PonderConfig.of(**answer, **{key: value})
        assert PonderConfig.of(**{key: value}).value(key) == value  # under the prior it is read
    assert PonderConfig.of(**answer).method.lambda_p == PonderConfig.of().method.lambda_p
    # a saved run that holds one (an earlier version carried it from --init-from) says it had no effect
    saved = {**PonderConfig.of(**answer).to_dict(), "lambda_p": 0.3}
    with pytest.warns(PonderWarning, match=f"lambda_p = 0.3 applies to --halting-target prior, not {target}; it "
                                           f"has no effect"):
        PonderConfig.from_dict(saved, saved=f"run-{target}")
    shown = PonderConfig.of(**answer).shown_fields()  # what config.toml, info and training's lines show
    assert "halting_target" in shown and not {"lambda_p", "prior", "beta", "beta_warmup"} & set(shown)
    assert {"lambda_p", "beta"} <= set(PonderConfig.of().shown_fields())
    error(ponder("train", "--halting-target", target, "--truncation", "0", "--beta", "0.1", "--data-dir", tmp_path), 2,
          "--beta", "--halting-target prior", target)
    config = tmp_path / "answer.toml"
    config.write_text(f'halting_target = "{target}"\ntruncation = 0.0\nlambda_p = 0.3\n')
    error(ponder("train", "--config", config, "--data-dir", tmp_path), 2, f"--config {config}: lambda_p",
          "--halting-target prior", target)
    prior_run = tmp_path / "prior.pt"  # a model trained under the prior, with a beta of its own
    state = load_checkpoint(checkpoint)
    torch.save(dataclasses.replace(state, config=state.config.replace(beta=0.05)).to_dict(), prior_run)
    printed = ponder("train", "--init-from", prior_run, "--halting-target", target, "--truncation", "0",
                     "--print-config", "-f", "json")
    assert printed.exit_code == 0, printed.output
    assert "beta" not in json.loads(printed.stdout)["method"]  # no setting of this run, nor of its config.toml
    carried = StartingWeights.read(prior_run).settings({"halting_target": target, "truncation": 0.0})
    assert "beta" not in carried and "lambda_p" not in carried and carried["max_steps"] == state.config.method.max_steps
    assert StartingWeights.read(prior_run).settings({})["beta"] == 0.05  # under its own prior it is carried
    answer_run = tmp_path / "answer.pt"  # resumed, an answer-trained run refuses them as any run refuses another's
    torch.save(dataclasses.replace(state, config=state.config.replace(**answer)).to_dict(), answer_run)
    with pytest.raises(PonderError, match=f"cannot resume .*--beta applies to --halting-target prior, not {target}"):
        resolve_config({"beta": PonderConfig.default("beta")}, str(answer_run))


def _data(tiny_mnist, cfg):
    return train_val_split(load_mnist(tiny_mnist, train=True, download=False),
                           val_size=cfg.task.val_size, train_size=cfg.task.train_size, seed=cfg.training.seed)


def test_a_refit_trains_the_halting_head_alone_and_resumes_as_straight_through(tiny_mnist, tmp_path):
    cpu = torch.device("cpu")
    cfg = PonderConfig.of(**SMALL, epochs=1)
    train_set, val_set = _data(tiny_mnist, cfg)
    train(cfg, train_set, val_set, device=cpu, out_dir=tmp_path / "source", progress=False)
    source = load_checkpoint(tmp_path / "source" / "last.pt").model
    refit = cfg.replace(refit_halting=True, epochs=2, seed=5, truncation=0.0, **FINAL)
    init = StartingWeights.read(tmp_path / "source" / "last.pt")
    init.check_fits(refit)  # the head's new shape is no misfit: the refit starts it anew
    train(refit, train_set, val_set, device=cpu, out_dir=tmp_path / "a", progress=False, init=init.weights(refit))
    refitted = load_checkpoint(tmp_path / "a" / "last.pt").model
    body = [key for key in source if not key.startswith("halting_head.")]
    assert body and all(torch.equal(refitted[key], source[key]) for key in body)  # bit-equal after two epochs
    assert refitted["halting_head.weight"].shape == (1, 16 + 7)  # a new head: the state and the answer
    torch.manual_seed(5)
    assert not torch.equal(refitted["halting_head.weight"], new_model(refit).halting_head.weight)  # it learnt
    # resumed after its first epoch, the refit ends where the straight one did
    train(refit.replace(epochs=1), train_set, val_set, device=cpu, out_dir=tmp_path / "b", progress=False,
          init=init.weights(refit))
    train(refit, train_set, val_set, device=cpu, out_dir=tmp_path / "b", progress=False,
          resume=load_checkpoint(tmp_path / "b" / "last.pt"))
    resumed = load_checkpoint(tmp_path / "b" / "last.pt").model
    assert all(torch.equal(resumed[key], refitted[key]) for key in refitted)


def test_train_refit_halting_takes_the_checkpoints_settings(checkpoint, tiny_mnist, tmp_path, ponder, one_error_line, error):
    common = ["--val-size", "100", "--batch-size", "64", "--no-progress", "--data-dir", tiny_mnist]
    result = ponder("train", "--init-from", checkpoint, "--refit-halting", "--halting-target", "final",
                    "--halting-input", "state+answer", "--epochs", "1", *common, "--out", tmp_path / "refit")
    assert result.exit_code == 0, result.output
    assert "every weight frozen but a new halting head's" in result.stderr
    saved, refit = load_checkpoint(checkpoint).config, load_checkpoint(tmp_path / "refit" / "last.pt").config
    assert refit.replace(halting_target="prior", halting_input="state", epochs=saved.training.epochs,
                         refit_halting=False, split_seed=None) == saved
    assert refit.task.split_seed == saved.training.seed  # its held-out digits are the checkpoint's
    assert refit.training.refit_halting is True
    info = json.loads(ponder("info", tmp_path / "refit", "-f", "json").stdout)
    assert info["start"]["checkpoint"] == str(checkpoint.resolve()) and info["start"]["epoch"] == 1
    words = info["train_command"].split()  # the command reproduces the refit, the body's origin with it
    assert "--refit-halting" in words and words[words.index("--init-from") + 1] == str(checkpoint.resolve())
    # a run from the refit's weights keeps the head it learnt unless it asks for a refit again
    again = ponder("train", "--init-from", tmp_path / "refit" / "last.pt", "--print-config", "-f", "json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["training"]["refit_halting"] is False
    # resumed, the stored switch keeps the body frozen: bit-equal to the checkpoint's after epoch 2
    resumed = ponder("train", "--resume", tmp_path / "refit", "--epochs", "2", "--data-dir", tiny_mnist,
                     "--no-progress")
    assert resumed.exit_code == 0, resumed.output
    source, after = load_checkpoint(checkpoint).model, load_checkpoint(tmp_path / "refit" / "last.pt")
    assert after.epoch == 2 and after.config.training.refit_halting is True
    assert all(torch.equal(after.model[key], value) for key, value in source.items() if not key.startswith("halting_"))
    # a refit names the model it refits; a body that does not fit is --init-from's one error
    alone = ponder("train", "--refit-halting", *common, "--out", tmp_path / "alone")
    error(alone, 2, "--refit-halting", "--init-from CHECKPOINT")
    printed = ponder("train", "--refit-halting", *common, "--print-config")  # what it would train: the same refusal
    assert error(printed, 2) == one_error_line(alone)
    misfit = ponder("train", "--init-from", checkpoint, "--refit-halting", "--hidden", "32", *common,
                    "--out", tmp_path / "misfit")
    line = error(misfit, 2, f"--init-from {checkpoint}")
    assert "halting_head" not in line and not (tmp_path / "alone").exists() and not (tmp_path / "misfit").exists()
    help_text = ponder("train", "--help").stdout  # the refit shown; the target a study setting, as --prior
    assert "--refit-halting" in help_text and "--halting-target" not in help_text


@pytest.mark.parametrize("target", ["final", "correct"])
def test_a_prior_bias_is_refused_with_a_target_that_refuses_the_priors_parameter(target, ponder, one_error_line):
    # --halting-bias prior reads lambda-p; a head trained on the answer reads neither
    for given in (["--halting-bias", "prior"], ["--lambda-p", "0.3"], ["--halting-bias", "prior", "--lambda-p", "0.3"]):
        result = ponder("train", *given, "--halting-target", target, "--truncation", "0", "--print-config")
        line = one_error_line(result)
        assert result.exit_code == 2 and given[0] in line and "--halting-target" in line, line
    with pytest.raises(PonderError, match="--halting-bias prior"):
        PonderConfig.of(halting_bias="prior", halting_target=target, truncation=0.0)
    # a number is the bias itself; what align implies (the logit of its own lambda-p) is no setting given
    assert PonderConfig.of(halting_bias=-1.0, halting_target=target, truncation=0.0).method.halting_bias == -1.0
    assert PonderConfig.of(step="align", halting_target=target, truncation=0.0).method.halting_bias == 0.0
