"""What `ponder train` states and keeps beside its checkpoints: the resolved configuration (on
stderr and in config.json) and one row per epoch (metrics.csv), readable without torch."""

import csv
import dataclasses
import json
import signal
import subprocess
import sys
import time

import pytest

import ponder_cli
from ponder_cli.checkpoint import load_checkpoint
from ponder_cli.render import config_lines
from ponder_cli.train import EpochStats

import processes

COLUMNS = [f.name for f in dataclasses.fields(EpochStats)]


def _rows(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
        return list(reader)


def test_config_json_and_metrics_csv_beside_the_checkpoints(tiny_mnist, tmp_path, quick, ponder):
    out = tmp_path / "run"
    result = ponder("train", *quick, "--epochs", 2, "--method", "act", "--tau", 0.05, "--data-dir", tiny_mnist,
                    "--out", out)
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "config.json").read_text())
    assert saved["ponder_cli"] == ponder_cli.__version__
    state = load_checkpoint(out / "last.pt")
    assert saved["config"] == state.config.to_dict()
    assert (saved["sources"]["method"], saved["sources"]["tau"], saved["sources"]["epochs"]) == ("given",) * 3
    assert saved["sources"]["beta"] == saved["sources"]["hidden"] == "default"
    assert {"lambda_p", "beta"} <= set(saved["not_applicable"]) and "tau" not in saved["not_applicable"]
    assert (saved["resumed_from"], saved["device"], saved["amp"], saved["processes"]) == (None, "cpu", False, 1)
    rows = _rows(out / "metrics.csv")
    assert [row["epoch"] for row in rows] == ["1", "2"]
    for row, epoch in zip(rows, state.history):  # the epoch line's figures, to the last digit
        assert float(row["train_loss"]) == epoch["train_loss"] and float(row["lr"]) == epoch["lr"]
        assert row["improved"] == str(epoch["improved"]) and int(row["skipped_batches"]) == 0


def test_resume_appends_and_a_rewind_drops_the_discarded_rows(tiny_mnist, tmp_path, quick, ponder):
    out = tmp_path / "run"
    # a learning rate too small to change anything: only epoch 1 improves, so best.pt is epoch 1
    result = ponder("train", *quick, "--lr", 1e-9, "--patience", 0, "--data-dir", tiny_mnist, "--out", out)
    assert result.exit_code == 0, result.output
    first = (out / "metrics.csv").read_text()
    result = ponder("train", "--resume", out, "--epochs", 3, "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    text = (out / "metrics.csv").read_text()
    assert text.startswith(first) and text.count("epoch,") == 1
    assert [row["epoch"] for row in _rows(out / "metrics.csv")] == ["1", "2", "3"]
    assert json.loads((out / "config.json").read_text())["resumed_from"] == str(out / "last.pt")
    result = ponder("train", "--resume", out / "best.pt", "--epochs", 2, "--overwrite", "--data-dir", tiny_mnist)
    assert result.exit_code == 0, result.output
    assert (out / "metrics.csv").read_text().startswith(first)
    assert [row["epoch"] for row in _rows(out / "metrics.csv")] == ["1", "2"]  # the old 2 and 3 are gone


def test_train_states_the_configuration_it_resolved(tiny_mnist, tmp_path, ponder):
    result = ponder("train", "--step", "align", "--epochs", 1, "--train-size", 100, "--val-size", 100,
                    "--batch-size", 100, "--lambda-p", 0.4, "--data-dir", tiny_mnist, "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    block = lines[:lines.index(f"writing checkpoints to {tmp_path / 'run'}/")]
    # by source, then section by section: task, step, method, training
    assert block[:3] == ["configuration:",
                         "  given: val-size 100 · train-size 100 · step align · lambda-p 0.4 · epochs 1",
                         "    batch-size 100"]
    assert block[3:5] == ["  implied by --step align: turn-gate 0.2 · max-steps 12",
                          "    halting-input state+turn · halting-bias -0.405465 · truncation 0.1"]  # log(0.4 / 0.6)
    assert block[5].startswith("  defaults: task mnist · train-rotation 22.5 · split-seed none · hidden 64")
    # switches, said as the flags that set them
    assert " · ".join(line.strip() for line in block[-2:]).endswith(" · no-compile · no-refit-halting")
    assert all(len(line) <= 80 for line in block)
    assert "tau" not in result.stderr and "hidden-lin" not in result.stderr  # act's and the mlp step's
    assert "elems" not in result.stderr and "gru-" not in result.stderr  # parity's and the gru step's


def test_configuration_lines_group_by_source_and_wrap_at_80_columns():
    values = {"method": "plain", "max_steps": 1, "lr": 0.001, "halting_bias": None, "seed": 7}
    sources = {"method": "given", "max_steps": "implied by --method plain", "lr": "default", "halting_bias": "default",
               "seed": "given"}
    assert config_lines(values, sources, list(values)) == [
        "configuration:", "  given: method plain · seed 7", "  implied by --method plain: max-steps 1",
        "  defaults: lr 0.001 · halting-bias none"]
    many = {f"option_{i}": i for i in range(12)}
    lines = config_lines(many, dict.fromkeys(many, "default"), list(many), width=40)
    assert lines[1:] == ["  defaults: option-0 0 · option-1 1", "    option-2 2 · option-3 3 · option-4 4",
                         "    option-5 5 · option-6 6 · option-7 7", "    option-8 8 · option-9 9",
                         "    option-10 10 · option-11 11"]


def test_switches_show_as_the_flags_that_set_them():
    values = {"gru_layer_norm": True, "gru_orthogonal": False, "gru_update_bias": 1.0}
    sources = dict.fromkeys(values, "implied by --step gru")
    assert config_lines(values, sources, list(values))[1] == (
        "  implied by --step gru: gru-layer-norm · no-gru-orthogonal · gru-update-bias 1")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_before_the_first_epoch_leaves_no_run_folder(tiny_mnist, tmp_path):
    """Nothing saved, nothing left: the next run takes the same name instead of -2."""
    # small batches and many steps: the first epoch takes seconds, the signal lands inside it
    proc = processes.ponder("train", "--val-size", "100", "--batch-size", "2", "--max-steps", "20", "--data-dir",
                            tiny_mnist, "--no-progress", cwd=tmp_path)
    run = tmp_path / "runs" / "pondernet-mlp-seed1234"
    with proc:
        deadline = time.monotonic() + 60
        while not (run / "metrics.csv").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert stderr.splitlines()[-1] == "Terminated: no epoch had completed; nothing was saved"
    assert not run.exists() and (tmp_path / "runs").exists()


def test_environment_json_records_what_the_run_ran_on_and_config_json_stays_as_it_was(tiny_mnist, tmp_path, quick,
                                                                                     ponder):
    import platform
    from pathlib import Path

    import torch

    out = tmp_path / "run"
    result = ponder("train", *quick, "--data-dir", tiny_mnist, "--out", out, "--no-progress")
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert set(config) == {"format_version", "ponder_cli", "config", "sources", "started", "labels", "init_from",
                           "resumed_from",
                           "resumed_after_epoch", "device", "amp", "processes", "not_applicable"}
    from datetime import datetime, timedelta

    started = datetime.fromisoformat(config["started"])  # UTC, never local-time text
    assert started.utcoffset() == timedelta(0) and abs(time.time() - started.timestamp()) < 600
    assert config["labels"] == {"name": None, "tags": [], "note": None} and config["init_from"] is None
    sessions = json.loads((out / "environment.json").read_text())["sessions"]
    assert len(sessions) == 1
    first = sessions[0]
    assert first["command"][0] == "ponder"  # then sys.argv: the test runner's own here
    assert (first["ponder_cli"], first["torch"], first["python"]) == (ponder_cli.__version__, torch.__version__,
                                                                    platform.python_version())
    assert (first["device"], first["threads"], first["processes"]) == ("cpu", torch.get_num_threads(), 1)
    package = Path(ponder_cli.__file__).resolve().parent
    assert first["package"] == str(package)
    head = subprocess.run(["git", "-C", str(package.parent), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # run from a clone
        assert first["git"]["commit"] == head.stdout.strip()
    # resumed in its own folder: a second session; resume and info read config.json as before
    result = ponder("train", "--resume", out, "--epochs", 2, "--data-dir", tiny_mnist, "--no-progress")
    assert result.exit_code == 0, result.output
    assert len(json.loads((out / "environment.json").read_text())["sessions"]) == 2
    info = ponder("info", out, "-f", "json")
    assert info.exit_code == 0 and json.loads(info.stdout)["epochs_trained"] == 2
    assert json.loads(info.stdout)["sources"]["epochs"] == "given"


def test_resuming_another_runs_checkpoint_in_a_run_folder_is_refused_naming_both(runs, tmp_path, ponder,
                                                                                 error):
    """A last.pt copied over from another run: resuming it would rewrite the folder's config.json,
    config.toml, metrics.csv and best.pt as that run's. Refused, naming both; nothing touched."""
    import shutil

    folder = tmp_path / "pn1"
    shutil.copytree(runs / "pn1", folder)
    shutil.copy(runs / "act" / "last.pt", folder / "last.pt")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    # both runs named, with what differs (the method, the seed), and the way to replace the folder's run
    error(ponder("train", "--resume", folder, "--epochs", 3), 1, folder / "last.pt", folder / "config.json",
          "act · step mlp · mnist · seed 1234", "pondernet · step mlp · mnist · seed 1", "--overwrite")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    # the same run's own last.pt resumes as before (epochs and patience may change)
    shutil.copy(runs / "pn1" / "last.pt", folder / "last.pt")
    result = ponder("train", "--resume", folder, "--epochs", 2, "--patience", 9)
    error(result, 1, folder / "last.pt", "complete")


def test_no_run_hides_another_and_latest_is_the_run_started_last(tiny_mnist, tmp_path, quick, ponder, error,
                                                                  monkeypatch):
    """A run is refused a folder that holds runs, or one inside a run; `ponder runs` finds them at
    any depth, and `latest` is the run started last by its own record, whatever the files' times."""
    import os
    import shutil

    monkeypatch.chdir(tmp_path)

    def train(*args):
        return ponder("train", *quick, "--data-dir", tiny_mnist, "-q", *args)

    assert train().exit_code == 0
    first = "runs/pondernet-mlp-seed1234"
    # the run it would hide, and a folder that would do
    error(train("--out", "runs"), 1, "--out runs", f"({first})", f"--out {first}-2")
    error(train("--out", "runs", "--overwrite"), 1, "--out runs", f"({first})")
    error(train("--out", f"{first}/inner"), 1, f"--out {first}/inner", f"--out {first}-inner")
    assert sorted(os.listdir("runs")) == ["pondernet-mlp-seed1234"]  # nothing written by the refused ones
    assert sorted(os.listdir(first)) == ["best.pt", "config.json", "config.toml", "environment.json", "last.pt",
                                         "metrics.csv"]
    assert train("--seed", "3").exit_code == 0
    for file in (tmp_path / "runs" / "pondernet-mlp-seed3").iterdir():  # its files look older: no matter
        os.utime(file, (1e9, 1e9))
    shutil.copytree(first, "a/b/c/d")  # four folders down
    (tmp_path / "a" / ".venv").mkdir()
    shutil.copytree(first, "a/.venv/run")  # hidden: not looked into
    listed = json.loads(ponder("runs", "-f", "json").stdout)["buckets"]
    # by recorded start (the copy keeps its record: a tie, by path)
    assert [row["run"] for row in listed] == ["a/b/c/d", first, "runs/pondernet-mlp-seed3"]
    assert listed[0]["when"] == listed[1]["when"] <= listed[2]["when"]
    result = ponder("eval", "latest", "--limit", 20, "--data-dir", tiny_mnist, "-f", "json")
    assert result.exit_code == 0, result.output
    assert "using runs/pondernet-mlp-seed3/best.pt (latest" in result.stderr
    assert json.loads(result.stdout)["seed"] == 3


def test_init_from_starts_a_new_run_from_another_runs_weights_with_new_settings(tiny_mnist, tmp_path, quick, ponder,
                                                                                error):
    import torch

    def train(*args):
        return ponder("train", *quick, "--data-dir", tiny_mnist, "-q", *args)

    assert train("--out", tmp_path / "a", "--max-steps", 3).exit_code == 0
    source = tmp_path / "a" / "best.pt"
    # a learning rate too small to move a weight: the new run's model is the one it started from
    result = ponder("train", "--init-from", tmp_path / "a", "--lr", "1e-30", "--epochs", 1, "--out", tmp_path / "b",
                    "--data-dir", tiny_mnist, "--no-progress")
    assert result.exit_code == 0, result.output
    assert f"starting from the weights of {source} (the best.pt of run folder {tmp_path / 'a'}), epoch 1" in \
        result.stderr
    started, trained = load_checkpoint(source), load_checkpoint(tmp_path / "b" / "best.pt")
    assert all(torch.allclose(started.model[name], trained.model[name], atol=1e-6) for name in started.model)
    assert trained.config.method.max_steps == 3 and trained.config.training.lr == 1e-30  # its settings, and the new
    assert trained.config.task.train_size == 200 and trained.epoch == 1
    saved = json.loads((tmp_path / "b" / "config.json").read_text())
    start = saved["init_from"]  # the file by its absolute path, its epoch and its weights' digest
    assert (start["checkpoint"], start["epoch"], len(start["weights"])) == (str(source.resolve()), 1, 16)
    assert saved["sources"]["max_steps"] == f"file {source}"
    assert train("--out", tmp_path / "c", "--max-steps", 3, "--lr", "1e-30").exit_code == 0  # the same seed, no init
    fresh = load_checkpoint(tmp_path / "c" / "best.pt")
    assert not all(torch.allclose(started.model[name], fresh.model[name], atol=1e-6) for name in started.model)
    info = json.loads(ponder("info", tmp_path / "b", "-f", "json").stdout)
    assert info["init_from"] == f"{source.resolve()} (epoch 1)" and info["start"] == start
    assert info["train_command"].endswith(f"--init-from {source.resolve()} --init-weights 1:{start['weights']}")
    assert "initialised from" in ponder("info", tmp_path / "b").stdout
    resumed = ponder("train", "--resume", tmp_path / "b", "--epochs", 2, "--data-dir", tiny_mnist, "-q")
    assert resumed.exit_code == 0, resumed.output  # where its weights started stays on record
    assert json.loads((tmp_path / "b" / "config.json").read_text())["init_from"] == start
    best = json.loads(ponder("info", tmp_path / "b" / "best.pt", "-f", "json").stdout)  # planned 1 epoch, the run 2
    assert (best["epochs_planned"], best["start"]) == (1, start)

    misfit = train("--init-from", source, "--hidden", 32, "--out", tmp_path / "d")
    error(misfit, 2, f"--init-from {source}", "(64,) there")  # the first weight whose shape differs
    assert not (tmp_path / "d").exists()
    both = train("--init-from", source, "--resume", tmp_path / "b")
    error(both, 2, "--init-from", "--resume")  # settings that do not go together: a usage mistake
