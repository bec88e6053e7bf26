import csv
import io
import json
import os
import re
import sys

import pytest
import torch
from rich.cells import cell_len

from ponder_cli.checkpoint import load_checkpoint
from ponder_cli.cli import app, expand_angles
from ponder_cli.reports import META_KEYS
from ponder_cli.tasks import get_task

import processes


def _command_names():
    import typer.main
    return sorted(typer.main.get_command(app).commands)


def test_every_command_is_covered_here():
    assert _command_names() == ["calibrate", "compare", "diff", "eval", "extrapolate", "info", "models", "predict", "runs",
                                "sweep", "train"]


@pytest.mark.parametrize("command", [[]] + [[name] for name in _command_names()])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help(command, flag, ponder):
    result = ponder(*command, flag)
    assert result.exit_code == 0
    assert "Usage:" in result.stdout


@pytest.mark.parametrize("args,expected", [
    (["--angles", "22.5", "45", "-f", "json"], ["--angles", "22.5", "--angles", "45", "-f", "json"]),
    (["--angles", "10", "--angles", "20"], ["--angles", "10", "--angles", "20"]),
    (["ck.pt", "--angles", "-5", "7"], ["ck.pt", "--angles", "-5", "--angles", "7"]),
    (["--angles", "45", "90", "a.pt", "b.pt"], ["--angles", "45", "--angles", "90", "a.pt", "b.pt"]),
    (["--angles=45", "90", "a.pt"], ["--angles", "45", "--angles", "90", "a.pt"]),
    (["--angles", "abc"], ["--angles", "abc"]),  # left for the library's "not a number" message
])
def test_angles_end_at_the_first_token_that_is_not_a_number(args, expected):
    assert expand_angles(args) == expected


def test_train_writes_checkpoints_and_reports(checkpoint):
    out = checkpoint.parent
    assert (out / "best.pt").exists() and (out / "last.pt").exists()
    state = load_checkpoint(out / "best.pt")
    assert state.config.method.max_steps == 5 and state.epoch == 1 and state.config.step.name == "mlp"


def test_train_json_summary(tiny_mnist, tmp_path, ponder):
    result = ponder("train", "--epochs", 2, "--max-steps", 3, "--val-size", 100, "--batch-size", 64, "--no-progress",
                    "--data-dir", tiny_mnist, "--out", tmp_path / "run", "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert tuple(data)[1:1 + len(META_KEYS)] == META_KEYS
    assert data["command"] == "train" and data["checkpoints"] == [str(tmp_path / "run" / "best.pt")]
    assert [b["epoch"] for b in data["buckets"]] == [1, 2] and data["epochs"] == 2
    assert data["val_accuracy"] == max(b["val_accuracy"] for b in data["buckets"])
    assert data["config"]["max_steps"] == 3
    assert "epoch  1/2" in result.stderr  # progress stays on stderr


def test_train_with_a_fresh_cnn_mask_per_step(tiny_mnist, tmp_path, ponder, quick, error):
    result = ponder("train", *quick, "--cnn-dropout-mask", "per-step", "--data-dir", tiny_mnist,
                    "--out", tmp_path / "run", "-f", "json", "-q")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config"]["cnn_dropout_mask"] == "per-step"
    assert load_checkpoint(tmp_path / "run" / "best.pt").config.step.cnn_dropout_mask == "per-step"
    refused = ponder("train", *quick, "--step", "align", "--cnn-dropout-mask", "per-step", "--data-dir", tiny_mnist,
                     "--out", tmp_path / "align")
    error(refused, 2, "--cnn-dropout-mask", "--step mlp", "align")


@pytest.mark.parametrize("command", ["eval", "extrapolate", "compare"])
def test_one_json_contract(command, checkpoint, tiny_mnist, ponder):
    """Every evaluating command's JSON: the same metadata keys first, then the rest, and a
    buckets array whose entries name their checkpoint(s), method and step."""
    result = ponder(command, checkpoint, "--angles", 10, 20, "-f", "json", "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert tuple(data)[:1 + len(META_KEYS)] == ("format_version", *META_KEYS) and "buckets" in data
    assert data["format_version"] == 1
    assert data["command"] == command and data["checkpoints"] == [str(checkpoint)]
    assert (data["method"], data["step"], data["protocol"], data["halting"]) == ("pondernet", "mlp", "uniform", "sample")
    assert data["seed"] == 1234 and data["device"] == "cpu"
    assert [b["rotation"] for b in data["buckets"]] == [10.0, 20.0]
    for bucket in data["buckets"]:
        assert bucket["method"] == "pondernet" and bucket["step"] == "mlp" and bucket["images"] == 200
        assert 0 <= bucket["accuracy"] <= 1 and 1 <= bucket["mean_steps"] <= 5


@pytest.mark.parametrize("command", ["eval", "extrapolate", "compare"])
def test_one_csv_contract(command, checkpoint, tiny_mnist, ponder):
    result = ponder(command, checkpoint, "--angles", 10, 20, "-f", "csv", "--limit", 20, "--data-dir", tiny_mnist)
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 2 and list(rows[0])[:len(META_KEYS)] == list(META_KEYS)
    assert rows[0]["method"] == "pondernet" and rows[0]["step"] == "mlp" and rows[0]["command"] == command
    assert float(rows[1]["rotation"]) == 20.0


@pytest.mark.parametrize("order", ["before", "after", "equals"])
@pytest.mark.parametrize("command", ["eval", "extrapolate", "compare", "calibrate"])
def test_checkpoint_before_or_after_angles(command, order, checkpoint, tiny_mnist, ponder):
    angles = {"before": ["--angles", 10, 20], "after": ["--angles", 10, 20], "equals": ["--angles=10", 20]}[order]
    args = [checkpoint, *angles] if order == "before" else [*angles, checkpoint]
    result = ponder(command, *args, "-f", "json", "--limit", 20, "--data-dir", tiny_mnist)  # the parse, on few images
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    buckets = data["sets"] if command == "calibrate" else data["buckets"]  # calibrate's buckets are its rules
    assert [b["rotation"] for b in buckets] == [10.0, 20.0]


def test_same_numbers_whether_the_flag_is_repeated(checkpoint, tiny_mnist, ponder):
    once = ponder("extrapolate", checkpoint, "--angles", 10, 20, "-f", "json", "--data-dir", tiny_mnist)
    repeated = ponder("extrapolate", checkpoint, "--angles", 10, "--angles", 20, "-f", "json", "--data-dir", tiny_mnist)
    assert json.loads(once.stdout) == json.loads(repeated.stdout)


def test_extrapolate_table(checkpoint, tiny_mnist, ponder):
    table = ponder("extrapolate", checkpoint, "--angles", 45, 90, "--data-dir", tiny_mnist)
    assert table.exit_code == 0 and "steps" in table.stdout and "90" in table.stdout
    assert "pondernet · step mlp" in table.stdout


# a missing checkpoint: test_shipped.py; --angles with no value: test_reliability.py
@pytest.mark.parametrize("command", ["eval", "extrapolate", "compare"])
def test_non_numeric_angle_is_a_clean_error(command, checkpoint, tiny_mnist, ponder, error):
    error(ponder(command, checkpoint, "--angles", 10, "--angles", "abc", "--data-dir", tiny_mnist), 2, "--angles", "'abc'")


@pytest.mark.parametrize("command", ["eval", "extrapolate", "compare"])
def test_unwritable_plot_fails_before_any_work(command, checkpoint, tmp_path, ponder, error):
    """Refused before any evaluation: no MNIST is needed to get the --plot error."""
    pytest.importorskip("matplotlib")
    no_data = ["--data-dir", tmp_path / "no-mnist", "--no-download"]
    target = tmp_path / "no" / "such" / "dir" / "plot.png"
    result = ponder(command, checkpoint, "--angles", 10, "--plot", target, *no_data)
    error(result, 1, f"--plot {target}")
    error(ponder(command, checkpoint, "--angles", 10, "--plot", tmp_path / "p.txt", *no_data), 1, "--plot", ".txt")
    readonly = tmp_path / "readonly"
    readonly.mkdir(mode=0o555)
    if not os.access(readonly, os.W_OK):  # root may write anywhere
        error(ponder(command, checkpoint, "--angles", 10, "--plot", readonly / "p.png", *no_data), 1, readonly)


@pytest.mark.parametrize("command", ["extrapolate", "compare"])
def test_plot_without_extension_gets_png_and_says_so(command, checkpoint, tiny_mnist, tmp_path, ponder):
    pytest.importorskip("matplotlib")
    result = ponder(command, checkpoint, "--angles", 10, "--plot", tmp_path / "fig", "--limit", 20,
                    "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "fig.png").read_bytes()[:4] == b"\x89PNG"
    assert str(tmp_path / "fig.png") in result.stderr  # said where it went


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_a_clean_error(tiny_mnist, tmp_path, ponder, one_error_line):
    result = ponder("train", "--device", "cuda", "--data-dir", tiny_mnist, "--out", tmp_path)
    assert "CUDA is not available" in one_error_line(result)
    assert not any(tmp_path.iterdir())


# --- 80-column terminals ------------------------------------------------------------------------

def _at_80_columns(report) -> str:
    from ponder_cli.render import render_report

    out = io.StringIO()
    render_report(report, "table", file=out, width=80)
    text = out.getvalue()
    assert "…" not in text
    assert max(cell_len(line) for line in text.splitlines()) <= 80, text
    return text


def _bucket(angle: float, i: int, max_steps: int = 20, detail: bool = False) -> dict:
    histogram = [1000 - 40 * k - i for k in range(max_steps)]
    return {"rotation": angle, "protocol": "uniform", "halting": "sample", "images": 10000,
            "accuracy": 0.99876 - 0.1 * i, "mean_steps": 14.1234 + i, "std_steps": 13.5678 - i,
            "steps_correct": 14.0987 + i, "steps_wrong": 15.3456 + i, "histogram": histogram,
            "loss": 0.03219 + i, "accuracy_at_step": [0.98765 - 0.01 * k for k in range(max_steps)] if detail else None}


@pytest.mark.parametrize("max_steps", [20, 100])
@pytest.mark.parametrize("command", ["eval", "extrapolate"])
def test_evaluation_tables_fit_80_columns(command, max_steps):
    from ponder_cli.config import PonderConfig
    from ponder_cli.reports import evaluation_report

    angles = [22.5, 45, 67.5, 112.5, 180]
    buckets = [_bucket(a, i, max_steps, detail=True) for i, a in enumerate(angles)]
    cfg = PonderConfig.of(max_steps=max_steps)
    report = evaluation_report(command, "runs/pondernet-mlp-seed1234-2/best.pt", cfg, buckets, 0.0123,
                               protocol="uniform", seed=1234, with_loss=command == "eval",
                               detail=True, view=get_task(cfg).view())
    text = _at_80_columns(report)
    for b in buckets:
        # with --detail the best fixed budget's accuracy takes the sparkline's place: the per-step
        # table shows the halting steps in full (a falling curve: its best is step 1 alone)
        assert b["best_fixed_accuracy"] == b["accuracy_at_step"][0]
        figures = [f"{b['rotation']:g}", f"{b['accuracy']:.4f}", f"{b['best_fixed_accuracy']:.4f}",
                   f"{b['mean_steps']:.2f}", f"{b['std_steps']:.2f}", f"{b['steps_correct']:.2f}",
                   f"{b['steps_wrong']:.2f}", *(f"{v:.4f}" for v in b["accuracy_at_step"]),
                   *(str(n) for n in b["histogram"])]
        figures += [f"{b['loss']:.4f}"] if command == "eval" else []
        assert all(figure in text for figure in figures)
        assert b["halting_spark"] not in text and len(b["halting_spark"]) == 20  # 100 steps merged into 20 bins
    assert "halting steps 1→" not in text and "10000 images per bucket" in text
    assert "best fixed ≤ steps: best fixed budget, or mix of two, in ≤ the mean steps" in text
    assert "weak control" not in text  # the ACT caveat is ACT's
    assert f"pondernet on the {'MNIST test set' if command == 'eval' else 'extrapolation'}" in text
    assert "Per halting step (continued)" in text  # five angles' columns do not fit in one table


def test_compare_table_fits_80_columns_and_wraps_long_labels():
    from ponder_cli.config import PonderConfig
    from ponder_cli.reports import comparison_report, group_by_configuration

    groups = group_by_configuration([("a.pt", PonderConfig.of(seed=1)), ("b.pt", PonderConfig.of(seed=2)),
                                     ("c.pt", PonderConfig.of(train_rotation=0.0)),
                                     ("d.pt", PonderConfig.of(method="act"))])
    angles = [22.5, 45, 67.5, 90]
    results = [[[{"accuracy": 0.98765 - 0.01 * b - 0.001 * m, "mean_steps": 4.1234 + b + m,
                  "accuracy_at_step": [0.95765 - 0.01 * b - 0.002 * m] + [0.97765 - 0.01 * b - 0.002 * m] * 19,
                  "halting": "act" if g.cfg.method.name == "act" else "sample", "images": 10000, "histogram": [1] * 20}
                 for b in range(len(angles))] for m in range(len(g.members))] for g in groups]
    report = comparison_report(groups, results, angles, protocol="uniform", halting="sample", seed=1234,
                               view=get_task(groups[0].cfg).view())
    assert report.buckets[0]["label"] == "pondernet (train_rotation=22.5)"
    text = _at_80_columns(report)
    for bucket in report.buckets:
        assert bucket["accuracy_text"] in text and bucket["steps_text"] in text and bucket["best_fixed_text"] in text
    assert " ±0.0007" in text and "(train_rotation=22.5)" in text and "(train_rotation=0.0)" in text
    assert report.buckets[0]["best_fixed_text"] == "0.9767" and report.buckets[0]["best_fixed_accuracy_sd"] == \
        pytest.approx(0.002 * 0.5 ** 0.5)
    # an ACT group among them: the caveat that its fixed budget is a weak control for it
    assert "ACT's fixed budget reads step N's y_N, not the mean-field prediction ACT trains on: a weak control" \
        in " ".join(text.split())
    assert "halting: pondernet → sample · act → act" in text


def test_compare_plots_groups_of_one_method_on_different_steps_apart():
    from ponder_cli.config import PonderConfig
    from ponder_cli.reports import comparison_report, group_by_configuration

    # the shipped reference and align models: both "pondernet", told apart by their step
    groups = group_by_configuration([("mlp.pt", PonderConfig.of()), ("align.pt", PonderConfig.of(step="align"))])
    results = [[[{"accuracy": 0.9 - 0.1 * g - 0.01 * b, "mean_steps": 4.0 + g + b, "halting": "sample",
                  "images": 100, "histogram": [1, 2, 3]} for b in range(2)]] for g in range(2)]
    report = comparison_report(groups, results, [45, 90], protocol="uniform", halting="sample", seed=1,
                               view=get_task(groups[0].cfg).view())
    assert [g.label for g in groups] == ["pondernet", "pondernet"]
    assert {name: [row["accuracy"] for row in rows] for name, rows in report.plot_series.items()} == {
        "pondernet · step mlp": [0.9, 0.89], "pondernet · step align": [0.8, 0.79]}


def test_train_table_fits_80_columns(tiny_mnist, tmp_path, monkeypatch):
    from ponder_cli.api import TrainOptions, train_run

    monkeypatch.chdir(tmp_path)
    report = train_run({"epochs": 1, "max_steps": 2, "val_size": 100, "train_size": 200, "batch_size": 100},
                       TrainOptions(data_dir=tiny_mnist, progress=False))
    text = _at_80_columns(report)
    assert f"{report.meta['val_accuracy']:.4f}" in text
    assert "best checkpoint: runs/pondernet-mlp-seed1234/best.pt" in text
    assert "pondernet training (step mlp)" in text


def _eval_report(checkpoint: str):
    from ponder_cli.config import PonderConfig
    from ponder_cli.reports import evaluation_report

    cfg = PonderConfig.of()
    return evaluation_report("eval", checkpoint, cfg, [_bucket(22.5, 0, 20)], None, protocol="uniform",
                             seed=1234, with_loss=True, detail=False, view=get_task(cfg).view())


def test_a_title_wider_than_its_table_breaks_at_spaces_never_inside_a_path():
    path = "/home/someone/experiments/runs/pondernet-mlp-seed1234-2/best.pt"  # with the title: over 80
    lines = _at_80_columns(_eval_report(path)).splitlines()
    assert [line.rstrip() for line in lines[:2]] == ["pondernet on the MNIST test set", f"({path})"]


@pytest.mark.parametrize("columns", ["0", "", "wide"])
def test_columns_that_are_no_width_leave_the_table_whole(columns, monkeypatch):
    from ponder_cli.render import render_report

    monkeypatch.setenv("COLUMNS", columns)
    out = io.StringIO()  # not a terminal: 80 columns, as when COLUMNS is unset
    render_report(_eval_report("a.pt"), "table", file=out)
    text = out.getvalue()
    assert "0.9988" in text and "pondernet on the MNIST test set (a.pt)" in text
    assert max(cell_len(line) for line in text.splitlines()) <= 80


@pytest.mark.parametrize("name,title", [("act", "act on the MNIST test set"), ("plain", "plain on the MNIST test set")])
def test_table_titles_name_the_method(name, title, runs, tiny_mnist, ponder):
    result = ponder("eval", runs / name / "best.pt", "--data-dir", tiny_mnist)
    assert result.exit_code == 0 and title in result.stdout


# --- progress and --quiet -----------------------------------------------------------------------

def test_no_progress_bars_when_stderr_is_not_a_terminal(tiny_mnist, tmp_path, ponder):
    """In a log file or a pipeline, train writes its per-epoch lines and no tqdm bars. (The
    runner's stderr is no terminal, as a file's or a pipe's is not: the choice reads
    sys.stderr.isatty(); the bar on a real terminal is test_evaluation_shows_a_bar_on_a_terminal.)"""
    done = ponder("train", "--epochs", "2", "--max-steps", "2", "--val-size", "100", "--batch-size", "100",
                  "--data-dir", tiny_mnist, "--out", tmp_path / "run")
    assert done.exit_code == 0, done.output
    lines = done.stderr.splitlines()
    assert "\r" not in done.stderr and "batch/s" not in done.stderr, lines
    start = lines.index(f"writing checkpoints to {tmp_path / 'run'}/")  # after the configuration
    assert lines[0] == "configuration:" and lines[start + 1].startswith("training pondernet (step mlp) on ")
    assert [line[:11] for line in lines[start + 2:]] == ["epoch  1/2 ", "epoch  2/2 "]


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals")
def test_evaluation_shows_a_bar_on_a_terminal_and_fits_80_columns(checkpoint, tiny_mnist):
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # an 80 x 24 terminal
    proc = processes.ponder("extrapolate", checkpoint, "--angles", "10", "20", "112.5", "--data-dir", tiny_mnist,
                            stdin=follower, stdout=follower, stderr=follower, env={**os.environ, "COLUMNS": "80"})
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output.decode())
    assert "evaluating" in text and "bucket" in text  # tqdm's bar, on the terminal only
    table = text[text.index("pondernet on the extrapolation"):]
    assert "…" not in table and max(cell_len(line) for line in table.splitlines()) <= 80
    assert "112.5" in table


@pytest.mark.parametrize("command", ["train", "eval", "extrapolate", "compare"])
def test_quiet_silences_chatter_not_results_or_errors(command, checkpoint, tiny_mnist, tmp_path, monkeypatch, quick,
                                                      ponder, error):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "mine").mkdir(parents=True)
    (tmp_path / "runs" / "mine" / "best.pt").write_bytes(checkpoint.read_bytes())  # `latest`: "using ..."
    args = {"train": [*quick, "--out", tmp_path / "run", "--overwrite"], "eval": ["latest", "--limit", 20],
            "extrapolate": ["latest", "--angles", 10, "--plot", tmp_path / "fig.png", "--limit", 20],
            "compare": [checkpoint, checkpoint, "--angles", 10, "--limit", 20]}[command]
    loud = ponder(command, *args, "--data-dir", tiny_mnist)
    assert loud.exit_code == 0, loud.output
    assert loud.stderr  # training lines, "using ...", "plot written to ...", "the same model as ..."
    quiet = ponder(command, *args, "--quiet", "--data-dir", tiny_mnist)
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stderr == ""
    if command == "train":
        assert f"best checkpoint: {tmp_path / 'run' / 'best.pt'}" in quiet.stdout
    else:
        assert quiet.stdout == loud.stdout
    mistake = ["--lr", 0] if command == "train" else ["--angles", 500]
    error(ponder(command, *args, "-q", *mistake, "--data-dir", tiny_mnist), 2, mistake[0].lstrip("-"))  # errors stay


def test_another_librarys_warning_is_one_line(capsys):
    """Python shows a warning on two lines or more (its text, then the source line that raised
    it); the CLI shows every warning as one line, another library's with its category."""
    import warnings

    from ponder_cli.cli.app import one_line_warnings

    with one_line_warnings():
        warnings.warn("This instance was constructed with capturable=True\n   but step() ran   outside",
                      UserWarning)
    assert capsys.readouterr().err == ("Warning: This instance was constructed with capturable=True but step() ran "
                                       "outside [UserWarning]\n")
def _cut_columns(text: str) -> list[list[str]]:
    """Each line split at every comma, as `cut -d,` reads it."""
    return [line.split(",") for line in text.splitlines()]


def test_every_csv_cell_is_free_of_the_separator(checkpoint, runs, tiny_mnist, tmp_path, ponder):
    """`ponder ... -f csv | cut -d,` puts every figure under its header: lists (histogram,
    accuracy_wilson, checkpoints, calibrate's sets, predict's steps) hold no comma, nor our texts."""
    import numpy as np

    np.save(tmp_path / "two.npy", np.zeros((2, 28, 28), dtype=np.uint8))
    commands = [["extrapolate", checkpoint, "--angles", 10, 20, "--repeats", 2],
                ["eval", checkpoint, "--detail", "--angles", 10], ["sweep", checkpoint, "--to", 10, "--every", 10],
                ["compare", runs / "pn1", runs / "pn2", runs / "act", "--angles", 10],
                ["calibrate", checkpoint, "--rules", "quantile:0.5", "patience:1"],
                ["predict", checkpoint, tmp_path / "two.npy", "--steps"],
                ["info", runs / "pn1"], ["models"], ["runs", runs]]
    for command in commands:
        result = ponder(*command, "-f", "csv", "--limit", 40, "--data-dir", tiny_mnist) if command[0] not in (
            "predict", "info", "models", "runs") else ponder(*command, "-f", "csv")
        assert result.exit_code == 0, (command, result.output)
        rows = list(csv.DictReader(io.StringIO(result.stdout)))
        cut = _cut_columns(result.stdout)
        assert len(rows) >= 1 and len(cut) == len(rows) + 1, command
        for line, row in zip(cut[1:], rows):
            assert line == [row[key] for key in cut[0]], command
    compared = list(csv.DictReader(io.StringIO(ponder("compare", runs / "pn1", runs / "pn2", runs / "act",
                                                      "--angles", 10, "-f", "csv", "--data-dir", tiny_mnist).stdout)))
    # the pondernet group's two seeds, one cell
    assert compared[0]["checkpoints"].split(";") == [str(runs / name / "best.pt") for name in ("pn1", "pn2")]
    calibrated = next(csv.DictReader(io.StringIO(ponder("calibrate", checkpoint, "--rules", "quantile:0.5", "-f",
                                                        "csv", "--data-dir", tiny_mnist).stdout)))
    assert calibrated["sets"] == "rotation=22.5 protocol=uniform"


def test_shell_completion_is_switched_on_and_works_offline():
    """`ponder --show-completion bash` prints the script (no network, no shell detection), and
    the script's request completes commands and options."""
    import os

    import processes

    with processes.ponder("--show-completion", "bash") as proc:
        script, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "complete -o default -F _ponder_completion ponder" in script and "_PONDER_COMPLETE=complete_bash" in script
    for words, cword, expected in (("ponder ev", 1, ["eval"]), ("ponder eval --proto", 2, ["--protocol"]),
                                   ("ponder r", 1, ["runs"])):
        env = {**os.environ, "_PONDER_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
        with processes.fork(processes.run_cli, [], env=env) as proc:
            out, stderr = proc.communicate(timeout=60)
        assert out.split() == expected, (words, out, stderr)


@pytest.mark.parametrize("args, named", [  # the option, the value given, the range allowed
    (["eval", "--limit", "-1"], ["--limit", "0"]),
    (["eval", "--max-steps", "1000"], ["--max-steps", "1000", "100"]),
    (["train", "--epochs", "0"], ["--epochs", "0"]),
    (["train", "--lambda-p", "2"], ["--lambda-p", "2.0", "(0, 1]"]),
    (["train", "--device", "tpu"], ["'tpu'", "auto, cpu, cuda or cuda:N"]),
    (["eval", "--angles", "400"], ["--angles", "400", "180"]),
    (["eval", "--seed", "-1"], ["--seed", "-1", "2**63 - 1"]),
    (["calibrate", "--tolerance", "2"], ["--tolerance", "2"]),
    (["sweep", "--from", "90", "--to", "10"], ["--from", "--to", "90, 10"]),
    (["eval", "parity16", "--halting", "fixed:30"], ["--halting fixed:30", "20 steps", "--max-steps"]),
    (["eval", "parity16", "--counts", "1-40"], ["1-40", "16"]),
])
def test_a_value_out_of_range_exits_2_whichever_check_finds_it(args, named, ponder, error):
    """click's parser gives 2 for what it checks (--limit -1); ponder's own range checks give the
    same, so a script sees every usage mistake alike (and 1 for the rest: a missing file)."""
    error(ponder(*args), 2, *named)
