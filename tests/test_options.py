"""Options that do not apply (one rule, from the settings' declarations, checked against what the
pieces' code reads), implied settings in --help, `ponder train`'s options made from the settings' fields, and
the wording of usage errors and help."""

import io
import json
import re

import pytest

from ponder_cli import PonderError
from ponder_cli.config import PonderConfig, inapplicable, readers, setting
from ponder_cli.registry import PIECES, piece_class
from ponder_cli.reports import combine_draws, per_step_table, sweep_report
from ponder_cli.tasks import get_task
from ponder_cli.tasks.declared import MNIST_TERMS
from ponder_cli.render import render_report

NO_DATA = ["--data-dir", "/nonexistent/ponder-data", "--no-download"]  # refused before any data is read


@pytest.mark.parametrize("args,named", [  # the option refused, the pieces that read it, the one chosen
    (["--tau", "0.1"], ["--tau", "--method act", "pondernet"]),
    (["--method", "act", "--beta", "0.1"], ["--beta", "--method pondernet", "act"]),
    (["--method", "act", "--lambda-p", "0.3"], ["--lambda-p", "--method pondernet", "act"]),
    (["--method", "plain", "--halting-bias", "1"], ["--halting-bias", "--method pondernet, act", "plain"]),
    (["--method", "plain", "--max-steps", "1"], ["--max-steps", "--method pondernet, act", "plain"]),
    (["--method", "plain", "--tau", "1", "--truncation", "0.1"],  # both in one line
     ["--tau", "--method act", "--truncation", "--method pondernet, act", "plain"]),
    (["--align-turn", "20"], ["--align-turn", "--step align", "mlp"]),
    (["--turn-gate", "0.2"], ["--turn-gate", "--step align", "mlp"]),
    (["--method", "plain", "--step", "align", "--turn-gate", "0.2"], ["--turn-gate", "--method pondernet, act", "plain"]),
    (["--step", "align", "--cnn-dropout-mask", "shared"], ["--cnn-dropout-mask", "--step mlp", "align"]),
])
def test_an_option_no_chosen_piece_reads_is_refused(args, named, ponder, error):
    error(ponder("train", *args, *NO_DATA), 2, *named)


def test_what_the_chosen_pieces_read_is_accepted():
    assert PonderConfig.of(method="act", tau=0.1, max_steps=5).method.tau == 0.1
    align = PonderConfig.of(step="align", align_turn=20.0, turn_gate=0.1, halting_bias="prior", lambda_p=0.4)
    assert (align.step.align_turn, align.step.turn_gate, align.method.max_steps) == (20.0, 0.1, 12)
    plain = PonderConfig.of(method="plain", step="align", epochs=3)
    assert plain.method.max_steps == 1 and plain.training.epochs == 3
    assert inapplicable({"epochs": 1, "seed": 2, "lr": 0.1}, {"method": "plain", "step": "mlp"}) == []


def test_readers_come_from_the_settings_declarations():
    assert readers("tau") == {"method": ("act",)} and readers("hidden_lin") == {"step": ("mlp",)}
    assert readers("turn_gate") == {"step": ("align",), "method": ("pondernet", "act")}
    assert readers("lambda_p") == {"method": ("pondernet",), "halting_target": ("prior",)}
    assert readers("epochs") == {} and readers("seed") == {} and readers("hidden") == {}  # every run reads these
    assert readers("train_rotation") == {"task": ("mnist",)} and readers("elems") == {"task": ("parity",)}
    assert readers("gru_orthogonal") == {"step": ("gru",)}
    for names in ("acts", ("mlp", "alinge")):  # a misspelt piece in a declaration fails as the module loads
        with pytest.raises(ValueError, match="no piece is named"):
            setting(0, of=names)
    with pytest.raises(ValueError, match="no piece is named plian"):
        setting(0, implied={"plian": 1})


def _read_settings(cfg, training: bool = True):
    """The settings (flat keys) that building `cfg`'s model and method, a (truncated) training
    forward and its loss, and a prediction read; and those outputs (an evaluation forward when not
    `training`: no dropout stream)."""
    import torch

    from ponder_cli.checkpoint import new_model
    from ponder_cli.config import PLACES, SECTION_TYPES
    from ponder_cli.model import get_method

    keys = {(SECTION_TYPES[section], field.name): key for key, (section, field) in PLACES.items()}
    seen = set()

    def recording(kind):
        def read(self, name):
            seen.update([keys[(kind, name)]] if (kind, name) in keys else [])
            return object.__getattribute__(self, name)
        return read

    for kind in SECTION_TYPES.values():
        kind.__getattribute__ = recording(kind)
    try:
        torch.manual_seed(0)
        task = get_task(cfg)
        model, method = new_model(cfg).train(training), get_method(cfg)
        draws = torch.Generator().manual_seed(1)
        x = torch.randint(-1, 2, (4, *task.input_shape), generator=draws).float()
        targets = torch.randint(0, task.classes, (4,), generator=draws)
        stop = method.truncation(4, "cpu") if training else None
        out = model(x, stop=stop)
        loss = method.loss(out.logits, out.lambda_logits, targets, computed=None if stop is None else out.computed,
                           progress=torch.tensor(3.0)).total
        scores, steps = method.predict(out.logits, out.lambda_logits,
                                       torch.rand(out.logits.shape[0], 4, generator=draws), "sample")
    finally:
        for kind in SECTION_TYPES.values():
            del kind.__getattribute__
    return seen, (out.logits, loss, scores, steps)


COMBINATIONS = [(task, step, method) for task in ("mnist", "parity") for step in PIECES["step"]
                for method in PIECES["method"] if piece_class("step", step).input_kind ==
                piece_class("task", task).input_kind]


@pytest.mark.parametrize("task,step,method", COMBINATIONS)
def test_the_pieces_reads_are_what_their_code_reads(task, step, method):
    """Who reads a setting is declared with it (`of`): here what the model, the method's loss and
    predictions really read is recorded. Every step and method setting the chosen pieces read (applies) is
    read; a setting read that does not apply (neither read by them nor implied) is plain's, which
    runs PonderNet's code at one step, and none of those changes the numbers."""
    import torch

    from ponder_cli.config import PLACES, applies, implied_values

    small = {"hidden": 8, **({"elems": 8} if task == "parity" else {"hidden_cnn": 8}),
             **({} if method == "plain" else {"truncation": 0.1, "max_steps": 4})}
    cfg = PonderConfig.of(task=task, step=step, method=method, **small)
    seen, _ = _read_settings(cfg)
    chosen = cfg.chosen()
    applying = {key for key in PLACES if applies(key, chosen, cfg.value) and key not in chosen}
    assert {key for key in applying if PLACES[key][0] in ("step", "method")} - seen == set()
    unapplied = seen - applying - set(implied_values(chosen)) - set(chosen)
    assert method == "plain" or unapplied == set()
    other = {"beta": 0.5, "beta_warmup": 7, "halting_bias": 2.0, "halting_input": "state+confidence",
             "halting_target": "final", "lambda_p": 0.7, "prior": "uniform"}
    assert unapplied <= set(other)
    _, outputs = _read_settings(cfg, training=False)
    for key in unapplied:  # one step: p_1 = 1, whatever the halting head and the prior say
        _, changed = _read_settings(PonderConfig.build({**cfg.to_dict(), key: other[key]}), training=False)
        assert all(torch.equal(a, b) for a, b in zip(outputs, changed)), key


def test_resuming_refuses_what_the_run_does_not_read(checkpoint, ponder, error):
    error(ponder("train", "--resume", checkpoint.parent / "last.pt", "--tau", 0.1, "--epochs", 5, *NO_DATA), 2,
          checkpoint.parent / "last.pt", "--tau", "--method act", "pondernet")


def test_train_help_shows_what_each_piece_implies(ponder):
    text = " ".join(ponder("train", "--help").stdout.split())
    assert "Maximum ponder steps. [default: 20; align: 12; plain: 1]" in text
    # settings kept out of --help show what the pieces imply in the resolved configuration
    printed = ponder("train", "--step", "align", "--print-config").stdout
    assert "halting_bias = 0.0  " in printed and "# implied by --step align" in printed  # the logit of lambda_p 0.5
    assert 'cnn_dropout_mask = "per-step"  # implied by --step mlp' in ponder("train", "--print-config").stdout
    assert "Geometric prior parameter, in (0, 1]. [default: 0.2; parity: 0.1; align: 0.5]" in text
    assert "gru. [default: mlp; parity: gru]" in text  # a task implies its step function
    assert "Weight of the KL regularisation. [default: 0.01]" in text


def test_train_help_shows_what_pieces_imply_without_torch():
    """What pieces imply is declared with the settings, so `ponder train --help` loads no piece."""
    import subprocess
    import sys

    probe = ("import atexit, sys\n"
             "atexit.register(lambda: print(sorted(m for m in ('torch', 'numpy') if m in sys.modules)))\n"
             "sys.argv = ['ponder', 'train', '--help']\n"
             "from ponder_cli.cli import run\n"
             "run()\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout
    assert "[default: 20; align: 12; plain: 1]" in " ".join(out.split())
    assert out.splitlines()[-1] == "[]"


def test_eval_takes_rotation_or_angles_not_both(checkpoint, ponder, error):
    error(ponder("eval", checkpoint, "--rotation", 45, "--angles", 90, *NO_DATA), 2, "--rotation", "--angles")


def test_a_refused_choice_has_no_value_error_prefix(ponder, error):
    line = error(ponder("train", "--method", "foo"), 2, "--method", "'foo'", "'pondernet', 'act', 'plain'")
    assert "ValueError" not in line


@pytest.mark.parametrize("command", ["eval", "extrapolate", "compare"])
def test_angles_help_names_degrees_not_a_python_type(command, ponder):
    text = ponder(command, "--help").stdout
    assert "--angles DEG..." in text and "list[str]" not in text.split("Arguments:")[-1].split("Options:")[-1]
    assert "pip install matplotlib" in " ".join(text.split()) and "-e '.[plot]'" not in text


# --detail with --repeats: counts averaged over draws ----------------------------------------------

def _bucket(histogram, accuracy):
    return {"rotation": 45.0, "images": 4, "accuracy": accuracy, "mean_steps": 1.5, "histogram": histogram,
            "accuracy_at_step": [0.5, 1.0]}


def test_averaged_counts_are_floats_and_show_one_decimal():
    combined = combine_draws([_bucket([3, 1], 0.5), _bucket([1, 3], 0.75)])
    assert combined["histogram"] == [2.0, 2.0] and all(isinstance(n, float) for n in combined["histogram"])
    _, _, columns = per_step_table([combined], expected=False, label=MNIST_TERMS.label)
    assert columns[1].spec == ".1f"
    _, _, columns = per_step_table([_bucket([3, 1], 0.5)], expected=False, label=MNIST_TERMS.label)  # one draw: whole images
    assert columns[1].spec == "d"


def test_detail_with_repeats_renders_the_table(checkpoint, tiny_mnist, ponder):
    """The README's command shape that crashed after the main table (format code 'd' on a float)."""
    result = ponder("extrapolate", checkpoint, "--angles", 0, 45, "--protocol", "fixed", "--halting", "median",
                    "--detail", "--repeats", 2, "--limit", 50, "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    table = result.stdout[result.stdout.index("Per halting step"):]
    as_json = ponder("extrapolate", checkpoint, "--angles", 0, 45, "--protocol", "fixed", "--halting", "median",
                     "--detail", "--repeats", 2, "--limit", 50, "--data-dir", tiny_mnist, "-f", "json")
    histogram = json.loads(as_json.stdout)["buckets"][1]["histogram"]
    assert sum(histogram) == 50.0
    assert f"{max(histogram):.1f}" in table


# sweep's fitted line --------------------------------------------------------------------------------

@pytest.mark.parametrize("steps,line", [([1.0, 1.5, 2.0], "steps = 1.00 + 0.500 per 10° (r² 1.00)"),
                                        ([3.0, 2.5, 2.0], "steps = 3.00 - 0.500 per 10° (r² 1.00)")])
def test_the_sweep_footer_has_one_sign(steps, line):
    buckets = [{"rotation": float(angle), "images": 10, "accuracy": 0.9, "mean_steps": s, "std_steps": 0.0,
                "steps_correct": s, "steps_wrong": s, "histogram": [10, 0, 0], "halting": "sample"}
               for angle, s in zip((0, 10, 20), steps)]
    cfg = PonderConfig.of(max_steps=3)
    report = sweep_report("ck.pt", cfg, buckets, 0.5, seed=1, view=get_task(cfg).view())
    assert report.caption.splitlines()[-1] == f"least squares: {line}"
    assert "+ +" not in report.caption and "+ -" not in report.caption


def test_text_and_empty_files_are_named_for_what_they_are(tmp_path):
    from ponder_cli.checkpoint import load_checkpoint

    (tmp_path / "notes.pt").write_text("epoch,loss\n1,0.5\n")
    with pytest.raises(PonderError, match=f"^{tmp_path / 'notes.pt'} is a text file, not a ponder_cli checkpoint$"):
        load_checkpoint(tmp_path / "notes.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(PonderError, match="is an empty file, not a ponder_cli checkpoint$"):
        load_checkpoint(tmp_path / "empty.pt")


def test_render_of_a_repeated_detail_report_does_not_raise():
    from ponder_cli.reports import evaluation_report

    buckets = [combine_draws([{**_bucket([3, 1], 0.5), "std_steps": 0.5, "steps_correct": 1.0, "steps_wrong": 2.0},
                              {**_bucket([2, 2], 0.75), "std_steps": 0.5, "steps_correct": 1.0, "steps_wrong": 2.0}])]
    for bucket in buckets:
        bucket.update(protocol="fixed", halting="median")
    cfg = PonderConfig.of(max_steps=2)
    report = evaluation_report("extrapolate", "ck.pt", cfg, buckets, None, protocol="fixed", seed=1,
                               with_loss=False, detail=True, view=get_task(cfg).view())
    out = io.StringIO()
    render_report(report, "table", file=out, width=80)
    assert "2.5" in out.getvalue() and "1.5" in out.getvalue()  # the mean counts per step


@pytest.mark.parametrize("args,named", [  # the option, the value echoed, the kind it must be
    (["eval", "--limit", "abc"], ["--limit", "'abc'", "whole number"]),
    (["train", "--epochs", "1.5"], ["--epochs", "'1.5'", "whole number"]),
    (["eval", "--seed", "x"], ["--seed", "'x'", "whole number"]),
    (["calibrate", "--tolerance", "x"], ["--tolerance", "'x'", "number"]),
    (["eval", "--protocol", "x"], ["--protocol", "'x'", "'uniform', 'band', 'fixed'"]),
])
def test_a_value_that_is_no_number_is_echoed_in_plain_words(args, named, ponder, error):
    line = error(ponder(*args), 2, *named)
    assert "ValueError" not in line  # click's words for a type, not Python's


def _train_command():
    import typer.main

    from ponder_cli.cli import app
    return typer.main.get_command(app).commands["train"]


def test_train_help_lists_at_most_25_options_the_rest_on_the_configuration_page(ponder):
    from pathlib import Path

    params = _train_command().params
    shown = [param for param in params if not param.hidden]
    assert len(shown) + 1 <= 25, [param.opts for param in shown]  # + --help
    listed = re.findall(r"^  (?:-\w, )?(--[\w-]+)", ponder("train", "--help").stdout, re.MULTILINE)
    assert listed == [max(param.opts, key=len) for param in shown] + ["--help"]
    page = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text(encoding="utf-8")
    missing = [param.opts[0] for param in params if param.hidden and param.opts[0] not in page
               and (param.secondary_opts or [None])[0] not in page]
    assert not missing, "hidden options of ponder train not on docs/configuration.md"


def test_every_setting_is_an_option_of_train_made_from_its_field():
    from ponder_cli.config import PLACES

    options = {param.name: param for param in _train_command().params}
    for key, (_, field) in PLACES.items():
        option = options[key]
        assert option.hidden == field.metadata["hidden"] and option.help.startswith(field.metadata["help"]), key
        assert option.default is None  # None unless given: a resumed run tells what the user set
    assert options["gru_layer_norm"].opts == ["--gru-layer-norm"] == [o.replace("no-", "") for o in
                                                                       options["gru_layer_norm"].secondary_opts]


def test_a_new_setting_needs_only_its_declaration(monkeypatch):
    """A field declared with `setting` is an option (its flag, help, default, choices, switch),
    read into the settings given, and its value checked as the field says: nothing else is
    written for it."""
    import dataclasses

    import typer
    import typer.main
    from typer.testing import CliRunner

    from ponder_cli import config
    from ponder_cli.cli.train import with_settings

    @dataclasses.dataclass(frozen=True)
    class New:
        label_smoothing: float = config.setting(0.0, *config.within(0, 1, "[)"), help="Label smoothing.")
        loss_shape: str = config.setting("flat", *config.one_of(("flat", "steep")), hidden=True, help="Shape.")
        warm_start: bool = config.setting(False, help="Warm start.")

    for field in dataclasses.fields(New):
        monkeypatch.setitem(config.PLACES, field.name, ("training", field))
        monkeypatch.setitem(config.TYPES, field.name, field.type if field.type in (float, str, bool) else
                            {"float": float, "str": str, "bool": bool}[field.type])
    seen = {}

    @with_settings
    def command(**settings):
        seen.update({key: value for key, value in settings.items() if value is not None})

    app = typer.Typer()
    app.command()(command)
    app.command("other")(lambda: None)  # a group, so that the command is called by its name
    runner = CliRunner()
    result = runner.invoke(app, ["command", "--label-smoothing", "0.1", "--loss-shape", "STEEP", "--warm-start"])
    assert result.exit_code == 0, result.output
    assert seen["label_smoothing"] == 0.1 and seen["loss_shape"].value == "steep" and seen["warm_start"] is True
    options = {param.name: param for param in typer.main.get_command(app).commands["command"].params}
    assert options["label_smoothing"].opts == ["--label-smoothing"] and not options["label_smoothing"].hidden
    assert options["label_smoothing"].help == "Label smoothing. [default: 0]"
    assert options["warm_start"].secondary_opts == ["--no-warm-start"] and options["loss_shape"].hidden
    assert runner.invoke(app, ["command", "--loss-shape", "round"]).exit_code == 2
    assert config.problems_of("label_smoothing", 1.0) == ["label-smoothing must be in [0, 1) (got 1.0)"]
