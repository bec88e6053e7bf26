from pathlib import Path

import pytest
import torch

from ponder_cli import PonderError, PonderWarning
from ponder_cli.checkpoint import TrainingState, load_checkpoint, load_model, save_checkpoint
from ponder_cli.config import PonderConfig
from ponder_cli.checkpoint import new_model


def _state(cfg=PonderConfig.of(max_steps=3), **extra) -> TrainingState:
    return TrainingState(config=cfg, model=new_model(cfg).state_dict(), epoch=1, **extra)


def test_round_trip_rebuilds_the_model_from_its_config(tmp_path):
    cfg = PonderConfig.of(max_steps=3, hidden=8)
    torch.manual_seed(0)
    state = _state(cfg)
    save_checkpoint(state, tmp_path / "best.pt")
    model, loaded_cfg, loaded = load_model(tmp_path / "best.pt", "cpu")
    assert loaded_cfg == cfg and loaded.epoch == 1 and loaded.optimizer is None
    assert model.max_steps == 3
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.model.items())
    assert torch.load(tmp_path / "best.pt", weights_only=True)["version"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["best.pt"]  # no temp file left behind


def test_version_1_checkpoints_are_upgraded(tmp_path):
    """Version 1 kept the step function's weights under encoder. and step_mlp."""
    cfg = PonderConfig.of(max_steps=3)
    state = _state(cfg)
    old_names = {k.replace("step.encoder.", "encoder.").replace("step.mlp.", "step_mlp."): v
                 for k, v in state.model.items()}
    payload = {**state.to_dict(), "version": 1, "model": old_names}
    payload["config"].pop("step")  # version 1 had no step function to choose
    torch.save(payload, tmp_path / "v1.pt")
    model, loaded_cfg, _ = load_model(tmp_path / "v1.pt", "cpu")
    assert loaded_cfg == cfg
    assert torch.equal(model.step.encoder.conv1.weight, state.model["step.encoder.conv1.weight"])


def test_shipped_models_load():
    for path, step in (("checkpoints/best.pt", "mlp"), ("checkpoints/interpolation/best.pt", "mlp"),
                       ("checkpoints/align/best.pt", "align")):
        model, cfg, state = load_model(Path(__file__).resolve().parents[1] / "ponder_cli" / path, "cpu")
        assert cfg.step.name == step and cfg.method.name == "pondernet" and state.epoch > 0


def test_pickled_code_is_refused_and_never_runs(evil_checkpoint):
    path, marker = evil_checkpoint
    with pytest.raises(PonderError, match="refused"):
        load_checkpoint(path)
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"not a checkpoint", b"PK\x03\x04truncated"])
def test_garbage_files_give_one_line_errors(tmp_path, content):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(PonderError) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_not_ours_and_missing(tmp_path):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(PonderError, match="not a ponder_cli checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    with pytest.raises(PonderError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")
    with pytest.raises(PonderError, match="directory"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("key,value,fragment", [
    ("epoch", "one", "malformed 'epoch' (expected an integer, got str)"),
    ("epoch", True, "malformed 'epoch'"),
    ("epoch", -3, "malformed 'epoch' (-3)"),
    ("model", [1, 2], "malformed 'model' (expected a dict of tensors"),
    ("model", {"w": "not a tensor"}, "malformed 'model'"),
    ("optimizer", "adam", "malformed 'optimizer' (expected a dict"),
    ("best_accuracy", "high", "malformed 'best_accuracy' (expected a number"),
    ("history", [1], "malformed 'history' (expected a list of dicts"),
    ("rng", {"cuda": []}, "malformed 'rng'"),
    ("config", "pondernet", "malformed 'config'"),
])
def test_every_malformed_key_is_one_line(key, value, fragment, tmp_path):
    payload = {**_state().to_dict(), key: value}
    path = tmp_path / "odd.pt"
    torch.save(payload, path)
    with pytest.raises(PonderError) as err:
        load_checkpoint(path)
    assert fragment in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_checkpoint_without_training_state_cannot_be_resumed(tmp_path):
    save_checkpoint(_state(), tmp_path / "weights-only.pt")
    state = load_checkpoint(tmp_path / "weights-only.pt")
    with pytest.raises(PonderError, match="cannot be resumed: it has no optimizer, scheduler, scaler, rng state"):
        state.require_resumable(tmp_path / "weights-only.pt")


def test_non_finite_weights_are_a_warning_not_a_refusal(tmp_path, ponder):
    cfg = PonderConfig.of(max_steps=3, hidden=8)
    state = _state(cfg)
    name = next(iter(state.model))
    state.model[name] = state.model[name].clone()
    state.model[name].view(-1)[0] = float("nan")
    save_checkpoint(state, tmp_path / "nan.pt")
    expected = (f"checkpoint {tmp_path / 'nan.pt'} has non-finite weights (NaN or inf in 1 of its "
                f"{len(state.model)} tensors, {name} first): what it computes means nothing")
    with pytest.warns(PonderWarning) as caught:
        model, _, _ = load_model(tmp_path / "nan.pt", "cpu")
    assert [str(w.message) for w in caught] == [expected]
    assert torch.isnan(model.state_dict()[name]).any()  # loaded all the same
    # the CLI: one Warning line on stderr, even with --quiet, and the command goes on
    result = ponder("info", tmp_path / "nan.pt", "-q", "-f", "json")
    assert result.exit_code == 0 and result.stderr.splitlines() == [f"Warning: {expected}"]
    save_checkpoint(_state(cfg), tmp_path / "fine.pt")
    assert ponder("info", tmp_path / "fine.pt", "-q").stderr == ""
