"""One record of a run (its start, --amp, its labels, why it stopped), kept in its checkpoints and
its config.json: a rerun from any of its forms trains the same run, and listing reads it."""

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from ponder_cli.checkpoint import load_checkpoint, save_checkpoint

SMALL = ["--max-steps", "3", "--hidden", "16", "--hidden-cnn", "16", "--val-size", "100", "--train-size", "200",
         "--batch-size", "50", "--no-progress", "-q"]


def _digest(path) -> str:
    weights = load_checkpoint(path).model
    digest = hashlib.sha256()
    for key in sorted(weights):
        digest.update(key.encode() + weights[key].contiguous().numpy().tobytes())
    return digest.hexdigest()


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def tuned(tiny_mnist, tmp_path_factory, ponder):
    """A source run (2 epochs), and a labelled --amp fine-tune of its best.pt (1 epoch)."""
    root = tmp_path_factory.mktemp("record")
    source = ponder("train", *SMALL, "--epochs", 2, "--data-dir", tiny_mnist, "--out", root / "src")
    assert source.exit_code == 0, source.output
    tuned = ponder("train", *SMALL, "--init-from", root / "src", "--lr", "5e-4", "--epochs", 1, "--amp",
                   "--name", "tuned", "--tag", "ft", "--note", "a fine-tune", "--data-dir", tiny_mnist,
                   "--out", root / "ft")
    assert tuned.exit_code == 0, tuned.output
    return root


def _no_result_or_setting_differs(ponder, a, b):
    buckets = _json(ponder("diff", a, b, "-f", "json"))["buckets"]
    assert [bucket["key"] for bucket in buckets if bucket["kind"] != "label"] == []


def test_a_fine_tuned_amp_run_reruns_the_same_from_each_of_its_forms(tuned, tiny_mnist, tmp_path, ponder):
    ft = tuned / "ft"
    info = _json(ponder("info", ft, "-f", "json"))
    assert info["amp"] is True and info["start"]["checkpoint"] == str((tuned / "src" / "best.pt").resolve())
    assert "--amp" in info["train_command"] and "--init-weights" in info["train_command"]
    printed = tmp_path / "printed.json"  # --print-config of the run as given
    shown = ponder("train", *SMALL, "--init-from", tuned / "src", "--lr", "5e-4", "--epochs", 1, "--amp",
                   "--print-config", "-f", "json")
    assert _json(shown)["amp"] is True
    printed.write_text(shown.stdout)
    copied = tmp_path / "copied.pt"
    shutil.copy(ft / "best.pt", copied)
    copy_info = _json(ponder("info", copied, "-f", "json"))  # no config.json beside it: its own record
    assert (copy_info["name"], copy_info["tags"], copy_info["amp"]) == ("tuned", ["ft"], True)
    assert copy_info["train_command"] == info["train_command"]
    reruns = {"config.toml": ["--config", ft / "config.toml"], "config.json": ["--config", ft / "config.json"],
              "print-config": ["--config", printed],
              "reproduce": shlex.split(info["train_command"])[2:]}
    for name, args in reruns.items():
        result = ponder("train", *args, "--data-dir", tiny_mnist, "--out", tmp_path / name, "-q", "--no-progress")
        assert result.exit_code == 0, (name, result.output)
        assert _digest(tmp_path / name / "last.pt") == _digest(ft / "last.pt"), name
        _no_result_or_setting_differs(ponder, ft, tmp_path / name)
        assert load_checkpoint(tmp_path / name / "last.pt").run["amp"] is True
    # without its start and --amp a rerun is another run, and diff says so
    other = ponder("train", *SMALL, "--lr", "5e-4", "--epochs", 1, "--data-dir", tiny_mnist, "--out", tmp_path / "x")
    assert other.exit_code == 0
    differ = {b["key"]: b for b in _json(ponder("diff", ft, tmp_path / "x", "-f", "json"))["buckets"]}
    assert differ["amp"]["values"] == [True, False] and differ["init_from"]["kind"] == "label"


def test_a_refits_config_toml_trains_it_again(tuned, tiny_mnist, tmp_path, ponder):
    refit = ponder("train", "--init-from", tuned / "src", "--refit-halting", "--halting-target", "final",
                   "--truncation", "0", "--epochs", 1, "--train-size", 100, "--no-progress", "-q",
                   "--data-dir", tiny_mnist, "--out", tmp_path / "refit")
    assert refit.exit_code == 0, refit.output
    again = ponder("train", "--config", tmp_path / "refit" / "config.toml", "--data-dir", tiny_mnist,
                   "--out", tmp_path / "again", "-q", "--no-progress")
    assert again.exit_code == 0, again.output
    assert _digest(tmp_path / "again" / "last.pt") == _digest(tmp_path / "refit" / "last.pt")


def test_a_source_that_moved_on_is_refused_naming_it(tuned, tiny_mnist, tmp_path, ponder, one_error_line):
    source = tmp_path / "src"
    shutil.copytree(tuned / "src", source)
    first = _json(ponder("train", *SMALL, "--init-from", source, "--epochs", 1, "--print-config", "-f", "json"))
    command = ["--init-from", first["init_from"], "--init-weights", first["init_weights"]]
    state = load_checkpoint(source / "best.pt")  # its run trained on: another epoch's weights there now
    state.epoch += 1
    name = next(iter(state.model))
    state.model[name] = state.model[name] + 1
    save_checkpoint(state, source / "best.pt")
    result = ponder("train", *SMALL, *command, "--epochs", 1, "--data-dir", tiny_mnist, "--out", tmp_path / "no")
    line = one_error_line(result)
    assert result.exit_code == 1 and "--init-from" in line and str(source.resolve() / "best.pt") in line
    assert f"epoch {state.epoch}" in line and not (tmp_path / "no").exists()
    alone = ponder("train", *SMALL, "--init-weights", first["init_weights"], "--print-config")
    assert "--init-from" in one_error_line(alone) and alone.exit_code == 2


def test_labels_survive_a_cut_short_config_json_and_a_resume_adds_tags(tuned, tiny_mnist, tmp_path, ponder):
    run = tmp_path / "ft"
    shutil.copytree(tuned / "ft", run)
    (run / "config.json").write_text((run / "config.json").read_text()[:50])  # cut short
    row = _json(ponder("runs", tmp_path, "-f", "json"))["buckets"][0]
    assert (row["name"], row["folder"], row["tags"], row["note"]) == ("tuned", "ft", ["ft"], "a fine-tune")
    resumed = ponder("train", "--resume", run, "--epochs", 2, "--tag", "more", "--amp", "--data-dir", tiny_mnist,
                     "-q", "--no-progress")
    assert resumed.exit_code == 0, resumed.output
    saved = json.loads((run / "config.json").read_text())
    assert saved["labels"] == {"name": "tuned", "tags": ["ft", "more"], "note": "a fine-tune"}
    assert load_checkpoint(run / "last.pt").run["labels"]["tags"] == ["ft", "more"]
    assert saved["init_from"]["checkpoint"] == str((tuned / "src" / "best.pt").resolve())


def test_runs_label_changes_labels_in_the_record_and_refuses_a_run_being_trained(tuned, tmp_path, ponder,
                                                                                 one_error_line):
    run = tmp_path / "ft"
    shutil.copytree(tuned / "ft", run)
    result = ponder("runs", "label", run, "--tag", "kept", "--untag", "ft", "--note", "new note", "-f", "json")
    assert _json(result)["buckets"][0]["tags"] == ["kept"]
    for path in (run / "last.pt", run / "best.pt"):
        assert load_checkpoint(path).run["labels"] == {"name": "tuned", "tags": ["kept"], "note": "new note"}
    assert json.loads((run / "config.json").read_text())["labels"]["note"] == "new note"
    assert _digest(run / "best.pt") == _digest(tuned / "ft" / "best.pt")  # nothing else changes
    shown = ponder("runs", tmp_path).stdout
    assert "ft" in shown and "tuned" in shown  # the folder, and its name beside it
    nothing = ponder("runs", "label", run)
    assert one_error_line(nothing) and nothing.exit_code == 2
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / ".ponder.lock").write_text(f"{sleeper.pid}\n")
        busy = ponder("runs", "label", run, "--tag", "x")
        assert str(sleeper.pid) in one_error_line(busy) and busy.exit_code == 1
    finally:
        sleeper.kill()
        sleeper.wait()
        os.unlink(run / ".ponder.lock")
    assert "x" not in json.loads((run / "config.json").read_text())["labels"]["tags"]


def test_a_run_at_chance_is_listed_so(tiny_mnist, tmp_path, ponder, monkeypatch):
    from ponder_cli import train

    monkeypatch.setattr(train, "at_chance", lambda *args: "the run sits at chance")
    result = ponder("train", *SMALL, "--epochs", 1, "--data-dir", tiny_mnist, "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert load_checkpoint(tmp_path / "run" / "last.pt").stop_reason == "at chance"
    assert _json(ponder("runs", tmp_path, "-f", "json"))["buckets"][0]["status"] == "at chance"
    assert "at chance" in _json(ponder("info", tmp_path / "run", "-f", "json"))["status"]


def test_listing_runs_and_models_imports_no_torch(tuned):
    """runs, models and diff read the record and the checkpoints' history (folders.peek_checkpoint),
    never their weights: no torch (seconds of start-up) for a listing."""
    for args in (["runs", tuned], ["models"], ["diff", tuned / "ft", tuned / "src"], ["runs", "rm", "--empty", "-y"]):
        code = ("import sys; from ponder_cli.cli import app\n"
                f"try: app({[str(a) for a in args]!r} + ['-f', 'json'], prog_name='ponder')\n"
                "except SystemExit as done: print(done.code, 'torch' in sys.modules, file=sys.stderr)\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tuned)
        assert done.stderr.splitlines()[-1] == "0 False", (args, done.stderr)
