"""`ponder info` on finished, interrupted and shipped runs; metrics.csv as the csv module reads
it; `ponder train --tensorboard` writing the same figures as TensorBoard events."""

import csv
import io
import json
import sys

import pytest

from ponder_cli.checkpoint import load_checkpoint, save_checkpoint
from ponder_cli.reports import META_KEYS
from ponder_cli.folders import SHIPPED


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def two_epochs(ponder, tiny_mnist, tmp_path_factory, quick):
    """A finished two-epoch run (quick options) and an interrupted copy: its last.pt states
    epoch 2 of 4 planned and there is no best.pt, as after Ctrl-C in a run that never improved."""
    out = tmp_path_factory.mktemp("info") / "run"
    args = [*quick, "--epochs", "2", "--data-dir", tiny_mnist, "--out", out, "--no-progress"]
    result = ponder("train", *args)
    assert result.exit_code == 0, result.output
    cut = out.parent / "cut"
    cut.mkdir()
    state = load_checkpoint(out / "last.pt")
    state.config = state.config.replace(epochs=4)
    save_checkpoint(state, cut / "last.pt")
    return out, cut


def test_metrics_csv_has_one_row_per_epoch_with_the_halting_histogram(two_epochs):
    out, _ = two_epochs
    rows = _rows(out / "metrics.csv")
    assert [row["epoch"] for row in rows] == ["1", "2"]
    for row in rows:
        histogram = [int(count) for count in row["val_halting_histogram"].split(";")]
        assert len(histogram) == 2 and sum(histogram) == 100  # --max-steps 2, --val-size 100


def test_info_on_a_finished_run(ponder, two_epochs, monkeypatch):
    out, _ = two_epochs
    monkeypatch.setenv("COLUMNS", "80")
    report = json.loads(ponder("info", out, "-f", "json").stdout)
    assert set(META_KEYS) <= report.keys()
    history = json.loads(json.dumps(load_checkpoint(out / "last.pt").history))  # tuples as JSON lists
    assert report["buckets"] == history and [b["epoch"] for b in report["buckets"]] == [1, 2]
    assert (report["command"], report["file"], report["status"]) == ("info", str(out / "last.pt"), "finished")
    assert (report["epochs_trained"], report["epochs_planned"]) == (2, 2)
    best = next(h for h in history if h["epoch"] == report["best_epoch"])
    assert report["best_val_accuracy"] == best["val_accuracy"]
    assert report["sources"]["epochs"] == "given" and report["config"]["max_steps"] == 2
    rows = list(csv.DictReader(io.StringIO(ponder("info", out, "-f", "csv").stdout)))
    assert [row["epoch"] for row in rows] == ["1", "2"] and rows[0]["status"] == "finished"
    table = ponder("info", out).stdout
    assert "History" in table and "status" in table
    assert max(len(line) for line in table.splitlines()) <= 80


def test_info_on_an_interrupted_run(ponder, two_epochs):
    _, cut = two_epochs
    report = json.loads(ponder("info", cut, "-f", "json").stdout)
    assert report["status"] == f"interrupted after epoch 2 of 4; resume with: ponder train --resume {cut / 'last.pt'}"
    assert len(report["buckets"]) == 2 and report["resumable"] is True


@pytest.mark.parametrize("name", list(SHIPPED))
def test_info_on_every_shipped_model(ponder, name):
    report = json.loads(ponder("info", name, "-f", "json").stdout)
    assert report["status"].startswith("its run's best epoch (saved after epoch")
    assert len(report["buckets"]) == report["epochs_trained"] == report["best_epoch"]


def test_info_plots_learning_curves(ponder, two_epochs, tmp_path):
    pytest.importorskip("matplotlib")
    result = ponder("info", two_epochs[0], "--plot", tmp_path / "curves.png")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_info_on_a_folder_without_checkpoints(ponder, one_error_line, tmp_path):
    assert "holds no last.pt or best.pt" in one_error_line(ponder("info", tmp_path))


def test_tensorboard_events_hold_the_metrics_rows(ponder, tiny_mnist, tmp_path, quick):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    result = ponder("train", *quick, "--epochs", "2", "--data-dir", tiny_mnist, "--out", out, "--tensorboard")
    assert result.exit_code == 0, result.output
    events = EventAccumulator(str(out))
    events.Reload()
    rows = _rows(out / "metrics.csv")
    for tag, key in (("train/loss", "train_loss"), ("val/accuracy", "val_accuracy"), ("lr", "lr"),
                     ("val/steps", "val_steps")):
        assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in events.Scalars(tag)] == \
               [(int(row["epoch"]), float(row[key])) for row in rows]
    last = events.Histograms("val/halting_step")[-1]
    assert last.step == 2 and list(last.histogram_value.bucket) == [int(c) for c in rows[-1]["val_halting_histogram"].split(";")]


def test_tensorboard_missing_is_one_error_line_before_training(ponder, error, tiny_mnist, tmp_path,
                                                             quick, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # the import fails as if not installed
    error(ponder("train", *quick, "--data-dir", tiny_mnist, "--out", tmp_path / "run", "--tensorboard"), 1,
          "--tensorboard", "pip install tensorboard")
    assert not (tmp_path / "run").exists()


def test_a_runs_name_tags_and_note_are_kept_shown_found_and_survive_resuming(tiny_mnist, tmp_path, quick, ponder,
                                                                            error):
    def train(*args):
        result = ponder("train", *quick, "--data-dir", tiny_mnist, "-q", *args)
        assert result.exit_code == 0, result.output

    train("--out", tmp_path / "a", "--name", "first try", "--tag", "baseline", "--tag", "mlp", "--tag", "baseline",
          "--note", "lr from the paper")
    train("--out", tmp_path / "b", "--tag", "other", "--seed", "2")
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["labels"] == {"name": "first try", "tags": ["baseline", "mlp"], "note": "lr from the paper"}

    def names(*where):
        listed = json.loads(ponder("runs", tmp_path, *(w for text in where for w in ("--where", text)), "-f",
                                   "json").stdout)
        return [row["name"] for row in listed["buckets"]]
    assert names() == ["first try", "b"]  # a run's own name, else its folder's
    assert names("tag=baseline") == ["first try"] and names("tag!=baseline") == ["b"]
    assert names("name=first try") == ["first try"] and names("tag=mlp", "seed=2") == []
    table = ponder("runs", tmp_path).stdout
    assert all(word in table.split() for word in ("tags", "note", "baseline", "mlp", "paper", "other"))
    info = json.loads(ponder("info", tmp_path / "a", "-f", "json").stdout)
    assert (info["name"], info["tags"], info["note"]) == ("first try", ["baseline", "mlp"], "lr from the paper")
    assert "│ note " in ponder("info", tmp_path / "a").stdout

    # no setting: resuming keeps them, and takes a new one in its place
    result = ponder("train", "--resume", tmp_path / "a", "--epochs", 2, "--note", "two epochs", "--data-dir",
                    tiny_mnist, "-q")
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["labels"] == {"name": "first try", "tags": ["baseline", "mlp"], "note": "two epochs"}
    error(ponder("train", "--tag", "a b"), 2, "--tag 'a b'")  # a bad value, as click's own
    error(ponder("train", "--name", ""), 2, "--name ''")


@pytest.mark.parametrize("run", ["pn1", "act", "plain"])
def test_info_gives_the_command_that_trains_the_run_again(run, runs, ponder):
    """Only what a fresh run would not take, shell-quoted: read back, the run's own settings."""
    import shlex

    info = json.loads(ponder("info", runs / run, "-f", "json").stdout)
    command = info["train_command"]
    table = ponder("info", runs / run).stdout
    assert f"reproduce: {command}" in table.replace(" \\\n  ", " ")  # over lines a shell joins
    assert max(len(line) for line in table.splitlines()) <= 80
    words = shlex.split(command)
    assert words[:2] == ["ponder", "train"] and "--val-size" in words and "--lr" in words
    assert "--step" not in words and "--task" not in words  # the defaults go unsaid
    assert ("--method" in words) == (run != "pondernet" and run != "pn1")
    printed = json.loads(ponder("train", *words[2:], "--print-config", "-f", "json").stdout)
    settings = {key: value for section in ("task", "step", "method", "training")
                for key, value in printed[section].items()}
    assert settings == {key: info["config"][key] for key in settings}
    assert len(settings) > 10


def test_every_setting_is_an_option_of_train():
    """What the command `info` gives can say every setting (the rarer ones are hidden from --help)."""
    import typer.main

    from ponder_cli.cli import app
    from ponder_cli.config import PonderConfig

    train = typer.main.get_command(app).commands["train"]
    options = {param.name: param.opts for param in train.params}
    assert {key: options.get(key) for key in PonderConfig.field_names()} == \
        {key: ["--" + key.replace("_", "-")] for key in PonderConfig.field_names()}


# info reads a checkpoint without torch, as torch.load would ---------------------------------------

@pytest.mark.parametrize("name", ["parity64", "reference"])  # a parity model, and MNIST's strided conv weights
def test_info_imports_no_torch_and_says_what_it_says_in_process(ponder, name):
    """`python -m ponder_cli info NAME`: no torch nor numpy (seconds of start-up), the same JSON."""
    import subprocess

    probe = ("import atexit, runpy, sys\n"
             "atexit.register(lambda: print(sorted(m for m in ('torch', 'numpy') if m in sys.modules), file=sys.stderr))\n"
             f"sys.argv = ['ponder', 'info', {name!r}, '-f', 'json']\n"
             "runpy.run_module('ponder_cli', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr.splitlines()[-1] == "[]", done.stderr
    assert json.loads(done.stdout) == json.loads(ponder("info", name, "-f", "json").stdout)


@pytest.fixture(scope="module")
def parity_state():
    import torch

    from ponder_cli.folders import shipped_path

    return shipped_path("parity16"), torch.load(shipped_path("parity16"), weights_only=True)


def test_info_still_warns_of_non_finite_weights(ponder, parity_state, tmp_path):
    import torch

    path, payload = parity_state
    weights = {key: value.clone() for key, value in payload["model"].items()}
    weights["step.cell.weight_ih"].view(-1)[3] = float("nan")
    torch.save({**payload, "model": weights}, tmp_path / "nan.pt")
    result = ponder("info", tmp_path / "nan.pt", "-f", "json")
    assert result.exit_code == 0 and "non-finite weights" in result.stderr and "step.cell.weight_ih" in result.stderr


def test_info_reads_a_legacy_file_and_a_version_1_one_as_the_file_they_were(ponder, parity_state, tmp_path):
    """Torch's legacy format (not a zip), and a version-1 checkpoint (weights under their old
    names, no step function): each described as the checkpoint it was made from."""
    import torch

    from ponder_cli.folders import shipped_path

    path, payload = parity_state
    torch.save(payload, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    reference = torch.load(shipped_path("reference"), weights_only=True)
    renamed = {"step.encoder.": "encoder.", "step.mlp.": "step_mlp."}
    old = {next((new + key[len(now):] for now, new in renamed.items() if key.startswith(now)), key): value
           for key, value in reference["model"].items()}
    torch.save({**reference, "version": 1, "model": old,
                "config": {k: v for k, v in reference["config"].items() if k != "step"}}, tmp_path / "v1.pt")

    def described(file):
        report = json.loads(ponder("info", file, "-f", "json").stdout)
        return {key: value for key, value in report.items() if key not in ("file", "checkpoints")}
    assert described(tmp_path / "legacy.pt") == described(path)
    assert described(tmp_path / "v1.pt") == described(shipped_path("reference"))


@pytest.mark.parametrize("case", ["code", "global", "storage", "version"])
def test_info_refuses_what_torch_refuses(case, ponder, parity_state, evil_checkpoint, one_error_line, tmp_path):
    """A checkpoint torch.load refuses (pickled code, a global torch does not load, a storage
    missing, a format version unknown) is one Error line naming the file, as eval's."""
    import zipfile

    import torch

    path, payload = parity_state
    target = tmp_path / "odd.pt"
    if case == "code":
        target, marker = evil_checkpoint
    elif case == "global":
        torch.save({**payload, "extra": torch.nn.Identity}, target)  # a class: weights_only refuses it
    elif case == "storage":
        with zipfile.ZipFile(path) as source, zipfile.ZipFile(target, "w") as copy:
            for item in source.infolist():
                if not item.filename.endswith("/data/0"):  # a storage left out
                    copy.writestr(item, source.read(item))
    else:
        torch.save({**payload, "version": 99}, target)
    line = one_error_line(ponder("info", target))
    assert str(target) in line and line == one_error_line(ponder("eval", target, "--limit", 1))
    if case == "code":
        assert "refused" in line and not marker.exists()
