"""Settings in files: `ponder train --config`, `--print-config` and a run folder's config.toml."""

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from ponder_cli import PonderError
from ponder_cli.config import SECTIONS, PonderConfig, read_config_file, readers, render_config

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def from_file(path):
    """The configuration a file gives, its keys' messages naming it, as `ponder train --config`."""
    values = read_config_file(path)
    return PonderConfig.of(origins={key: path for key in values}, **values)


def test_every_setting_sits_in_one_table_and_a_pieces_settings_in_its_own():
    placed = [name for names in SECTIONS.values() for name in names]
    assert sorted(placed) == sorted(PonderConfig.field_names())
    for section, names in SECTIONS.items():
        for name in names:
            kinds = set(readers(name))
            # a setting only steps read is a [step] setting, and so on
            assert len(kinds) != 1 or kinds == {section}, (name, section, kinds)


def test_a_file_of_tables_gives_its_settings_typed(tmp_path):
    path = write(tmp_path, "run.toml", '[task]\ntask = "parity"\nelems = 16\n\n[method]\nlambda_p = 0.5\n'
                                        'halting_bias = "prior"\n\n[step]\ngru_layer_norm = false\n'
                                        '\n[training]\nlr = 3e-4\ngrad_clip = 1\n')
    assert read_config_file(path) == {"task": "parity", "elems": 16, "lambda_p": 0.5, "halting_bias": "prior",
                                      "gru_layer_norm": False, "lr": 0.0003, "grad_clip": 1}
    cfg = from_file(path)
    assert isinstance(cfg.training.grad_clip, float) and cfg.training.grad_clip == 1.0  # a whole number does
    assert cfg.method.halting_bias == 0.0  # "prior": the logit of lambda_p 0.5


def test_a_flat_json_file_is_read_too(tmp_path):
    assert read_config_file(write(tmp_path, "a.json", '{"epochs": 3, "step": "align"}')) == {"epochs": 3,
                                                                                           "step": "align"}


@pytest.mark.parametrize("text,named,code", [  # the key and what is wrong with it: a suggestion, its table, its type;
    # a mistake in a setting is a usage mistake (2), as on the command line; a file not of TOML is unreadable (1)
    ('[training]\nlamda_p = 0.1\n', ["'lamda_p'", "'lambda_p'"], 2),
    ('[training]\nlambda_p = 0.1\n', ["lambda_p", "[method]", "[training]"], 2),
    ('[model]\nhidden = 3\n', ["[model]", "[task], [step], [method], [training]"], 2),
    ('[training]\nepochs = "20"\n', ["epochs", "whole number", "'20'"], 2),
    ('[training]\nepochs = 2.5\n', ["epochs", "whole number", "2.5"], 2),
    ('[step]\ngru_orthogonal = 1\n', ["gru_orthogonal", "true or false", "1"], 2),
    ('[training]\nlr = inf\n', ["lr", "finite"], 2),
    ('[method]\nhalting_bias = "high"\n', ["halting_bias", "'prior'", "'high'"], 2),
    ('[method]\nmethod = "act"\nlambda_p = 0.3\n', ["lambda_p", "--method pondernet", "act"], 2),
    ('epochs = \n', ["TOML"], 1),
])
def test_a_mistake_in_a_file_is_one_message_naming_the_file_and_the_key(tmp_path, text, named, code):
    path = write(tmp_path, "run.toml", text)
    with pytest.raises(PonderError) as caught:
        from_file(path)
    assert caught.value.exit_code == code
    assert str(caught.value).startswith(f"--config {path}: ")
    assert all(part in str(caught.value) for part in named), str(caught.value)


def test_a_missing_file_a_folder_or_a_device_is_named(tmp_path):
    with pytest.raises(PonderError, match="nope.toml does not exist"):
        read_config_file(tmp_path / "nope.toml")
    with pytest.raises(PonderError, match="is a directory"):
        read_config_file(tmp_path)
    # the same check as for checkpoints and predict's inputs: never "no such file" for /dev/null
    with pytest.raises(PonderError, match="^--config /dev/null is a character device"):
        read_config_file(Path("/dev/null"))
    os.mkfifo(tmp_path / "fifo")  # never opened: reading a pipe would wait for a writer
    with pytest.raises(PonderError, match="named pipe"):
        read_config_file(tmp_path / "fifo")


def test_a_setting_that_does_not_apply_names_the_file_and_the_key(tmp_path, ponder, error):
    config = tmp_path / "parity.toml"
    config.write_text('[task]\ntask = "parity"\ntrain_rotation = 30\n')
    named = [f"--config {config}: train_rotation", "--task mnist", "parity"]
    error(ponder("train", "--config", config, "--print-config"), 2, *named)
    config.write_text("[task]\ntrain_rotation = 30\n")  # the task from the command line, the key from the file
    error(ponder("train", "--config", config, "--task", "parity", "--out", tmp_path / "run"), 2, *named)
    assert not (tmp_path / "run").exists()
    # a flag the user typed is still named as the flag
    line = error(ponder("train", "--task", "parity", "--train-rotation", 30, "--print-config"), 2, "--train-rotation",
                 "--task mnist", "parity")
    assert "--config" not in line


OPTION_SETS = [{}, {"step": "align"}, {"method": "act", "tau": 0.02}, {"method": "plain"},
               {"task": "parity", "elems": 16}, {"task": "parity", "step": "rnn", "lr": 3e-4, "elems": 8},
               {"step": "align", "turn_gate": 0.1, "halting_input": "state+confidence+turn", "truncation": 0.05},
               {"halting_target": "final", "halting_input": "state+answer", "truncation": 0.0}]  # no prior to set


@pytest.mark.parametrize("given", OPTION_SETS)
def test_what_is_printed_reads_back_as_the_same_configuration(tmp_path, given):
    cfg = PonderConfig.of(**given)
    text = render_config(cfg, cfg.sources(given))
    again = PonderConfig.of(**read_config_file(write(tmp_path, "c.toml", text)))
    assert again == cfg
    as_json = render_config(cfg, cfg.sources(given), "json")
    tables = {k: v for k, v in json.loads(as_json).items() if k != "sources"}
    assert PonderConfig.of(**read_config_file(write(tmp_path, "c.json", json.dumps(tables)))) == cfg


def test_each_printed_value_says_where_it_came_from():
    given = {"task": "parity", "lr": 3e-4}
    cfg = PonderConfig.of(**given)
    lines = render_config(cfg, cfg.sources(given)).splitlines()
    assert "[task]" in lines and "[step]" in lines and "[method]" in lines and "[training]" in lines
    by_key = {line.split(" = ")[0]: line for line in lines if " = " in line}
    assert by_key["lr"].endswith("# given") and "0.0003" in by_key["lr"]
    assert by_key["step"].endswith("# implied by --task parity") and '"gru"' in by_key["step"]
    assert by_key["gru_update_bias"].endswith("# implied by --step gru")
    assert by_key["epochs"].endswith("# default")
    assert "train_rotation" not in by_key  # an MNIST setting means nothing to a parity run


def test_print_config_fed_back_as_config_changes_nothing(tmp_path, ponder):
    first = ponder("train", "--step", "align", "--lr", "0.0005", "--print-config")
    assert first.exit_code == 0, first.output
    path = write(tmp_path, "printed.toml", first.stdout)
    second = ponder("train", "--config", path, "--print-config")
    strip = lambda text: [line.split("#")[0].rstrip() for line in text.splitlines() if not line.startswith("#")]  # noqa: E731
    assert strip(second.stdout) == strip(first.stdout)
    assert f"# file {path}" in second.stdout
    override = ponder("train", "--config", path, "--epochs", "3", "--print-config")
    assert "epochs = 3" in override.stdout and "# given" in override.stdout


def test_a_value_the_task_fills_in_is_labelled_as_derived_not_as_a_default(ponder):
    printed = ponder("train", "--task", "parity", "--elems", "12", "--print-config")
    lines = {line.split("=")[0].strip(): line for line in printed.stdout.splitlines() if "=" in line}
    assert lines["train_counts"].startswith('train_counts = "1-12"')  # 1-ELEMS, from --elems
    assert lines["train_counts"].endswith("# derived by --task parity")
    assert lines["curriculum"].endswith("# default")
    given = ponder("train", "--task", "parity", "--elems", "12", "--train-counts", "1-6", "--print-config")
    assert 'train_counts = "1-6"' in given.stdout and "# derived" not in given.stdout


def test_a_bad_config_file_is_one_error_line(tmp_path, ponder, error):
    path = write(tmp_path, "bad.toml", "[training]\nepoch = 3\n")
    error(ponder("train", "--config", path, "--print-config"), 2, f"--config {path}", "'epoch'", "'epochs'")


def test_a_run_folder_config_toml_trains_the_same_model_again(tiny_mnist, tmp_path, ponder, quick):
    first = ponder("train", *quick, "--lambda-p", "0.3", "--seed", "7", "--data-dir", tiny_mnist,
                   "--out", tmp_path / "a", "-q")
    assert first.exit_code == 0, first.output
    saved = tmp_path / "a" / "config.toml"
    assert 'lambda_p = 0.3' in saved.read_text() and "seed = 7" in saved.read_text()
    for source in (saved, tmp_path / "a" / "config.json"):  # the TOML file and the run's JSON record
        out = tmp_path / f"again-{source.suffix[1:]}"
        again = ponder("train", "--config", source, "--data-dir", tiny_mnist, "--out", out, "-q")
        assert again.exit_code == 0, again.output
        a = torch.load(tmp_path / "a" / "best.pt", weights_only=True)
        b = torch.load(out / "best.pt", weights_only=True)
        assert a["config"] == b["config"]
        assert a["model"].keys() == b["model"].keys()
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_experiment_options_work_and_stay_out_of_help(tmp_path, ponder):
    result = ponder("train", "--step", "align", "--turn-gate", "0.1", "--print-config")
    assert result.exit_code == 0, result.output
    assert "turn_gate = 0.1" in result.stdout and result.stderr == ""
    help_text = ponder("train", "--help").stdout
    assert "--turn-gate" not in help_text and "--gru-layer-norm" not in help_text
    assert "--config" in help_text and "--print-config" in help_text
    import typer.main

    from ponder_cli.cli import app

    shown = [p.name for p in typer.main.get_command(app).commands["train"].params if not p.hidden]
    # about 25 settings and switches, --format, --time-limit, --refit-halting, the name, tags, note, --init-from
    assert len(shown) <= 34, shown


def test_the_docs_list_every_key_as_the_code_has_it():
    spec = importlib.util.spec_from_file_location("config_reference", REPO / "tools" / "config_reference.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    page = tool.PAGE.read_text(encoding="utf-8")
    assert tool.page_with_table(page) == page, "run: python tools/config_reference.py --write"
    for key in PonderConfig.field_names():
        assert f"| `{key}` |" in page, key


def test_a_run_record_whose_config_is_by_section_is_read_as_the_flat_one(tmp_path, ponder):
    """from_dict reads a saved config by section as well as flat: a run record's too."""
    path = write(tmp_path, "config.json", json.dumps(
        {"ponder_cli": "0.1.0", "config": {"task": {"name": "parity", "elems": 12}, "step": {"name": "gru"}, "method": {"max_steps": 6}}}))
    assert read_config_file(path) == read_config_file(write(tmp_path, "flat.json", json.dumps(
        {"ponder_cli": "0.1.0", "config": {"task": "parity", "elems": 12, "step": "gru", "max_steps": 6}})))
    result = ponder("train", "--config", path, "--print-config")
    assert result.exit_code == 0, result.output
    assert 'task = "parity"' in result.stdout and "elems = 12" in result.stdout and "max_steps = 6" in result.stdout
