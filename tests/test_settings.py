"""The configuration by section: each piece's settings in its own section, checked there, and the
flat form that checkpoints and JSON keep."""

import dataclasses

import pytest
import torch

from ponder_cli import PonderError
from ponder_cli.checkpoint import load_checkpoint
from ponder_cli.config import PonderConfig
from ponder_cli.config import SECTION_TYPES, SECTIONS
from ponder_cli.folders import shipped_path


def test_each_setting_lives_in_its_pieces_section():
    cfg = PonderConfig.of(task="parity", elems=16, step="gru", lambda_p=0.3, epochs=7)
    assert (cfg.task.name, cfg.task.elems, cfg.step.name, cfg.method.lambda_p, cfg.training.epochs) == \
        ("parity", 16, "gru", 0.3, 7)
    assert (cfg.method.name, cfg.step.hidden, cfg.training.seed) == ("pondernet", 128, 1234)  # default, implied
    assert cfg.value("lambda_p") == 0.3 and cfg.value("task") == "parity"
    assert cfg.task.train_counts == "1-16"  # what the run trains on, saved


def test_the_flat_form_round_trips_and_the_section_form_is_read_too():
    cfg = PonderConfig.of(step="align", lambda_p=0.4, seed=3)
    flat = cfg.to_dict()
    assert flat["step"] == "align" and flat["lambda_p"] == 0.4 and flat["seed"] == 3 and "name" not in flat
    assert list(flat) == [key for keys in SECTIONS.values() for key in keys]
    assert PonderConfig.from_dict(flat) == cfg
    by_section = {"task": {"name": "mnist"}, "step": {"name": "align", "turn_gate": 0.2},
                  "method": {"lambda_p": 0.4, "max_steps": 12}, "training": {"seed": 3}}
    rebuilt = PonderConfig.from_dict(by_section)
    assert (rebuilt.step.name, rebuilt.step.turn_gate, rebuilt.method.max_steps, rebuilt.training.seed) == \
        ("align", 0.2, 12, 3)


def test_replace_takes_flat_keys_and_validates_again():
    cfg = PonderConfig.of(max_steps=3)
    assert cfg.replace(lambda_p=0.5, epochs=2).method.lambda_p == 0.5
    assert cfg.replace(epochs=2).training.epochs == 2 and cfg.training.epochs == 20  # frozen: a copy
    with pytest.raises(PonderError, match=r"epochs must be > 0 \(got 0\)"):
        cfg.replace(epochs=0)


@pytest.mark.parametrize("settings, message", [
    ({"batch_size": 0}, r"^batch-size must be > 0 \(got 0\)$"),
    ({"curriculum": -1}, r"^curriculum must be >= 0 \(got -1\)$"),
    ({"halting_input": "turn"}, r"^halting-input must be one of state, "),
    ({"max_steps": 101}, r"^max-steps must be from 1 to 100 \(got 101\)"),
    ({"lr_factor": 1.0}, r"^lr-factor must be in \(0, 1\) \(got 1.0\)$"),
    ({"beta": float("inf")}, r"^beta must be a finite number$"),
    ({"seed": -1}, r"^seed must be an integer from 0 to 2\*\*63 - 1 \(got -1\)$"),
    ({"method": "ut"}, r"^method must be one of pondernet, act, plain \(got 'ut'\)$"),
])
def test_a_section_names_the_option_it_refuses(settings, message):
    with pytest.raises(PonderError, match=message):
        PonderConfig.of(**settings)


def test_every_problem_of_every_section_is_said_at_once():
    with pytest.raises(PonderError) as caught:
        PonderConfig.of(val_size=0, hidden=0, beta=float("nan"), epochs=0)
    assert str(caught.value) == ("val-size must be > 0 (got 0); hidden must be > 0 (got 0); beta must be a finite "
                                 "number; epochs must be > 0 (got 0)")


def test_an_unknown_key_and_a_flat_constructor_call_are_refused():
    with pytest.raises(PonderError, match=r"unknown config keys \['lambda'\]"):
        PonderConfig.of(**{"lambda": 0.1})
    with pytest.raises(TypeError, match="PonderConfig.of"):
        PonderConfig(task="parity")


def test_the_sections_hold_every_setting_once_with_its_old_flat_key():
    keys = [key for section, kind in SECTION_TYPES.items()
            for key in (section if f.name == "name" else f.name for f in dataclasses.fields(kind))]
    assert len(keys) == len(set(keys)) == 52
    assert {"task", "step", "method", "elems", "lambda_p", "seed"} <= set(keys)


@pytest.mark.parametrize("name", ["reference", "align", "parity16-extrapolation-act"])
def test_a_shipped_checkpoint_written_flat_loads_into_the_sections(name):
    saved = torch.load(shipped_path(name), map_location="cpu", weights_only=True)["config"]
    assert all(not isinstance(value, dict) for value in saved.values())  # written flat, before the sections
    state = load_checkpoint(shipped_path(name))
    assert {key: value for key, value in state.config.to_dict().items() if key in saved} == saved
    assert state.config.step.name == {"reference": "mlp", "align": "align", "parity16-extrapolation-act": "gru"}[name]
