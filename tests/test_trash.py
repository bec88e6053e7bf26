"""The trash of `ponder runs rm`: it holds only what `--restore` and `--empty` reach, `--empty`
deletes only what the folders named hold in their own trash (no link followed) and asks first,
an interrupted `--empty` says how many went, and `rm` and a starting `--resume` never both win.
Listing runs follows no link either."""

import errno
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

import processes
from ponder_cli.checkpoint import load_checkpoint
from ponder_cli.folders import trash_entries, trashed


def _run(folder: Path, checkpoint: str = "last.pt") -> Path:
    """A run folder as `ponder runs rm` sees one (it holds a checkpoint), with a file of bytes."""
    folder.mkdir(parents=True)
    (folder / checkpoint).write_bytes(b"weights " * 100)
    return folder


def _files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_empty_in_a_folder_holding_only_a_link_to_another_project_deletes_nothing(tmp_path, ponder, monkeypatch):
    other = tmp_path / "other"
    _run(other / "runs" / "a")
    monkeypatch.chdir(other)
    assert ponder("runs", "rm", "runs/a").exit_code == 0
    held = _files(other / "runs" / ".trash")
    project = tmp_path / "project"
    project.mkdir()
    (project / "link").symlink_to(other)
    monkeypatch.chdir(project)
    for args in ((), ("--yes",), (".", "--yes")):
        result = ponder("runs", "rm", "--empty", *args)
        assert result.exit_code == 0 and "nothing deleted" in result.stdout, result.output
    assert _files(other / "runs" / ".trash") == held
    assert ponder("runs", "-f", "json").stdout.count('"run"') == 0  # nor is its run listed as ours


def test_empty_empties_the_named_folders_own_trash_never_one_below_nor_through_a_link(tmp_path, ponder,
                                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    for run in ("runs/a", "runs/sweep/b", "c"):
        _run(tmp_path / run)
        assert ponder("runs", "rm", run).exit_code == 0
    elsewhere = tmp_path / "elsewhere"
    _run(elsewhere / "kept" / "run")
    (elsewhere / "kept" / "trashed.json").write_text(json.dumps({"original": str(tmp_path / "runs" / "x")}))
    (tmp_path / "runs" / ".trash" / "x.20260101T000000.000000Z").symlink_to(elsewhere / "kept")  # no entry of ours
    report = _json(ponder("runs", "rm", "--empty", "--yes", "-f", "json"))
    assert sorted(row["run"] for row in report["buckets"]) == ["c", "runs/a"]
    assert all(row["bytes"] > 800 for row in report["buckets"])  # each with its size, and their sum
    assert report["bytes"] == sum(row["bytes"] for row in report["buckets"])
    assert (elsewhere / "kept" / "run" / "last.pt").is_file()  # the link was not deleted into
    assert [trashed(entry)["run"] for entry in trash_entries(tmp_path / "runs" / "sweep" / ".trash")] == \
        ["runs/sweep/b"]
    table = ponder("runs", "rm", "--empty", "--yes")
    assert "runs/sweep/.trash" in table.stdout and "ponder runs rm --empty runs/sweep" in table.stdout
    (tmp_path / "runs" / "sweep" / "more").mkdir()
    report = _json(ponder("runs", "rm", "--empty", "--yes", "runs/sweep", "-f", "json"))
    assert [row["run"] for row in report["buckets"]] == ["runs/sweep/b"]
    # a trash that is a link is never entered
    _run(elsewhere / "proj" / ".trash" / "d.1" / "run")
    (elsewhere / "proj" / ".trash" / "d.1" / "trashed.json").write_text(json.dumps({"original": "d"}))
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / ".trash").symlink_to(elsewhere / "proj" / ".trash")
    assert "nothing deleted" in ponder("runs", "rm", "--empty", "--yes", "linked").stdout
    assert (elsewhere / "proj" / ".trash" / "d.1" / "run" / "last.pt").is_file()


def test_empty_lists_and_asks_on_a_terminal_and_elsewhere_needs_yes(tmp_path, ponder, one_error_line, monkeypatch):
    from ponder_cli.cli import evaluation

    monkeypatch.chdir(tmp_path)
    for run in ("runs/a", "runs/b"):
        _run(tmp_path / run)
        assert ponder("runs", "rm", run).exit_code == 0
    before = _files(tmp_path / "runs" / ".trash")
    refused = ponder("runs", "rm", "--empty")  # no terminal here
    assert "--yes" in one_error_line(refused) and refused.exit_code == 2
    assert _files(tmp_path / "runs" / ".trash") == before
    assert one_error_line(ponder("runs", "rm", "--yes", "runs/a")).count("--empty")  # --yes alone means nothing

    monkeypatch.setattr(evaluation, "on_a_terminal", lambda: True)
    from typer.testing import CliRunner
    from ponder_cli.cli import app

    declined = CliRunner().invoke(app, ["runs", "rm", "--empty"], input="n\n")
    assert declined.exit_code == 0 and "nothing deleted" in declined.stdout, declined.output
    assert "runs/a" in declined.stderr and "runs/b" in declined.stderr and " B" in declined.stderr
    assert _files(tmp_path / "runs" / ".trash") == before
    agreed = CliRunner().invoke(app, ["runs", "rm", "--empty", "-f", "json"], input="y\n")
    assert agreed.exit_code == 0, agreed.output
    report = json.loads(agreed.stdout[agreed.stdout.index("{"):])  # after the answer, which the runner echoes
    assert sorted(row["run"] for row in report["buckets"]) == ["runs/a", "runs/b"]
    assert not (tmp_path / "runs" / ".trash").exists()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_an_interrupted_empty_says_how_many_were_deleted(tmp_path, ponder, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for n in range(5):
        _run(tmp_path / "runs" / f"r{n}")
        assert ponder("runs", "rm", f"runs/r{n}").exit_code == 0

    def empty_terminated_at_the_second():
        from ponder_cli import folders
        real, calls = shutil.rmtree, []

        def rmtree(path, *args, **kwargs):
            if Path(path).parent.name == ".trash":  # an entry's last call
                calls.append(path)
                if len(calls) == 2:
                    os.kill(os.getpid(), signal.SIGTERM)  # held until this entry is gone
            return real(path, *args, **kwargs)
        monkeypatch.setattr(folders.shutil, "rmtree", rmtree)
        processes.run_cli(["runs", "rm", "--empty", "--yes"])

    with processes.fork(empty_terminated_at_the_second, cwd=tmp_path) as proc:
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "Traceback" not in stderr, stderr
    last = stderr.splitlines()[-1]
    assert last.startswith("Terminated:") and "2 of 5" in last and "nothing was written" not in last
    left = trash_entries(tmp_path / "runs" / ".trash")
    assert len(left) == 3 and len(list((tmp_path / "runs" / ".trash").iterdir())) == 3  # each whole


def test_rm_refuses_links_and_what_is_in_a_trash(tmp_path, ponder, one_error_line, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run(tmp_path / "runs" / "a")
    (tmp_path / "runs" / "b").symlink_to("a")  # a relative link: moved, it would point nowhere
    line = one_error_line(ponder("runs", "rm", "runs/b"))
    assert "link" in line and not (tmp_path / "runs" / ".trash").exists()
    assert ponder("runs", "rm", "runs/a").exit_code == 0
    entry = trash_entries(tmp_path / "runs" / ".trash")[0]
    for inside in (entry / "run", entry):
        assert "trash" in one_error_line(ponder("runs", "rm", inside))
    assert trashed(entry)["run"] == "runs/a" and len(list((tmp_path / "runs" / ".trash").iterdir())) == 1


def test_rm_checks_every_run_named_before_any_moves(tmp_path, ponder, one_error_line, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run(tmp_path / "runs" / "a")
    _run(tmp_path / "other" / "b")
    (tmp_path / "other" / ".trash").write_text("a file of the user's\n")  # no trash of ponder's
    line = one_error_line(ponder("runs", "rm", "runs/a", "other/b"))
    assert ".trash" in line
    assert (tmp_path / "runs" / "a" / "last.pt").is_file() and not (tmp_path / "runs" / ".trash").exists()


def test_rm_latest_is_the_newest_run_as_other_commands_take_it(tmp_path, ponder, monkeypatch):
    monkeypatch.chdir(tmp_path)
    old, new = _run(tmp_path / "runs" / "old"), _run(tmp_path / "runs" / "new")
    os.utime(old / "last.pt", (1e9, 1e9))
    report = _json(ponder("runs", "rm", "latest", "-f", "json"))
    assert [row["run"] for row in report["buckets"]] == ["runs/new"] and not new.exists() and old.is_dir()


def test_a_name_too_long_with_the_time_is_shortened_and_still_restored(tmp_path, ponder, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = "r" * 250
    before = _files(_run(tmp_path / "runs" / name))
    assert ponder("runs", "rm", f"runs/{name}").exit_code == 0
    (entry,) = trash_entries(tmp_path / "runs" / ".trash")
    assert len(os.fsencode(entry.name)) <= 255 and entry.name.startswith("rrr")
    assert ponder("runs", "rm", "--restore", f"runs/{name}").exit_code == 0
    assert _files(tmp_path / "runs" / name) == before and not (tmp_path / "runs" / ".trash").exists()


@pytest.mark.parametrize("fails", ["note", "move"])
def test_a_move_that_fails_leaves_no_entry(fails, tmp_path, ponder, one_error_line, monkeypatch):
    from ponder_cli import folders

    monkeypatch.chdir(tmp_path)
    before = _files(_run(tmp_path / "runs" / "a"))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(*((folders, "replace_atomically") if fails == "note" else (folders.os, "rename")), full)
    assert "No space left" in one_error_line(ponder("runs", "rm", "runs/a"))
    assert not (tmp_path / "runs" / ".trash").exists() and _files(tmp_path / "runs" / "a") == before
    assert not (tmp_path / "runs" / "a" / ".ponder.lock").exists()


def test_restore_by_entry_names_the_path_taken(tmp_path, ponder, error, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run(tmp_path / "runs" / "a")
    entry = Path(_json(ponder("runs", "rm", "runs/a", "-f", "json"))["buckets"][0]["trash"])
    (tmp_path / "runs" / "a").mkdir()  # taken again
    error(ponder("runs", "rm", "--restore", entry), 1, "runs/a", entry)


def test_listing_follows_no_link(tmp_path, ponder, monkeypatch):
    other = tmp_path / "other"
    _run(other / "runs" / "theirs")
    project = tmp_path / "project"
    _run(project / "runs" / "a")
    (project / "runs" / "again").symlink_to("a")  # the same run through a link
    (project / "mirror").symlink_to(other)  # another project's runs
    monkeypatch.chdir(project)
    assert [row["run"] for row in _json(ponder("runs", "-f", "json"))["buckets"]] == ["runs/a"]


def test_a_run_in_a_hidden_folder_is_listed_when_named_and_training_says_how(tmp_path, ponder, tiny_mnist, quick,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    trained = ponder("train", *quick, "--data-dir", tiny_mnist, "--no-progress", "--out", ".exp/run1")
    assert trained.exit_code == 0, trained.output
    assert "ponder runs .exp" in trained.stderr
    assert [row["run"] for row in _json(ponder("runs", ".exp", "-f", "json"))["buckets"]] == [".exp/run1"]


# rm and a starting resume: one lock, taken before either reads --------------------------------

def _resumable(runs, folder: Path) -> dict:
    shutil.copytree(runs / "pn1", folder)  # 2 of 2 epochs: resumed with --epochs 3
    return _files(folder)


def _resume(folder: Path, tiny_mnist) -> list:
    return ["train", "--resume", str(folder), "--epochs", "3", "--data-dir", str(tiny_mnist), "--no-progress"]


def _nothing_lost(folder: Path, before: dict, rm, resume) -> str:
    """Either wins, never both: the run is whole in its folder or in the trash, with every epoch."""
    (rm_code, rm_err), (resume_code, resume_err) = rm, resume
    if rm_code == 0:  # in the trash: the run as it was, or as the resume left it once finished
        assert not folder.exists(), resume_err
        (entry,) = trash_entries(folder.parent / ".trash")
        kept = entry / "run"
        if resume_code == 0:
            assert load_checkpoint(kept / "last.pt").epoch == 3 and (kept / "best.pt").is_file()
            return "resume, then rm"
        assert _files(kept) == before and resume_err.count("Error") == 1, resume_err
        return "rm; resume refused"
    assert "Error" in rm_err and resume_code == 0, (rm_err, resume_err)
    assert load_checkpoint(folder / "last.pt").epoch == 3 and (folder / "best.pt").is_file()
    assert len((folder / "metrics.csv").read_text().splitlines()) == 4  # a header and every epoch
    assert not (folder.parent / ".trash").exists()
    return "resume; rm refused"


def test_rm_while_a_resume_reads_its_run_is_refused(runs, tiny_mnist, tmp_path):
    """rm lands inside the resume's window (between reading the checkpoint and writing the
    folder, as the data loads): the resume holds the run's lock already, so rm is refused."""
    folder = tmp_path / "runs" / "r"
    before = _resumable(runs, folder)
    said = tmp_path / "rm.json"

    def resume_with_rm_meanwhile():
        from ponder_cli.api import training
        real = training.resolve_data_dir

        def loading(*args, **kwargs):
            with processes.ponder("runs", "rm", folder, cwd=tmp_path) as rm:
                said.write_text(json.dumps([rm.wait(60), rm.communicate()[1]]))
            return real(*args, **kwargs)
        training.resolve_data_dir = loading
        processes.run_cli(_resume(folder, tiny_mnist))

    with processes.fork(resume_with_rm_meanwhile, cwd=tmp_path) as resume:
        _, resume_err = resume.communicate(timeout=120)
    rm_code, rm_err = json.loads(said.read_text())
    assert rm_code != 0 and f"PID {resume.pid}" in rm_err, rm_err
    assert _nothing_lost(folder, before, (rm_code, rm_err), (resume.returncode, resume_err)) == "resume; rm refused"


MOMENTS = int(os.environ.get("PONDER_RACE_MOMENTS", "4"))
# fresh interpreters, as a user's commands start (torch imported in each: ~2 s before the resume
# reads its run), rm at moments from 0 to 3 s; else forked ones (tests/processes.py), whose resume
# is read and done within half a second, rm at moments over that
FRESH = os.environ.get("PONDER_RACE_FRESH") == "1"


def _start(args: list, cwd: Path):
    if not FRESH:
        return processes.ponder(*args, cwd=cwd)
    import subprocess
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-m", "ponder_cli", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(60 * MOMENTS if FRESH else 240)  # the full check takes minutes on a busy machine
def test_rm_and_a_starting_resume_never_both_win(runs, tiny_mnist, tmp_path):
    """`ponder runs rm` started at MOMENTS moments after a `--resume` of the same run starts:
    whichever wins, the run is whole. The full check (docs/reliability.md):
    PONDER_RACE_FRESH=1 PONDER_RACE_MOMENTS=20 pytest tests/test_trash.py -k never_both_win -s"""
    span = 3.0 if FRESH else 0.45
    outcomes = []
    for i in range(MOMENTS):
        moment = span * i / max(1, MOMENTS - 1)
        folder = tmp_path / f"t{i}" / "runs" / "r"
        before = _resumable(runs, folder)
        with _start(_resume(folder, tiny_mnist), folder.parent.parent) as resume:
            time.sleep(moment)
            with _start(["runs", "rm", folder], folder.parent.parent) as rm:
                rm_out = (rm.wait(120), rm.communicate(timeout=60)[1])
            resume_out = (resume.wait(180), resume.communicate(timeout=60)[1])
        outcomes.append((round(moment, 2), _nothing_lost(folder, before, rm_out, resume_out)))
    print(outcomes)
