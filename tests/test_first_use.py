"""What a new user meets: nothing of theirs overwritten, strict JSON, undefined fits said so,
damaged or odd files named for what they are, `ponder runs`, the device, evaluation progress and
interrupts, tables in a pipe (a first-use review's findings, each at the mechanism that fixes it)."""

import csv
import io
import json
import os
import signal
import struct
import subprocess
import sys
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch
from rich.cells import cell_len

from ponder_cli.checkpoint import load_checkpoint, save_checkpoint
from ponder_cli.reports import least_squares

import processes

PARITY16 = Path(__file__).resolve().parent.parent / "ponder_cli" / "checkpoints" / "parity" / "interpolation16.pt"
PARITY = ["--task", "parity", "--elems", "8", "--batches-per-epoch", "3", "--max-steps", "3", "--batch-size", "32"]


def _strict(text: str):
    """JSON as a strict reader (JavaScript's JSON.parse) takes it: NaN and Infinity refused."""
    def refuse(token):
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


# 1. a folder of the user's own is never written into ---------------------------------------------

@pytest.mark.parametrize("files", [("config.json", "metrics.csv", "config.toml"), ("environment.json",),
                                   ("events.out.tfevents.1700000000.host",), ("best.pt",)])
def test_a_folder_holding_any_file_a_run_writes_is_refused(files, tmp_path, ponder, error):
    out = tmp_path / "myproj"
    out.mkdir()
    for name in files:
        (out / name).write_text(f"mine: {name}")
    error(ponder("train", *PARITY, "--epochs", 1, "--out", out), 1, out, "--overwrite", *files)
    assert sorted(p.name for p in out.iterdir()) == sorted(files)  # nothing added, nothing replaced
    assert all((out / name).read_text() == f"mine: {name}" for name in files)


def test_overwrite_replaces_them_and_an_unrelated_file_does_not_count(tmp_path, ponder):
    out = tmp_path / "myproj"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # not a file a run writes: the folder is usable
    result = ponder("train", *PARITY, "--epochs", 1, "--out", out, "-q", "-f", "json")
    assert result.exit_code == 0, result.output
    assert (out / "notes.txt").read_text() == "mine" and (out / "last.pt").is_file()
    (out / "metrics.csv").write_text("mine")
    assert ponder("train", *PARITY, "--epochs", 1, "--out", out, "-q").exit_code == 1
    result = ponder("train", *PARITY, "--epochs", 1, "--out", out, "-q", "--overwrite")
    assert result.exit_code == 0, result.output
    assert (out / "metrics.csv").read_text().startswith("epoch,")


def test_resuming_into_another_folder_refuses_the_users_files_too(tmp_path, ponder, error):
    run = tmp_path / "run"
    assert ponder("train", *PARITY, "--epochs", 1, "--out", run, "-q").exit_code == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.toml").write_text("mine")
    error(ponder("train", "--resume", run, "--epochs", 2, "--out", other), 1, other, "config.toml")
    assert (other / "config.toml").read_text() == "mine"


# 2. an image that would decode to gigabytes ----------------------------------------------------------

@pytest.mark.parametrize("side", [40, 70])  # over Pillow's limit (a warning), over twice it (an error)
def test_a_decompression_bomb_is_one_error_line(side, tmp_path, monkeypatch, ponder, error):
    from PIL import Image
    Image.new("L", (side, side), 0).save(tmp_path / "bomb.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # the same guard, at a size a test can afford
    error(ponder("predict", "align", tmp_path / "bomb.png"), 1, tmp_path / "bomb.png", "1,000 pixels")


# 3. strict JSON --------------------------------------------------------------------------------------

def test_json_output_never_holds_nan_or_infinity(tmp_path, ponder):
    from ponder_cli.render import render_report
    from ponder_cli.reports import Report

    report = Report(meta={"command": "x", "rho": float("nan"), "fit": {"slope": float("inf")}},
                    buckets=[{"values": [1.0, float("-inf")], "mean": float("nan")}], columns=[], title="t")
    out = io.StringIO()
    render_report(report, "json", file=out)
    assert _strict(out.getvalue()) == {"format_version": 1, "command": "x", "rho": None, "fit": {"slope": None},
                                       "buckets": [{"values": [1.0, None], "mean": None}]}
    # a model with NaN weights, end to end: a warning on stderr, JSON any reader takes on stdout
    state = torch.load(PARITY16, weights_only=True)
    state["model"] = {k: v * float("nan") if v.is_floating_point() else v for k, v in state["model"].items()}
    torch.save(state, tmp_path / "nan.pt")
    result = ponder("eval", tmp_path / "nan.pt", "--limit", 32, "-f", "json")
    assert result.exit_code == 0, result.output
    data = _strict(result.stdout)
    assert data["buckets"][0]["loss"] is None and "Warning:" in result.stderr


# 4. a slope through one point is undefined -----------------------------------------------------------

def test_least_squares_needs_two_distinct_points():
    assert least_squares([45.0], [6.34]) == (None, None, None)
    assert least_squares([3, 3, 3], [1.0, 2.0, 4.0]) == (None, None, None)
    assert least_squares([0, 10], [2.0, 2.0]) == (0.0, 2.0, None)  # flat: a slope of 0, r² undefined


@pytest.mark.parametrize("args,key", [(["--every", "400"], "steps_per_10_degrees"),
                                      (["--from", "45", "--to", "45"], "steps_per_10_degrees"),
                                      (["parity16", "--from", "3", "--to", "3", "--limit", "32"], "steps_per_count")])
def test_a_sweep_of_one_point_has_no_slope(args, key, checkpoint, tiny_mnist, ponder):
    if args[0] != "parity16":
        args = [checkpoint, *args, "--data-dir", tiny_mnist]
    data = _strict(ponder("sweep", *args, "-f", "json").stdout)
    assert len(data["buckets"]) == 1 and data["fit"] == {key: None, "steps_at_0": None, "r2": None}
    table = ponder("sweep", *args).stdout
    assert "least squares: undefined" in table and "per 10°" not in table and "per count" not in table


# 5. --plot naming a folder --------------------------------------------------------------------------

def test_plot_naming_a_folder_is_refused_before_any_work(tmp_path, ponder, error):
    pytest.importorskip("matplotlib")
    (tmp_path / "figures").mkdir()
    result = ponder("sweep", "--plot", tmp_path / "figures", "-q", "--data-dir", tmp_path / "none")
    # naming the folder and a file in it to give instead
    error(result, 1, f"--plot {tmp_path / 'figures'}", tmp_path / "figures" / "plot.png")
    assert not (tmp_path / "figures.png").exists()


# 6. a checkpoint cut short or damaged -------------------------------------------------------------------

def test_a_truncated_or_damaged_checkpoint_says_so(checkpoint, tmp_path, ponder, error):
    whole = checkpoint.read_bytes()
    for size in (100, len(whole) // 2, len(whole) - 1):
        cut = tmp_path / f"cut{size}.pt"
        cut.write_bytes(whole[:size])
        line = error(ponder("info", cut), 1, cut, "cut short")
        assert "central directory" not in line  # what is wrong with the file, not torch's words for it
    with zipfile.ZipFile(checkpoint) as archive:  # a byte of tensor data changed: only the CRC tells
        member = next(i for i in archive.infolist() if "/data/" in i.filename and i.file_size > 16)
    damaged = bytearray(whole)
    name_length, extra_length = struct.unpack("<HH", whole[member.header_offset + 26:member.header_offset + 30])
    start = member.header_offset + 30 + name_length + extra_length  # the member's data, after its local header
    damaged[start + 8] ^= 0xFF
    (tmp_path / "damaged.pt").write_bytes(bytes(damaged))
    line = error(ponder("info", tmp_path / "damaged.pt"), 1, tmp_path / "damaged.pt", member.filename, "checksum")
    assert "cut short" not in line  # told from a file cut short


# 7. special files: one check (the --config case is in test_config_file.py) -------------------------

# a checkpoint that is a device: test_reliability.py
@pytest.mark.parametrize("args", [["predict", "align", "/dev/null"], ["train", "--config", "/dev/null"]])
def test_a_character_device_is_named_for_what_it_is(args, ponder, error):
    error(ponder(*args), 1, "/dev/null", "character device")


# 9. a run folder in its first epoch ---------------------------------------------------------------------

def _run_folder_without_checkpoint(folder: Path) -> None:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"ponder_cli": "0.2.0", "config": {"task": "parity",
                                                   "method": "pondernet", "step": "gru", "epochs": 20}}))


def test_info_on_a_run_folder_with_no_checkpoint_yet(tmp_path, ponder, error):
    folder = tmp_path / "run"
    _run_folder_without_checkpoint(folder)
    assert "PID" not in error(ponder("info", folder), 1, folder, "no checkpoint")
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as child:
        try:
            (folder / ".ponder.lock").write_text(str(child.pid))
            error(ponder("info", folder), 1, folder, "no checkpoint", f"PID {child.pid}")
        finally:
            child.kill()
    # a folder of the user's own that holds a config.json is no run folder
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text("{}")
    line = error(ponder("info", tmp_path / "mine"), 1, tmp_path / "mine", "last.pt", "best.pt")
    assert "no checkpoint" not in line


# 10. names never split mid-word ----------------------------------------------------------------------

@pytest.mark.parametrize("width", [40, 60, 80])
def test_narrow_tables_keep_every_model_name_whole(width):
    from ponder_cli.listing import shipped_models
    from ponder_cli.render import render_report
    from ponder_cli.folders import SHIPPED

    out = io.StringIO()
    render_report(shipped_models(), "table", file=out, width=width)
    cells = {cell.strip() for line in out.getvalue().splitlines() for cell in line.split("│")}
    assert set(SHIPPED) <= cells


def test_tables_in_a_pipe_are_80_columns_unless_columns_says(monkeypatch):
    from ponder_cli.api import run_info
    from ponder_cli.render import render_report

    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()  # not a terminal
    render_report(run_info("align"), "table", file=out)
    assert max(cell_len(line) for line in out.getvalue().splitlines()) == 80
    monkeypatch.setenv("COLUMNS", "120")
    out = io.StringIO()
    render_report(run_info("align"), "table", file=out)
    assert max(cell_len(line) for line in out.getvalue().splitlines()) > 80


# 11. a wrong type in a checkpoint's config ---------------------------------------------------------

@pytest.mark.parametrize("key,value,kind", [("max_steps", "twenty", "a whole number"), ("max_steps", True,
                                            "a whole number"), ("lambda_p", "0.2", "a number"),
                                            ("gru_layer_norm", 1, "true or false")])
def test_a_wrong_type_in_a_checkpoints_config_names_the_key(key, value, kind, tmp_path, ponder, error):
    state = torch.load(PARITY16, weights_only=True)
    state["config"][key] = value
    torch.save(state, tmp_path / "typed.pt")
    # named as every configuration message names a setting: max-steps (the key max_steps, the option --max-steps)
    error(ponder("info", tmp_path / "typed.pt"), 1, tmp_path / "typed.pt", key.replace("_", "-"), kind, repr(value))


# 12. --rotate beyond a turn ------------------------------------------------------------------------

@pytest.mark.parametrize("angle", ["1e39", "361", "-400", "nan", "inf"])
def test_rotate_must_be_an_angle(angle, ponder, error):
    error(ponder("predict", "align", "one.png", "--rotate", angle), 2, "--rotate", "360")


# ponder runs ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def run_folders(checkpoint, tmp_path_factory):
    """A runs/ folder of each status `ponder runs` tells, made from one tiny run's last.pt."""
    from ponder_cli.runs import write_run_config

    root = tmp_path_factory.mktemp("listed") / "runs"
    source = load_checkpoint(checkpoint.parent / "last.pt")

    def run(name, epoch, epochs, without=0):
        state = load_checkpoint(checkpoint.parent / "last.pt")
        state.config = source.config.replace(epochs=epochs, patience=2)
        state.epoch, state.epochs_without_improvement = epoch, without
        state.history = [dict(source.history[0], epoch=n + 1) for n in range(epoch)]
        (root / name).mkdir(parents=True)
        save_checkpoint(state, root / name / "last.pt")
        write_run_config(root / name, state.config, {})

    run("a-finished", 3, 3)
    run("b-stopped", 4, 10, without=2)
    run("c-interrupted", 2, 10)
    run("d-running", 1, 10)
    _run_folder_without_checkpoint(root / "e-empty")
    (root / "f-unreadable").mkdir()
    (root / "f-unreadable" / "last.pt").write_bytes(b"PK\x03\x04cut")
    (root / "not-a-run").mkdir()  # ignored: holds nothing a run writes
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    (root / "d-running" / ".ponder.lock").write_text(str(child.pid))
    for file in (root / "a-finished").iterdir():  # the oldest: listed first
        os.utime(file, (1e9, 1e9))
    yield root
    child.kill()
    child.wait()


def test_runs_lists_every_run_folder_with_its_status(run_folders, checkpoint, ponder, monkeypatch):
    monkeypatch.chdir(run_folders.parent)
    result = ponder("runs", "-f", "json")
    assert result.exit_code == 0, result.output
    data = _strict(result.stdout)
    rows = {Path(b["run"]).name: b for b in data["buckets"]}
    assert data["command"] == "runs" and data["folders"] == ["runs", "."] and data["device"] is None
    assert {name: row["status"] for name, row in rows.items()} == {
        "a-finished": "finished", "b-stopped": "stopped early", "c-interrupted": "interrupted",
        "d-running": "running", "e-empty": "empty", "f-unreadable": "unreadable"}
    assert data["buckets"][0]["run"] == str(Path("runs") / "a-finished")  # oldest first
    best = load_checkpoint(checkpoint.parent / "last.pt").history[0]["val_accuracy"]
    assert rows["b-stopped"] | {"when": None} == {
        "run": "runs/b-stopped", "name": "b-stopped", "task": "mnist", "method": "pondernet", "step": "mlp", "status": "stopped early",
        "epoch": 4, "epochs": 10, "best_epoch": 1, "best_val_accuracy": best,
        "best_val_steps": rows["b-stopped"]["best_val_steps"], "checkpoint": "runs/b-stopped/last.pt", "when": None,
        "folder": "b-stopped", "init_from": None, "amp": False, "tags": [], "note": None}
    assert (rows["e-empty"]["task"], rows["e-empty"]["epoch"], rows["e-empty"]["checkpoint"]) == ("parity", None, None)
    assert rows["a-finished"]["when"].startswith("2001-09-")
    rows = list(csv.DictReader(io.StringIO(ponder("runs", "-f", "csv").stdout)))
    assert [Path(r["run"]).name for r in rows][0] == "a-finished" and len(rows) == 6
    table = ponder("runs").stdout
    assert max(cell_len(line) for line in table.splitlines()) <= 80
    for word in ("a-finished", "3/3", "4/10", "2/10", "1/10", "empty", "unreadable", "2001-09-09"):
        assert word in table, word  # whole: figures and names never wrap


def test_runs_of_a_named_folder_a_run_folder_or_none(run_folders, tmp_path, ponder, error, monkeypatch):
    data = _strict(ponder("runs", run_folders / "a-finished", "-f", "json").stdout)
    assert [b["status"] for b in data["buckets"]] == ["finished"]
    monkeypatch.chdir(tmp_path)  # no runs/ here: an empty list, said so
    result = ponder("runs")
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 1 and "`ponder train`" in result.stdout
    assert _strict(ponder("runs", "-f", "json").stdout)["buckets"] == []
    assert ponder("runs", "-f", "csv").stdout.startswith("command,task,checkpoints,")  # a header, no blank line
    error(ponder("runs", tmp_path / "nope"), 1, tmp_path / "nope")


def test_runs_finds_the_runs_trained_with_out_and_a_folder_of_runs_is_one_rule(runs, tmp_path, ponder, error,
                                                                                monkeypatch):
    """`ponder runs` lists every run folder below the current folder (runs/, an --out folder, a
    sweep's runs/sweep/seed1), as `eval` and `info` name a folder of runs: one rule."""
    import shutil

    monkeypatch.chdir(tmp_path)
    places = ["runs/pn1", "mine", "sweep/lr/seed1", ".trash/old", "deep/a/b/c/d", "venv/lib/run"]
    for place, written in zip(places, range(2_000_000_000, 2_000_000_006)):
        shutil.copytree(runs / "pn1", tmp_path / place)
        config = json.loads((tmp_path / place / "config.json").read_text())  # each started at its own time
        started = datetime.fromtimestamp(written, timezone.utc).isoformat()
        (tmp_path / place / "config.json").write_text(json.dumps({**config, "started": started}))
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")  # a virtual environment: not looked into
    (tmp_path / "mine" / "inside").mkdir()  # nothing inside a run folder is looked into
    shutil.copy(runs / "act" / "last.pt", tmp_path / "mine" / "inside" / "last.pt")
    listed = json.loads(ponder("runs", "-f", "json").stdout)
    # oldest first, at any depth; hidden folders and virtual environments are left out
    assert [row["run"] for row in listed["buckets"]] == ["runs/pn1", "mine", "sweep/lr/seed1", "deep/a/b/c/d"]
    assert [row["status"] for row in listed["buckets"]] == ["finished"] * 4
    table = ponder("runs").stdout
    assert "Runs under runs/ and ./" in table and all(name in table for name in ("│ pn1 ", "│ mine ", "sweep/lr/seed1"))
    assert [row["name"] for row in listed["buckets"]] == ["pn1", "mine", "sweep/lr/seed1", "deep/a/b/c/d"]
    assert [row["run"] for row in json.loads(ponder("runs", "sweep", "-f", "json").stdout)["buckets"]] == \
        ["sweep/lr/seed1"]
    error(ponder("info", "sweep"), 1, "lr/seed1", "`ponder runs sweep`")


def test_age_reads_as_a_person_would():
    from datetime import datetime, timedelta, timezone

    from ponder_cli.reports.runs import age

    now = datetime(2026, 11, 27, 12, 0, tzinfo=timezone.utc)
    ago = {delta: age((now - delta).isoformat(), now) for delta in (timedelta(seconds=20), timedelta(minutes=5),
                                                                     timedelta(hours=3), timedelta(days=1),
                                                                     timedelta(days=9), timedelta(days=90))}
    assert list(ago.values()) == ["just now", "5 min ago", "3 h ago", "1 day ago", "9 days ago", "2026-08-29"]


# the device, progress and interrupts ------------------------------------------------------------

def test_every_computing_command_says_its_device(checkpoint, tiny_mnist, tmp_path, ponder):
    np = pytest.importorskip("numpy")
    np.save(tmp_path / "digit.npy", np.zeros((28, 28)))
    for args in (["eval", checkpoint, "--angles", 10], ["sweep", checkpoint, "--from", 0, "--to", 10],
                 ["compare", checkpoint, "--angles", 10], ["predict", checkpoint, tmp_path / "digit.npy"]):
        result = ponder(*args, "--data-dir", tiny_mnist, "--limit", 20, "-f", "json") if args[0] != "predict" else \
            ponder(*args, "-f", "json")
        assert result.exit_code == 0, result.output
        assert _strict(result.stdout)["device"] == "cpu"
        assert any(line.startswith("device cpu (--device auto") for line in result.stderr.splitlines()) or \
            torch.cuda.is_available()
    trained = ponder("train", "--epochs", 1, "--max-steps", 2, "--val-size", 100, "--train-size", 100,
                     "--data-dir", tiny_mnist, "--out", tmp_path / "run", "--no-progress")
    assert trained.exit_code == 0, trained.output
    [training] = [line for line in trained.stderr.splitlines() if line.startswith("training ")]
    assert all(word in training for word in ("pondernet", "mlp", "100 images", "100", "device cpu (--device auto")) or \
        torch.cuda.is_available()
    explicit = ponder("predict", checkpoint, tmp_path / "digit.npy", "--device", "cpu")
    assert explicit.exit_code == 0 and "device cpu" in explicit.stderr.splitlines()
    for command in ("info", "models"):
        assert _strict(ponder(command, "-f", "json").stdout)["device"] is None


def test_evaluation_progress_goes_to_a_log_as_lines(checkpoint, tiny_mnist, monkeypatch):
    from ponder_cli.api import EvalOptions, evaluate_checkpoint
    from ponder_cli.api import evaluation

    monkeypatch.setattr(evaluation, "PROGRESS_EVERY", 0.0)  # every bucket, for the test
    lines = []
    evaluate_checkpoint("eval", checkpoint, [10, 20, 30], EvalOptions(data_dir=tiny_mnist), log=lines.append)
    ticks = [line for line in lines if line.startswith("evaluating:")]
    assert [t.split(",")[0] for t in ticks] == [f"evaluating: {n} of 3 buckets" for n in (1, 2, 3)]
    assert ticks[-1].endswith(", done") and "to go" in ticks[0]
    lines.clear()
    monkeypatch.setattr(evaluation, "PROGRESS_EVERY", 3600.0)  # a quick evaluation says nothing
    evaluate_checkpoint("eval", checkpoint, [10, 20], EvalOptions(data_dir=tiny_mnist), log=lines.append)
    assert not [line for line in lines if line.startswith("evaluating:")]


@pytest.mark.parametrize("signal_name,code,headline,ignored", [("SIGINT", 130, "Interrupted", False),
                                                                ("SIGTERM", 143, "Terminated", False),
                                                                ("SIGINT", 0, None, True),
                                                                ("SIGTERM", 143, "Terminated", True)])
def test_a_signal_during_an_evaluation_is_one_line(signal_name, code, headline, ignored, checkpoint, tiny_mnist):
    """A real signal to a real process, once its first bucket is done: one line, the shell's status.
    A process started with SIGINT ignored, as a script's `ponder ... &` starts it, keeps ignoring
    it (SIGTERM still stops it)."""
    def eval_signalled_after_one_bucket():
        from ponder_cli import evaluate
        real = evaluate.evaluate_bucket
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

        def once_then_signal(*args, **kwargs):
            result = real(*args, **kwargs)
            os.kill(os.getpid(), getattr(signal, signal_name))
            return result

        evaluate.evaluate_bucket = once_then_signal  # in the child alone
        processes.run_cli(["eval", str(checkpoint), "--angles", "10", "20", "--data-dir", str(tiny_mnist),
                           "-f", "json"])

    with processes.fork(eval_signalled_after_one_bucket) as proc:
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr
    if headline is None:  # ignored: both buckets evaluated
        assert [bucket["rotation"] for bucket in json.loads(stdout)["buckets"]] == [10, 20]
    else:
        assert stdout == ""
        assert stderr.splitlines()[-1].startswith(f"{headline}: ponder eval stopped")


# found by a fresh new-user pass ------------------------------------------------------------------

def test_an_npy_header_promising_more_than_the_file_holds_is_one_line(tmp_path, ponder, error):
    np = pytest.importorskip("numpy")
    with open(tmp_path / "huge.npy", "wb") as f:  # 730 GiB promised, 100 bytes given: was a MemoryError traceback
        np.lib.format.write_array_header_1_0(f, {"descr": "|u1", "fortran_order": False, "shape": (10**9, 28, 28)})
        f.write(b"\0" * 100)
    error(ponder("predict", "align", tmp_path / "huge.npy"), 1, tmp_path / "huge.npy", "cut short")


def test_out_and_plot_name_a_special_file_for_what_it_is(tmp_path, ponder, error):
    pytest.importorskip("matplotlib")
    os.mkfifo(tmp_path / "fifo")
    error(ponder("sweep", "--plot", tmp_path / "fifo", "--data-dir", tmp_path), 1, f"--plot {tmp_path / 'fifo'}",
          "named pipe")
    assert not (tmp_path / "fifo.png").exists()  # was written beside it (--plot /dev/null: /dev/null.png)
    error(ponder("train", "--out", "/dev/null"), 1, "--out /dev/null", "character device")


def test_a_folder_of_runs_given_as_a_checkpoint_points_to_ponder_runs(run_folders, ponder, error):
    for command in ("info", "eval"):  # a few of its runs named, then the command that lists them
        error(ponder(command, run_folders), 1, "a-finished, b-stopped, c-interrupted, ...",
              f"`ponder runs {run_folders}`")
    error(ponder("eval", run_folders / "e-empty"), 1, run_folders / "e-empty", "no checkpoint")


def test_every_command_words_an_interrupt_alike_and_gives_the_handlers_back(monkeypatch, ponder):
    """One layer: the CLI's boundary, for info, runs and models as for eval; SIGTERM raised as an
    interrupt only while a command runs."""
    import ponder_cli.api as api
    from ponder_cli import SigTerm
    from ponder_cli import listing

    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    for command, function, interrupt, line in [
            ("models", "shipped_models", KeyboardInterrupt, "Interrupted: ponder models stopped"),
            ("info", "run_info", KeyboardInterrupt, "Interrupted: ponder info stopped"),
            ("runs", "list_runs", SigTerm, "Terminated: ponder runs stopped")]:
        def interrupted(*args, interrupt=interrupt, **kwargs):
            raise interrupt
        monkeypatch.setattr(listing, function, interrupted)
        monkeypatch.setattr(api, function, interrupted, raising=False)
        result = ponder(command)
        assert result.exit_code == (143 if interrupt is SigTerm else 130) and result.stdout == ""
        assert result.stderr == f"{line} before its results; nothing was written\n"
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
