"""The shipped models are package data, named by a CHECKPOINT argument from any directory."""

import configparser
import json
import os
import time
from fnmatch import fnmatch
from pathlib import Path

import pytest

from ponder_cli.folders import SHIPPED, resolve_checkpoint, shipped_dir, shipped_path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "ponder_cli"
NAMES = "reference, interpolation, align, parity16, parity16-extrapolation, parity16-extrapolation-act"


def test_the_shipped_models_are_found_inside_the_package_whatever_the_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert shipped_dir() == PACKAGE / "checkpoints"
    assert {name: shipped_path(name).relative_to(PACKAGE).as_posix() for name in SHIPPED} == {
        "reference": "checkpoints/best.pt", "interpolation": "checkpoints/interpolation/best.pt",
        "align": "checkpoints/align/best.pt", "parity16": "checkpoints/parity/interpolation16.pt",
        "parity16-extrapolation": "checkpoints/parity/extrapolation16.pt",
        "parity16-extrapolation-act": "checkpoints/parity/extrapolation16-act.pt",
        "parity32": "checkpoints/parity/interpolation32.pt", "parity64": "checkpoints/parity/interpolation64.pt",
        "parity64-prefix": "checkpoints/parity/interpolation64-prefix.pt"}
    assert all(shipped_path(name).is_file() for name in SHIPPED)


def test_setup_cfg_declares_every_shipped_model_as_package_data():
    """A wheel (or a non-editable install) carries what package_data names: every shipped file."""
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    patterns = [p.strip() for p in setup["options.package_data"]["ponder_cli"].split(",")]
    for name in SHIPPED:
        relative = shipped_path(name).relative_to(PACKAGE).as_posix()
        assert any(fnmatch(relative, pattern) and relative.count("/") == pattern.count("/") for pattern in patterns)


def _using(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("using ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_bare_eval_reads_the_shipped_reference_from_any_directory_even_after_training(tmp_path, monkeypatch,
                                                                                       checkpoint, tiny_mnist, ponder):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "mine").mkdir(parents=True)
    (tmp_path / "runs" / "mine" / "best.pt").write_bytes(checkpoint.read_bytes())  # a run of one's own
    result = ponder("eval", "--limit", 20, "--data-dir", tiny_mnist, "-f", "json")
    assert result.exit_code == 0, result.output
    reference = str(PACKAGE / "checkpoints" / "best.pt")
    assert _using(result) == (f"using {reference} (the shipped model 'reference', the default; "
                              "`latest` reads your newest run)")
    data = json.loads(result.stdout)
    assert data["checkpoints"] == [reference] and data["step"] == "mlp" and data["train_rotation"] == 22.5


def test_a_shipped_model_is_named_relative_to_the_directory_it_lies_below(monkeypatch, tiny_mnist, ponder):
    monkeypatch.chdir(REPO)  # a clone's root
    result = ponder("extrapolate", "align", "--angles", 10, "--limit", 20, "--data-dir", tiny_mnist, "-f", "json")
    assert result.exit_code == 0, result.output
    assert _using(result) == "using ponder_cli/checkpoints/align/best.pt (the shipped model 'align')"
    assert json.loads(result.stdout)["checkpoints"] == ["ponder_cli/checkpoints/align/best.pt"]


@pytest.mark.parametrize("argument,name", [("reference", "reference"), ("interpolation", "interpolation"),
                                           ("align", "align"), ("checkpoints/best.pt", "reference"),
                                           ("checkpoints/interpolation/best.pt", "interpolation"),
                                           ("checkpoints/align/best.pt", "align"), ("checkpoints/align", "align")])
def test_names_and_the_readmes_older_paths_read_the_shipped_files(argument, name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    resolved = resolve_checkpoint(argument)
    assert resolved.path == shipped_path(name) and resolved.why == f"the shipped model '{name}'"


def test_resolution_order(tmp_path, monkeypatch, checkpoint):
    """An existing file, then a run folder, then `latest`, then a shipped name, then the old path."""
    monkeypatch.chdir(tmp_path)
    for folder in ("align", "checkpoints", "runs/old", "runs/new"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "align" / "best.pt").write_bytes(checkpoint.read_bytes())
    assert resolve_checkpoint("align").path == Path("align") / "best.pt"  # a run folder of that name wins
    assert resolve_checkpoint("align").why == "the best.pt of run folder align"
    (tmp_path / "checkpoints" / "best.pt").write_bytes(checkpoint.read_bytes())  # a checkpoints/ of one's own
    assert resolve_checkpoint("checkpoints/best.pt").path == Path("checkpoints/best.pt")
    assert resolve_checkpoint("checkpoints/align/best.pt").path == shipped_path("align")
    for age, name in ((200, "old"), (100, "new")):
        for file in ("best.pt", "last.pt"):
            path = tmp_path / "runs" / name / file
            path.write_bytes(checkpoint.read_bytes())
            os.utime(path, (time.time() - age, time.time() - age))
    latest = resolve_checkpoint("latest")
    assert latest.path == Path("runs/new/best.pt") and latest.why == "latest: the newest run under runs/"
    assert resolve_checkpoint("latest", file="last.pt").path == Path("runs/new/last.pt")
    assert resolve_checkpoint("runs/old", file="last.pt").path == Path("runs/old/last.pt")


@pytest.mark.parametrize("argument,named", [  # what was given, and the forms a checkpoint takes
    ("nope.pt", ["nope.pt", "a run folder", "`latest`", NAMES]),
    ("checkpoints/nope.pt", ["checkpoints/nope.pt", "checkpoint file"]),
    ("empty", ["empty", "best.pt"]),
    ("latest", ["`latest`", "{cwd}/runs/", "`ponder train`"]),
])
def test_anything_else_is_one_line_naming_the_accepted_forms(argument, named, tmp_path, monkeypatch, ponder, error):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    error(ponder("eval", argument, "--data-dir", tmp_path / "none", "--no-download"), 1,
          *[part.format(cwd=tmp_path) for part in named])


def test_a_folder_of_runs_is_one_rule_for_eval_info_and_runs(tmp_path, monkeypatch, ponder, one_error_line):
    """A folder whose runs have written no checkpoint yet (their first epoch still running) is
    a folder of runs to eval and info, as it is to `ponder runs`, which lists those runs."""
    monkeypatch.chdir(tmp_path)
    for name, written in (("b-run", 2_000_000_000), ("a-run", 2_000_000_000.5)):  # b-run half a second first
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / ".ponder.lock").write_text("1\n")
        os.utime(tmp_path / "runs" / name / ".ponder.lock", (written, written))
    (tmp_path / "runs" / "notes").mkdir()  # not a run: nothing of ponder's in it
    expected = "Error: runs is a folder of runs (a-run, b-run), not one run: `ponder runs runs` lists them"
    assert one_error_line(ponder("eval", "runs")).startswith(expected)
    assert one_error_line(ponder("info", "runs")).startswith(expected)
    listed = json.loads(ponder("runs", "runs", "-f", "json").stdout)["buckets"]
    assert [row["run"] for row in listed] == ["runs/b-run", "runs/a-run"]  # oldest first, within a second too


def test_every_command_says_which_file_it_read(checkpoint, tiny_mnist, ponder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = checkpoint.parent
    for args in (["eval", run], ["extrapolate", checkpoint, "--angles", 10], ["sweep", run, "--to", 10],
                 ["compare", run, "reference", "--angles", 10]):
        result = ponder(*args, "--limit", 20, "--data-dir", tiny_mnist)
        assert result.exit_code == 0, result.output
        lines = [line for line in result.stderr.splitlines() if line.startswith("using ")]
        if args[1] == run:
            assert lines[0] == f"using {checkpoint} (the best.pt of run folder {run})"
        else:
            assert lines[0] == f"using {checkpoint} (as given)"
        if args[0] == "compare":
            assert lines[1] == f"using {PACKAGE / 'checkpoints' / 'best.pt'} (the shipped model 'reference')"


def test_resume_takes_a_run_folder_or_latest(checkpoint, tiny_mnist, tmp_path, monkeypatch, ponder):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    run = tmp_path / "runs" / "one"
    result = ponder("train", "--epochs", 1, "--max-steps", 2, "--val-size", 100, "--train-size", 200,
                    "--batch-size", 100, "--out", run, "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    result = ponder("train", "--resume", "latest", "--epochs", 2, "--data-dir", tiny_mnist, "-f", "json")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0].startswith("using runs/one/last.pt (latest")
    assert json.loads(result.stdout)["epochs"] == 2
    result = ponder("train", "--resume", run, "--epochs", 3, "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == f"using {run / 'last.pt'} (the last.pt of run folder {run})"


@pytest.mark.parametrize("command", ["eval", "extrapolate", "sweep", "compare", "calibrate", "predict"])
def test_checkpoint_help_names_the_forms_and_the_shipped_models_alike(ponder, command):
    """Every command that reads a checkpoint spells its forms in one wording, every shipped model named."""
    from ponder_cli.cli_options import checkpoint_forms

    text = " ".join(ponder(command, "--help").stdout.split()).lower()
    assert checkpoint_forms() in text and all(name in text for name in SHIPPED)
    assert ("[default: reference]" in text) == (command not in ("compare", "predict"))


@pytest.mark.parametrize("name,command,counts,accuracies,steps", [
    ("parity16-extrapolation", "extrapolate", ["1-8", "9-12", "13-16"], [1.0, 0.45, 0.51], [11.78, 8.03, 5.87]),
    ("parity16-extrapolation-act", "extrapolate", ["1-8", "9-12", "13-16"], [0.995, 0.63, 0.36], [3.0, 2.41, 1.71]),
])
def test_the_shipped_parity_models_give_the_same_figures(ponder, name, command, counts, accuracies, steps):
    """The shipped models on a small sample (25 fixed test vectors a count, seeded coins); their
    full figures (2,000 a count) are docs/parity.md's slow example, which tools/docs_examples.py
    --slow checks."""
    result = ponder(command, name, "--counts", *counts, "--limit", 25, "-f", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["task"] == "parity" and [b["counts"] for b in report["buckets"]] == counts
    assert [round(b["accuracy"], 4) for b in report["buckets"]] == accuracies
    assert [round(b["mean_steps"], 4) for b in report["buckets"]] == steps


def test_ponder_models_lists_every_shipped_model_from_its_checkpoint(ponder):
    import json

    from ponder_cli.checkpoint import load_checkpoint
    from ponder_cli.folders import SHIPPED, shipped_path

    result = ponder("models", "-f", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["command"] == "models" and report["default"] == "reference"
    assert [b["name"] for b in report["buckets"]] == list(SHIPPED)
    by_name = {b["name"]: b for b in report["buckets"]}
    assert (by_name["align"]["task"], by_name["align"]["step"]) == ("mnist", "align")
    assert (by_name["parity16-extrapolation-act"]["task"], by_name["parity16-extrapolation-act"]["method"]) == \
        ("parity", "act")
    for name, bucket in by_name.items():
        state = load_checkpoint(bucket["file"])  # every file named exists
        assert state.config == load_checkpoint(shipped_path(name)).config and bucket["best_epoch"] == state.best_epoch
    # the reference model's best epoch, as docs/mnist-results.md reports it: 20 of 20
    assert (by_name["reference"]["epochs"], by_name["reference"]["best_epoch"]) == (20, 20)
    table = ponder("models").stdout
    assert "Shipped models" in table and all(name in table for name in SHIPPED)


def test_latest_is_the_run_that_wrote_last_as_ponder_runs_orders_them(tmp_path):
    """A run resumed today whose best epoch is old is still the newest run."""
    from ponder_cli.folders import BEST, LAST, newest_run_checkpoint

    for run, written in (("resumed", {BEST: 100, LAST: 300}), ("other", {BEST: 200, LAST: 200})):
        for name, when in written.items():
            (tmp_path / run).mkdir(exist_ok=True)
            (tmp_path / run / name).write_bytes(b"")
            os.utime(tmp_path / run / name, (when, when))
    (tmp_path / "notes").mkdir()  # not a run
    assert newest_run_checkpoint(tmp_path) == tmp_path / "resumed" / BEST
    assert newest_run_checkpoint(tmp_path, LAST) == tmp_path / "resumed" / LAST
    assert newest_run_checkpoint(tmp_path / "none") is None
