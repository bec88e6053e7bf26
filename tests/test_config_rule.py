"""One rule for a setting the chosen pieces do not read: refused when given (`of`, options, a
config file), a one-line warning when a saved run holds it; and every kind of checkpoint an
earlier release wrote loads and evaluates."""

import dataclasses
import json
import re
import warnings

import pytest
import torch

from ponder_cli import PonderError
from ponder_cli.checkpoint import TrainingState, new_model
from ponder_cli.config import PLACES, PonderConfig, applies, readers
from ponder_cli.registry import PIECES
from ponder_cli.folders import shipped_path

# a valid value of each setting some pieces read, other than its default and than any piece implies
OTHER = {"elems": 16, "train_counts": "1-8", "batches_per_epoch": 10, "curriculum": 5, "curriculum_start": 3,
         "train_rotation": 10.0, "val_size": 100, "train_size": 100, "hidden_cnn": 32, "hidden_lin": 32,
         "kernel_size": 3, "cnn_dropout": 0.3, "cnn_dropout_mask": "per-step", "mlp_dropout": 0.3, "align_turn": 20.0,
         "turn_gate": 0.3, "gru_layer_norm": True, "gru_orthogonal": True, "gru_update_bias": 0.5, "max_steps": 8,
         "halting_input": "state+confidence", "halting_bias": 0.7, "lambda_p": 0.3, "beta": 0.02, "tau": 0.02,
         "act_epsilon": 0.02, "truncation": 0.05, "truncation_rule": "roulette", "prior": "uniform",
         "beta_warmup": 10, "depth_min": 2, "halting_target": "final", "split_seed": 7, "halting_threshold": 0.9,
         "layout": "prefix", "encoding": "onehot", "curriculum_advance": 0.9, "curriculum_mix": 0.25}
COMBINATIONS = [dict(zip(PIECES, names)) for names in
                [("mnist", "mlp"), ("mnist", "align"), ("parity", "rnn"), ("parity", "gru")]
                for names in [(*names, method) for method in ("pondernet", "act", "plain")]]


def test_every_setting_a_piece_reads_has_another_value_here():
    assert {key for key in PLACES if readers(key)} == set(OTHER)


@pytest.mark.parametrize("pieces", COMBINATIONS, ids=lambda pieces: "-".join(pieces.values()))
def test_a_given_setting_and_a_saved_one_agree_on_every_setting(pieces):
    """For each setting: `of` accepts it exactly when the chosen pieces read it, and a saved
    config holding it warns exactly when `of` refuses it, in the same words."""
    for key, value in OTHER.items():
        if (key, pieces["step"], pieces["method"]) == ("halting_target", "align", "pondernet"):
            # align implies truncation 0.1, which a target read from every step's answer refuses
            with pytest.raises(PonderError, match="give truncation 0"):
                PonderConfig.of(**pieces, **{key: value})
            assert PonderConfig.of(**pieces, **{key: value}, truncation=0.0).value(key) == value
            continue
        if (key, pieces["method"]) == ("halting_threshold", "pondernet"):
            # the threshold of a head trained on the answer: beside the prior's target, not read
            with pytest.raises(PonderError, match="applies to --halting-target final, correct, not prior"):
                PonderConfig.of(**pieces, **{key: value})
            assert PonderConfig.of(**pieces, **{key: value}, halting_target="final", truncation=0.0).value(key) == value
            continue
        if key == "curriculum_mix" and pieces["task"] == "parity":  # a share of a curriculum's batches
            with pytest.raises(PonderError, match="--curriculum-advance"):
                PonderConfig.of(**pieces, **{key: value})
            assert PonderConfig.of(**pieces, **{key: value}, curriculum=5).value(key) == value
            continue
        try:
            outcome = PonderConfig.of(**pieces, **{key: value}).value(key)
        except PonderError as exc:
            outcome = str(exc)
        refused = not applies(key, pieces)
        assert refused == (outcome != value), (key, outcome)
        if refused:
            assert outcome.startswith(f"--{key.replace('_', '-')} applies to --")
        # a run's own saved config (what it derives from the value too: parity's training counts)
        saved = {**PonderConfig.of(**pieces).to_dict(), key: value} if refused else \
            PonderConfig.of(**pieces, **{key: value}).to_dict()
        if (key, pieces["method"]) == ("max_steps", "plain"):  # not a plain model: refused, saved or not
            with pytest.raises(PonderError, match="plain runs exactly one step"):
                PonderConfig.from_dict(saved)
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert PonderConfig.from_dict(saved, saved=f"run {'-'.join(pieces.values())}").value(key) == value
        assert [str(w.message).split(";")[0] for w in caught] == \
            ([f"run {'-'.join(pieces.values())}: {key} = {value!r}" + outcome[len(key) + 2:]] if refused else [])


def test_a_saved_config_at_its_defaults_and_implied_values_is_silent():
    for pieces in COMBINATIONS:
        saved = PonderConfig.of(**pieces).to_dict()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert PonderConfig.from_dict(saved, saved="run").to_dict() == saved


def _payload(name: str) -> dict:
    return torch.load(shipped_path(name), map_location="cpu", weights_only=True)


def _tiny(cfg: PonderConfig, edit: dict, version: int = 2) -> dict:
    """A payload as an earlier release wrote it: a tiny model's, its flat config edited."""
    torch.manual_seed(0)
    payload = TrainingState(config=cfg, model=new_model(cfg).state_dict(), epoch=1).to_dict()
    payload["config"] = {**payload["config"], **edit}
    return {key: value for key, value in payload.items() if value is not None}


def _drop(config: dict, *keys) -> dict:
    return {key: value for key, value in config.items() if key not in keys}


TINY = dict(hidden=8, hidden_cnn=8, max_steps=3)
# each kind of checkpoint, as earlier releases wrote it, and the warning it loads with (None: none)
OLD = {
    # 0.1: no task, no step choice of gru's, no curriculum, no cnn_dropout_mask nor truncation_rule
    "align with a non-default hidden_lin": (
        lambda: {**_payload("align"), "config": {**_payload("align")["config"], "hidden_lin": 128}},
        "hidden_lin = 128 applies to --step mlp, not align; it has no effect"),
    "the reference, its flat config without later keys": (
        lambda: {**_payload("reference"), "config": _drop(_payload("reference")["config"], "cnn_dropout_mask",
                                                            "task", "elems", "train_counts")}, None),
    "act with a lambda_p of pondernet's": (
        lambda: _tiny(PonderConfig.of(method="act", **TINY), {"lambda_p": 0.3}),
        "lambda_p = 0.3 applies to --method pondernet, not act; it has no effect"),
    "plain with align's implied halting settings": (
        lambda: _tiny(PonderConfig.of(step="align", method="plain", hidden=8, hidden_cnn=8), {}), None),
    "mlp with the turn gate of align's": (
        lambda: _tiny(PonderConfig.of(**TINY), {"turn_gate": 0.2}),
        "turn_gate = 0.2 applies to --step align, not mlp; it has no effect"),
    "parity act, lambda_p implied by the task": (lambda: _payload("parity16-extrapolation-act"), None),
    "parity rnn with an image setting": (
        lambda: _tiny(PonderConfig.of(task="parity", elems=8, step="rnn", hidden=8, max_steps=3),
                      {"kernel_size": 3, "train_rotation": 0.0}),
        "train_rotation = 0.0 applies to --task mnist, not parity; it has no effect"),
}


@pytest.mark.parametrize("kind", OLD)
def test_every_kind_of_old_checkpoint_loads_and_evaluates(kind, tiny_mnist, tmp_path, ponder):
    make, warning = OLD[kind]
    path = tmp_path / "old.pt"
    torch.save(make(), path)
    result = ponder("eval", path, "--limit", "40", "-f", "json", "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert 0 <= report["buckets"][0]["accuracy"] <= 1
    warned = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert warned[:1] == ([f"Warning: checkpoint {path}: {warning}"] if warning else [])
    assert len(warned) == bool(warning) + (kind == "parity rnn with an image setting")  # once each, a line each


def test_a_setting_taken_from_a_checkpoint_names_the_option_that_read_it(ponder, error):
    """--init-from's checkpoint gives settings as a --config file does: a clash names that option
    and the checkpoint, never --config nor a flag the user did not give (a refit's too)."""
    for refit in ([], ["--refit-halting"]):
        line = error(ponder("train", "--init-from", "align", *refit, "--step", "mlp", "--print-config"), 2,
                     "--init-from ", "checkpoints/align/best.pt", "halting_input state+turn", "mlp")
        assert "--config" not in line and "--halting-input" not in line


def test_a_runs_config_json_with_a_setting_its_pieces_do_not_read_warns_once_and_re_runs(tmp_path, ponder):
    path = tmp_path / "config.json"
    saved = {**PonderConfig.of(method="act", max_steps=5).to_dict(), "lambda_p": 0.3}
    path.write_text(json.dumps({"ponder_cli": "0.1.0", "config": saved}))
    result = ponder("train", "--config", path, "--print-config")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == \
        [f"Warning: --config {path}: lambda_p = 0.3 applies to --method pondernet, not act; it has no effect"]
    assert "lambda_p" not in result.stdout and 'method = "act"' in result.stdout and "max_steps = 5" in result.stdout


def test_the_prior_halting_bias_is_its_logit_by_every_way_in():
    """halting_bias "prior" is the logit of lambda_p, whether given to `of` (an option's text
    too), to `replace`, or saved: one place turns the word into its number."""
    import math

    logit = math.log(0.3 / 0.7)
    assert PonderConfig.of(step="align", halting_bias="prior", lambda_p=0.3).method.halting_bias == logit
    assert PonderConfig.of(step="align", halting_bias="-1.5").method.halting_bias == -1.5
    assert PonderConfig.of(step="align", lambda_p=0.3).replace(halting_bias="prior").method.halting_bias == logit
    assert PonderConfig.from_dict({"step": "align", "lambda_p": 0.3, "halting_bias": "prior"}).method.halting_bias \
        == logit


def test_what_the_user_gave_to_the_wrong_piece_is_named_before_what_it_would_mean():
    """plain reads no halting input: that is the mistake, not that mlp shows no turn."""
    with pytest.raises(PonderError, match=r"^--halting-input applies to --method pondernet, act, not plain$"):
        PonderConfig.of(method="plain", halting_input="state+turn")
    with pytest.raises(PonderError, match=r"^--config f.toml: halting_input state\+turn: step mlp has no turn"):
        PonderConfig.of(halting_input="state+turn", origins={"halting_input": "f.toml"})


@pytest.mark.parametrize("kind", PIECES)
@pytest.mark.parametrize("value", [["x"], {"name": "x"}, 3])
def test_a_piece_of_the_wrong_type_is_named(kind, value):
    with pytest.raises(PonderError, match="^" + re.escape(f"--config f.json: {kind} must be a string (got {value!r})")):
        PonderConfig.of(**{kind: value}, origins={kind: "f.json"})


def test_a_config_made_any_way_is_checked():
    from ponder_cli.config import MethodSettings, StepSettings

    with pytest.raises(PonderError, match=r"lambda-p must be in \(0, 1\] \(got 5.0\)"):
        PonderConfig(method=MethodSettings(lambda_p=5.0))
    with pytest.raises(PonderError, match="halting-bias must be a number"):
        PonderConfig(method=MethodSettings(halting_bias="prior"))  # the word is build's to turn into its logit
    with pytest.raises(PonderError, match="--step gru does not fit --task mnist"):
        dataclasses.replace(PonderConfig.of(), step=StepSettings(name="gru"))


def test_what_a_task_derives_is_the_same_whether_its_source_was_typed_or_default():
    """parity's training counts come from elems, given or not: one run, one config (compare
    groups them as one method)."""
    assert PonderConfig.of(task="parity") == PonderConfig.of(task="parity", elems=64)
    assert PonderConfig.of(task="parity").task.train_counts == "1-64"
    assert PonderConfig.of(task="parity", elems=16).task.train_counts == "1-16"


def test_the_halting_study_settings_are_pondernets_and_checked_together():
    cfg = PonderConfig.of(prior="uniform", beta_warmup=100, depth_min=3, max_steps=6)
    assert (cfg.method.prior, cfg.method.beta_warmup, cfg.method.depth_min) == ("uniform", 100, 3)
    for given in (dict(method="act", prior="uniform"), dict(method="act", depth_min=2),
                  dict(method="plain", beta_warmup=10)):
        with pytest.raises(PonderError, match="applies to --method pondernet"):
            PonderConfig.of(**given)
    with pytest.raises(PonderError, match="depth-min 7 is above max-steps 6"):
        PonderConfig.of(depth_min=7, max_steps=6)
    with pytest.raises(PonderError, match="not roulette"):
        PonderConfig.of(depth_min=2, truncation=0.1, truncation_rule="roulette")
    with pytest.raises(PonderError, match="prior must be one of geometric, uniform"):
        PonderConfig.of(prior="flat")
    with pytest.raises(PonderError, match="beta-warmup must be >= 0"):
        PonderConfig.of(beta_warmup=-1)
