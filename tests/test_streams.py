"""The standard streams at the CLI's edge: results need a stdout, a reader that leaves ends the
command quietly (exit 141), and losing stderr never stops training."""

import csv
import io
import json
import os
import subprocess
import sys

import pytest

from ponder_cli.checkpoint import load_checkpoint
from ponder_cli.cli.app import READER_GONE, Chatter

import processes

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX pipes and descriptors")

CODE = "import sys; from ponder_cli.cli import app; app(sys.argv[1:], prog_name='ponder')"
PONDER = [sys.executable, "-c", CODE]
TRAIN = ["train", "--epochs", "3", "--max-steps", "2", "--val-size", "100", "--train-size", "200",
         "--batch-size", "100", "--no-progress"]


def _in_shell(redirect: str, args: list) -> subprocess.CompletedProcess:
    """Run ponder under bash with `redirect` applied, e.g. '>&-' (stdout closed)."""
    return subprocess.run(["bash", "-c", f'"$@" {redirect}', "ponder", *PONDER, *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_training_goes_on_when_its_reader_leaves_after_one_line(tiny_mnist, tmp_path):
    """`ponder train ... 2>&1 | head -1`: every epoch trained and saved, then a quiet exit 141
    when the summary finds no reader."""
    read_end, write_end = os.pipe()
    out = tmp_path / "run"
    with processes.ponder(*TRAIN, "--data-dir", tiny_mnist, "--out", out, stdout=write_end,
                          stderr=write_end) as trainer:
        os.close(write_end)
        while os.read(read_end, 1) != b"\n":  # head -1 reads its line and leaves
            pass
        os.close(read_end)
        assert trainer.wait(timeout=120) == READER_GONE
    assert sorted(p.name for p in out.iterdir()) == ["best.pt", "config.json", "config.toml", "environment.json", "last.pt", "metrics.csv"]
    assert load_checkpoint(out / "last.pt").epoch == 3
    assert [row["epoch"] for row in _rows(out / "metrics.csv")] == ["1", "2", "3"]


def test_a_jsonl_reader_that_leaves_stops_training_as_an_interrupt_does(tiny_mnist, tmp_path):
    """`ponder train -f jsonl | head -1` (or a jq with a typo): the run stops at its next record,
    saved, with one line naming the epoch and how to resume, exit 141; the run is interrupted."""
    from ponder_cli.api import list_runs, run_info

    read_end, write_end = os.pipe()
    out = tmp_path / "run"
    with processes.ponder(*TRAIN, "--epochs", "50", "--patience", "0", "-f", "jsonl", "--data-dir", tiny_mnist,
                          "--out", out, stdout=write_end) as trainer:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as reader:  # head -1 reads its line and leaves
            first = json.loads(reader.readline())
        _, stderr = trainer.communicate(timeout=120)
    assert first["record"] == "epoch" and first["epoch"] == 1
    assert trainer.returncode == READER_GONE and "Traceback" not in stderr
    epoch = load_checkpoint(out / "last.pt").epoch
    assert 1 < epoch < 50
    assert stderr.splitlines()[-1] == (f"stdout closed: epoch {epoch} is saved in {out / 'last.pt'}; resume with: "
                                       f"ponder train --resume {out / 'last.pt'}")
    assert run_info(out).meta["status"].startswith(f"interrupted after epoch {epoch} of 50")
    assert [row["status"] for row in list_runs([tmp_path]).rows] == ["interrupted"]


def _started_with_stderr_closed(args: list) -> None:
    """As an interpreter starts under `2>&-`: no file descriptor 2, and sys.stderr None."""
    os.close(2)
    sys.stderr = sys.__stderr__ = None
    try:
        processes.run_cli(args)
    finally:  # an interpreter's own ending skips a stderr of None; the fork's flushes one
        sys.stderr = open(os.devnull, "w")


def test_training_with_stderr_closed_trains_and_reports(tiny_mnist, tmp_path):
    out = tmp_path / "run"
    with processes.fork(_started_with_stderr_closed, [*map(str, TRAIN), "--data-dir", str(tiny_mnist), "--out",
                                                      str(out)]) as proc:
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0 and stderr == ""
    assert str(out / "best.pt") in stdout
    assert load_checkpoint(out / "last.pt").epoch == 3 and len(_rows(out / "metrics.csv")) == 3


@pytest.mark.parametrize("args", [["extrapolate", "--angles", "10"], ["train", *TRAIN[1:]]],
                         ids=["extrapolate", "train"])
def test_a_closed_stdout_is_refused_before_any_work(args, checkpoint, tiny_mnist, tmp_path, error):
    """`ponder extrapolate >&-` used to lose its results and exit 0."""
    where = [checkpoint] if args[0] == "extrapolate" else ["--out", tmp_path / "run"]
    done = _in_shell(">&-", [*args, *where, "--data-dir", tmp_path / "no-mnist", "--no-download"])
    error(done, 1, "standard output", "/dev/null")
    assert len(done.stderr.splitlines()) == 1  # that line alone
    assert not (tmp_path / "run").exists()


def test_a_stdout_open_for_reading_only_is_refused(checkpoint, tmp_path, error):
    error(_in_shell("1</dev/null", ["eval", checkpoint]), 1, "standard output")


def test_a_reader_gone_before_the_results_ends_quietly(checkpoint, tiny_mnist):
    """`ponder ... | head` where head has left: exit 141 and no message, whatever the format
    (a table, CSV and JSON)."""
    commands = [["extrapolate", "--angles", "10", "20"], ["sweep", "--to", "20", "-f", "csv"], ["eval", "-f", "json"]]
    for args in commands:
        read_end, write_end = os.pipe()
        os.close(read_end)  # nobody will ever read: the first write of results fails with EPIPE
        with processes.ponder(*args, checkpoint, "--data-dir", tiny_mnist, "-q", stdout=write_end) as command:
            os.close(write_end)
            assert command.communicate(timeout=120) == (None, ""), args
            assert command.returncode == READER_GONE, args


class _Gone(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_chatter_drops_what_it_cannot_write_and_goes_on():
    chatter = Chatter(_Gone())
    assert chatter.write("epoch 1\n") == 8 and chatter.lost
    chatter.write("epoch 2\n")
    chatter.flush()
    assert not chatter.isatty() and chatter.encoding == "utf-8"
    with pytest.raises(TypeError):
        chatter.write(b"")  # a text stream, as click's probe expects
    alive = io.StringIO()
    Chatter(alive).write("using x\n")
    assert alive.getvalue() == "using x\n"


# Output in an encoding short of UTF-8 -----------------------------------------------------------

def test_text_is_spelled_in_ascii_only_where_the_encoding_lacks_a_character():
    from ponder_cli.render import spelling_for

    def stream(encoding):
        return io.TextIOWrapper(io.BytesIO(), encoding=encoding)

    text = "±22.5° · steps ✓ / ✗ · ρ → █▅▁ ★ ☃"
    assert spelling_for(stream("utf-8"))(text) == text
    assert spelling_for(stream("ascii"))(text) == "+-22.5 deg - steps ok / x - rho -> @+. * ?"
    assert spelling_for(stream("latin-1"))(text) == "±22.5° · steps ok / x · rho -> @+. * ?"


def _png(path):
    from PIL import Image
    Image.new("L", (28, 28)).save(path)
    return path


ENCODED = {  # every command that prints results, on the shipped models, as small as it goes
    "eval": lambda data, tmp: ["eval", "--limit", 20, "--data-dir", data],
    "extrapolate": lambda data, tmp: ["extrapolate", "align", "--limit", 20, "--data-dir", data],
    "sweep": lambda data, tmp: ["sweep", "--every", 90, "--limit", 20, "--data-dir", data],
    "compare": lambda data, tmp: ["compare", "reference", "align", "--angles", 45, "--limit", 20, "--data-dir", data],
    "calibrate": lambda data, tmp: ["calibrate", "parity16", "--limit", 2],
    "predict": lambda data, tmp: ["predict", "align", _png(tmp / "digit.png"), "--steps"],
    "info": lambda data, tmp: ["info", "parity16-extrapolation-act"],
    "models": lambda data, tmp: ["models"],
    "train": lambda data, tmp: ["train", "--task", "parity", "--elems", 4, "--epochs", 1, "--batches-per-epoch", 2,
                                "--batch-size", 8, "--out", tmp / "run"],
}


# JSON is ASCII whatever the encoding: latin-1 would repeat the ascii case
@pytest.mark.parametrize("fmt,encoding", [("table", "ascii"), ("table", "latin-1"), ("json", "ascii"),
                                          ("csv", "ascii"), ("csv", "latin-1")])
@pytest.mark.parametrize("command", list(ENCODED))
def test_every_command_and_format_writes_to_a_narrow_encoding(command, fmt, encoding, tiny_mnist, tmp_path):
    from typer.testing import CliRunner

    from ponder_cli.cli import app

    args = [str(a) for a in ENCODED[command](tiny_mnist, tmp_path)]
    result = CliRunner(charset=encoding).invoke(app, [*args, "-f", fmt])
    assert result.exit_code == 0, result.output
    assert result.exception is None and "Traceback" not in result.output
    assert result.stdout.strip()
    if encoding == "ascii":
        assert result.stdout_bytes.isascii()


def test_a_real_ascii_stdout_gets_ascii_tables_and_sparklines(tiny_mnist):
    def ascii_stdout(args):  # as an interpreter starts under PYTHONIOENCODING=ascii
        sys.stdout = sys.__stdout__ = open(1, "w", closefd=False, encoding="ascii")
        for extra in (["-f", "csv"], []):  # CSV, a line between, then the table
            try:
                processes.run_cli(args + extra)
            except SystemExit as done:
                assert not done.code, done.code
            print("-- next --", flush=True)

    with processes.fork(ascii_stdout, ["eval", "--limit", "20", "--data-dir", str(tiny_mnist)]) as proc:
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "Traceback" not in stderr, stderr
    assert stdout.isascii()
    as_csv, table, _ = stdout.split("-- next --\n")
    spark = list(csv.DictReader(io.StringIO(as_csv)))[0]["halting_spark"]
    assert spark and set(spark) <= set(" .:-=+*#@")
    # the sparkline's legend in the same ASCII levels as its cells
    assert "+-" in table and all(level in table.split("each step:")[1] for level in ("@", "."))
