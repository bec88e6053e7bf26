"""Bad input, crashes, interrupts, non-finite losses, untrusted checkpoints, determinism."""

import errno
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ponder_cli import PonderError
from ponder_cli.checkpoint import load_checkpoint, load_model, save_checkpoint
from ponder_cli.config import PonderConfig
from ponder_cli.tasks.mnist import load_mnist, train_val_split
from ponder_cli.model import PonderNetMethod, geometric_log_prior, ponder_loss
from ponder_cli.train import train

import processes

TINY = ["--val-size", "100", "--max-steps", "3", "--batch-size", "64"]


@pytest.fixture
def invoke(ponder):
    return ponder


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory, write_idx):
    """Data directories whose IDX files are truncated or have the wrong magic number."""
    root = tmp_path_factory.mktemp("bad")
    for name, damage in (("truncated", lambda b: b[:-100]), ("magic", lambda b: b"\x00\x00\x09\x03" + b[4:])):
        raw = root / name / "MNIST" / "raw"
        raw.mkdir(parents=True)
        images = torch.zeros(50, 28, 28, dtype=torch.uint8)
        write_idx(raw / "train-images-idx3-ubyte", images)
        write_idx(raw / "train-labels-idx1-ubyte", torch.zeros(50, dtype=torch.uint8))
        for prefix in ("train", "t10k"):
            for kind in ("images-idx3", "labels-idx1"):
                path = raw / f"{prefix}-{kind}-ubyte"
                if not path.exists():
                    path.write_bytes((raw / f"train-{kind}-ubyte").read_bytes())
        image_file = raw / "train-images-idx3-ubyte"
        image_file.write_bytes(damage(image_file.read_bytes()))
    (root / "a_file").write_text("not a directory")
    raw = root / "empty" / "MNIST" / "raw"  # well-formed IDX files of zero images
    raw.mkdir(parents=True)
    for prefix in ("train", "t10k"):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", torch.zeros(0, 28, 28, dtype=torch.uint8))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", torch.zeros(0, dtype=torch.uint8))
    raw = root / "folder" / "MNIST" / "raw"  # a folder where an IDX file belongs
    shutil.copytree(root / "magic" / "MNIST" / "raw", raw)
    (raw / "train-images-idx3-ubyte").unlink()
    (raw / "train-images-idx3-ubyte").mkdir()
    return root


# the setting and the value given, or the range allowed (--epochs 0, --lambda-p 2, --device tpu: test_cli.py)
TRAIN_ERRORS = [
    (["--batch-size", "0"], ["batch-size", "0"]),
    (["--max-steps", "-1"], ["max-steps", "-1", "100"]),
    (["--lambda-p", "0"], ["lambda-p", "(0, 1]"]),
    (["--beta", "-0.1"], ["beta", "0"]),
    (["--lr", "0"], ["lr", "0"]),
    (["--lr", "nan"], ["lr", "finite"]),
    (["--halting-bias", "1e39"], ["halting-bias", "3.4e+38", "1e+39"]),
    (["--beta", "1e39"], ["beta", "3.4e+38"]),
    (["--device", "cuda"], ["CUDA"]),
    (["--device", "meta"], ["'meta'"]),
    (["--device", "cpu:1"], ["cpu:1", "--device cpu"]),
    (["--max-steps", "1000"], ["max-steps", "1000", "100"]),
    (["--train-rotation", "720"], ["train-rotation", "720", "180"]),
    (["--seed", "99999999999999999999"], ["seed", "2**63 - 1"]),
    (["--seed", "-1"], ["seed", "-1", "2**63 - 1"]),
]


@pytest.mark.parametrize("args,named", TRAIN_ERRORS, ids=[" ".join(a) for a, _ in TRAIN_ERRORS])
def test_bad_train_options(args, named, tiny_mnist, tmp_path, invoke, error):
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    out = tmp_path / "out"
    error(invoke("train", *args, "--data-dir", tiny_mnist, "--out", out), 1 if "cuda" in args else 2, *named)
    assert not out.exists()  # nothing written


@pytest.mark.parametrize("case,fragment", [
    ("missing", "MNIST not found"), ("truncated", "truncated"), ("magic", "bad magic number"),
    ("a_file", "not a directory"), ("empty", "holds no images"),
    ("folder", "train-images-idx3-ubyte is a directory, not an IDX file"),
])
def test_bad_data_directories(case, fragment, bad_data, tmp_path, invoke, one_error_line):
    out = tmp_path / "out"
    line = one_error_line(invoke("train", "--no-download", "--data-dir", bad_data / case, "--out", out))
    assert fragment in line
    assert not out.exists()


def test_unwritable_out(tiny_mnist, tmp_path, invoke, one_error_line):
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = one_error_line(invoke("train", "--epochs", 1, *TINY, "--data-dir", tiny_mnist, "--out", blocker / "sub"))
    assert "cannot write checkpoints" in line and str(blocker / "sub") in line


EVAL_ERRORS = [  # (--seed -1: test_cli.py)
    (["--angles", "nan"], ["--angles", "finite"]), (["--angles", "inf"], ["--angles", "finite"]),
    (["--angles", "-inf"], ["--angles", "finite"]), (["--angles", "abc"], ["--angles", "'abc'"]),
    (["--angles", "200"], ["--angles", "200", "180"]), (["--angles", "--format", "json"], ["'--angles'"]),
    (["--format", "xml"], ["'xml'"]), (["--seed", "99999999999999999999"], ["--seed", "2**63 - 1"]),
]


@pytest.mark.parametrize("args,named", EVAL_ERRORS, ids=[" ".join(a) for a, _ in EVAL_ERRORS])
def test_bad_extrapolate_options(args, named, checkpoint, tiny_mnist, invoke, error):
    error(invoke("extrapolate", checkpoint, *args, "--data-dir", tiny_mnist), 2, *named)


@pytest.mark.parametrize("content,fragment", [
    (None, "holds no best.pt"), (b"", "is an empty file, not a ponder_cli checkpoint"),
    (b"step,loss\n1,0.5\n", "is a text file, not a ponder_cli checkpoint"), (b"\x80\x04garbage", "not a readable"),
])
def test_bad_checkpoint_files(content, fragment, tmp_path, tiny_mnist, invoke, one_error_line):
    path = tmp_path / "ck.pt"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    line = one_error_line(invoke("eval", path, "--data-dir", tiny_mnist))
    assert fragment in line and str(path) in line


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
@pytest.mark.parametrize("command", [["eval"], ["info"], ["train", "--resume"]])
def test_a_pipe_or_a_device_as_checkpoint_is_named_for_what_it_is(command, tmp_path, tiny_mnist, invoke, error):
    fifo = tmp_path / "pipe.pt"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "named pipe"), (Path(os.devnull), "character device")):
        error(invoke(*command, path), 1, path, kind)
    # the library's own loader says so too, rather than wait for a writer on the pipe
    with pytest.raises(PonderError, match="named pipe"):
        load_checkpoint(fifo)


def test_long_messages_are_cut_at_a_word():
    from ponder_cli import brief

    assert brief("a " * 200, limit=20) == "a a a a a a a a a a…"
    assert brief(RuntimeError("First sentence here. Second one\n  with  spaces.")) == "First sentence here."
    assert brief(ValueError()) == "ValueError"


@pytest.mark.parametrize("command", ["eval", "compare"])
def test_bad_seed_for_evaluation(command, checkpoint, tiny_mnist, invoke, error):
    error(invoke(command, checkpoint, "--seed", 2 ** 63, "--data-dir", tiny_mnist), 2, "--seed", 2 ** 63)


@pytest.mark.parametrize("mutate,fragment", [
    (lambda c: c.pop("model"), "missing model"),
    (lambda c: c["config"].update(max_steps=0), "incompatible config"),
    (lambda c: c["config"].update(colour="red"), "incompatible config"),
    (lambda c: c["config"].update(hidden=32), "weights do not match"),
    (lambda c: c.update(version=99), "format version 99"),
])
def test_inconsistent_checkpoints(mutate, fragment, checkpoint, tmp_path):
    ckpt = torch.load(checkpoint, weights_only=True)
    mutate(ckpt)
    path = tmp_path / "odd.pt"
    torch.save(ckpt, path)
    with pytest.raises(PonderError, match=fragment) as err:
        load_model(path, "cpu")
    assert str(path) in str(err.value)


def test_checkpoint_with_code_is_refused_from_the_cli(evil_checkpoint, tiny_mnist, invoke, one_error_line):
    path, marker = evil_checkpoint
    line = one_error_line(invoke("extrapolate", path, "--angles", 10, "--data-dir", tiny_mnist))
    assert "refused" in line
    assert not marker.exists()


# --- resume -------------------------------------------------------------------------------------

def test_resume_with_contradicting_options_is_refused(checkpoint, tiny_mnist, tmp_path, invoke, one_error_line):
    last = checkpoint.parent / "last.pt"
    line = one_error_line(invoke("train", "--resume", last, "--max-steps", 7, "--data-dir", tiny_mnist))
    assert "--max-steps 7 (checkpoint: 5)" in line


def test_resume_from_the_cli_continues_at_the_next_epoch(checkpoint, tiny_mnist, tmp_path, invoke):
    out = tmp_path / "run"
    out.mkdir()
    (out / "last.pt").write_bytes((checkpoint.parent / "last.pt").read_bytes())
    result = invoke("train", "--resume", out / "last.pt", "--epochs", 2, "--data-dir", tiny_mnist, "--no-progress")
    assert result.exit_code == 0, result.output
    assert "resuming after epoch 1" in result.stderr and "epoch  2/2" in result.stderr
    assert "epoch  1/2" not in result.stderr
    assert load_checkpoint(out / "last.pt").epoch == 2


def test_resuming_into_another_folder_brings_the_best_epoch_so_far(tiny_mnist, tmp_path, quick, invoke):
    """--resume A --out B: B's best.pt, printed and in the JSON, exists even when no resumed
    epoch beats the old best (a best accuracy of 1.0 here, which nothing beats)."""
    import dataclasses

    first = tmp_path / "first"
    result = invoke("train", *quick, "--epochs", 2, "--data-dir", tiny_mnist, "--out", first, "--no-progress")
    assert result.exit_code == 0, result.output
    state = load_checkpoint(first / "last.pt")

    def resume(best_epoch: int, out: Path):
        save_checkpoint(dataclasses.replace(state, best_accuracy=1.0, best_epoch=best_epoch), first / "last.pt")
        result = invoke("train", "--resume", first / "last.pt", "--out", out, "--epochs", 3, "--data-dir",
                        tiny_mnist, "--no-progress", "-f", "json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    # the resumed checkpoint is the best epoch itself (2 of 2): it is copied
    report = resume(2, tmp_path / "from-last")
    assert report["checkpoints"] == [str(tmp_path / "from-last" / "best.pt")] and report["best_epoch"] == 2
    assert load_checkpoint(tmp_path / "from-last" / "best.pt").epoch == 2
    # the best epoch (1) is the best.pt beside it: that file is copied
    save_checkpoint(dataclasses.replace(state, epoch=1, best_epoch=1), first / "best.pt")
    report = resume(1, tmp_path / "from-best")
    assert (tmp_path / "from-best" / "best.pt").read_bytes() == (first / "best.pt").read_bytes()
    assert report["checkpoints"] == [str(tmp_path / "from-best" / "best.pt")]
    # the best epoch's weights are nowhere: no best.pt is claimed
    (first / "best.pt").unlink()
    out = tmp_path / "nowhere"
    report = resume(1, out)
    assert report["checkpoints"] == [] and not (out / "best.pt").exists()
    result = invoke("train", "--resume", first / "last.pt", "--out", tmp_path / "again", "--epochs", 3,
                    "--data-dir", tiny_mnist, "--no-progress")
    assert result.stdout.splitlines()[-1] == (f"no best checkpoint in {tmp_path / 'again'}: no epoch of this run "
                                              f"beat epoch 1, whose weights were not found beside the checkpoint "
                                              f"resumed")


# --- numerical faults ---------------------------------------------------------------------------

CFG = PonderConfig.of(epochs=2, max_steps=3, batch_size=64, val_size=100, hidden=16, hidden_cnn=16, hidden_lin=16)


def _data(tiny_mnist):
    return train_val_split(load_mnist(tiny_mnist, train=True, download=False), val_size=100, train_size=0, seed=1)


def _poison(monkeypatch, every: int):
    """Make every `every`-th training loss NaN."""
    calls = {"n": 0}
    loss = PonderNetMethod.loss

    def poisoned(self, *args, **kwargs):
        parts = loss(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] % every == 0:
            return parts._replace(total=parts.total * float("nan"))
        return parts

    monkeypatch.setattr(PonderNetMethod, "loss", poisoned)


def test_non_finite_batches_are_skipped_and_counted(monkeypatch, tiny_mnist, tmp_path):
    _poison(monkeypatch, every=3)  # 600 images / 64 = 10 batches per epoch: 3 poisoned in each
    result = train(CFG, *_data(tiny_mnist), device=torch.device("cpu"), out_dir=tmp_path, progress=False)
    assert [h.skipped_batches for h in result.history] == [3, 3]
    assert all(torch.isfinite(p).all() for p in load_checkpoint(tmp_path / "best.pt").model.values())
    assert all(torch.isfinite(torch.tensor(h.train_loss)) for h in result.history)


def test_a_whole_non_finite_epoch_stops_training(monkeypatch, tiny_mnist, tmp_path):
    train(CFG.replace(epochs=1), *_data(tiny_mnist), device=torch.device("cpu"), out_dir=tmp_path, progress=False)
    before = (tmp_path / "best.pt").read_bytes()
    _poison(monkeypatch, every=1)
    with pytest.raises(PonderError, match="epoch 2: every batch had a non-finite loss"):
        train(CFG, *_data(tiny_mnist), device=torch.device("cpu"), out_dir=tmp_path, progress=False,
              resume=load_checkpoint(tmp_path / "last.pt"))
    assert (tmp_path / "best.pt").read_bytes() == before
    assert load_checkpoint(tmp_path / "last.pt").epoch == 1


def test_losses_finite_with_float16_underflow():
    # fp16 logits as autocast produces them; lambda ~ 1 at step 1 makes every later p_n underflow.
    lambda_logits = torch.full((20, 8), -30.0, dtype=torch.float16)
    lambda_logits[0, :4] = 60.0
    logits = (torch.randn(20, 8, 10) * 50).to(torch.float16).requires_grad_(True)
    lambda_logits.requires_grad_(True)
    parts = ponder_loss(logits, lambda_logits, torch.arange(8) % 10, geometric_log_prior(0.2, 20), beta=0.01)
    parts.total.backward()
    assert parts.total.dtype == torch.float32
    assert all(torch.isfinite(t) for t in parts)
    assert torch.isfinite(logits.grad).all() and torch.isfinite(lambda_logits.grad).all()


def test_best_is_not_overwritten_by_a_worse_model(tiny_mnist, tmp_path):
    cfg = CFG.replace(epochs=1)
    train_set, val_set = _data(tiny_mnist)
    first = train(cfg.replace(lr=3e-3), train_set, val_set, device=torch.device("cpu"), out_dir=tmp_path, progress=False)
    state = load_checkpoint(tmp_path / "last.pt")
    state.best_accuracy = 2.0  # no model can beat this
    save_checkpoint(state, tmp_path / "last.pt")
    best_before = (tmp_path / "best.pt").read_bytes()
    result = train(cfg.replace(epochs=2, lr=3e-3), train_set, val_set, device=torch.device("cpu"), out_dir=tmp_path,
                   progress=False, resume=load_checkpoint(tmp_path / "last.pt"))
    assert not result.history[-1].improved and first.history[0].improved
    assert (tmp_path / "best.pt").read_bytes() == best_before


# --- determinism --------------------------------------------------------------------------------

def test_same_seed_same_training_and_evaluation(tiny_mnist, tmp_path, invoke):
    runs = [train(CFG, *_data(tiny_mnist), device=torch.device("cpu"), out_dir=tmp_path / str(i), progress=False)
            for i in range(2)]
    assert runs[0].history[-1].train_loss == runs[1].history[-1].train_loss
    assert [h.val_accuracy for h in runs[0].history] == [h.val_accuracy for h in runs[1].history]
    a = [json.loads(invoke("eval", tmp_path / str(i) / "best.pt", "--rotation", 30, "-f", "json",
                           "--data-dir", tiny_mnist).stdout) for i in range(2)]
    assert a[0].pop("checkpoints") != a[1].pop("checkpoints")
    for report in a:
        report["buckets"][0].pop("checkpoint")
    assert a[0] == a[1] and 0 <= a[0]["buckets"][0]["accuracy"] <= 1


# --- crashes and interrupts ---------------------------------------------------------------------

# epochs of 200 images: short, so that a signal or a kill lands anywhere, saves included, and the tests that wait
# for epochs wait little
LONG_RUN = ["train", "--epochs", "500", "--val-size", "100", "--train-size", "200", "--max-steps", "2", "--batch-size",
            "100", "--no-progress", "--patience", "0"]


def _stop_line(stderr: str, headline: str, epoch: int, last: Path) -> None:
    """The last line of a stopped training: its kind, the epoch saved, and the command that resumes it."""
    line = stderr.splitlines()[-1]
    assert line.startswith(f"{headline}: ") and f"epoch {epoch} " in line and str(last) in line, line
    assert line.endswith(f"ponder train --resume {last}"), line


def _start_training(tiny_mnist: Path, out: Path, *more) -> processes.Process:
    return processes.ponder(*LONG_RUN, "--data-dir", tiny_mnist, "--out", out, *more)


def _wait_for(path: Path, proc: processes.Process, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)


def test_sigkill_never_leaves_a_broken_checkpoint(tiny_mnist, tmp_path):
    """Four runs of one folder: the first trains afresh, each next resumes where the last was
    killed (taking over its stale lock). Once a run has saved an epoch of its own, it is killed at
    a random moment (an epoch here takes ~0.1 s: kills land anywhere, saves included), and what
    it left must load."""
    out, rng, epochs = tmp_path / "run", random.Random(0), []
    for run in range(4):
        saved = (out / "last.pt").stat().st_mtime_ns if run else None
        where = ["--resume", out / "last.pt"] if run else ["--out", out, *LONG_RUN[1:]]
        with processes.ponder("train", *where, "--data-dir", tiny_mnist, "-q") as proc:
            deadline = time.monotonic() + 60
            while not (out / "last.pt").exists() or (out / "last.pt").stat().st_mtime_ns == saved:
                assert proc.poll() is None, (run, proc.communicate())
                assert time.monotonic() < deadline, f"run {run} saved no epoch"
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.3))
            proc.kill()
            assert proc.wait() == -signal.SIGKILL
        for name in ("last.pt", "best.pt"):
            model, cfg, state = load_model(out / name, "cpu")
            assert cfg.method.max_steps == 2 and state.epoch >= 1
        epochs.append(load_checkpoint(out / "last.pt").epoch)
    assert epochs == sorted(set(epochs)), epochs  # each run trained on from where the last was killed


def _hold_tqdms_lock() -> None:
    from tqdm import tqdm

    tqdm.get_lock().acquire()
    time.sleep(60)


def _make_a_bar() -> None:
    from tqdm import tqdm

    tqdm(range(3), disable=True).close()  # every epoch makes one, progress off or on


def test_a_child_killed_holding_tqdms_lock_stalls_no_other_process():
    """The kills above can land while a run holds tqdm's lock, a semaphore a fork would share:
    the next child, and this process, must not wait on it (a CI run once hung here for an hour)."""
    from tqdm import tqdm

    tqdm(disable=True).close()  # this process has made tqdm's lock, as the tests' trainings do
    with processes.fork(_hold_tqdms_lock) as holder:
        time.sleep(0.5)
        holder.kill()
    with processes.fork(_make_a_bar) as child:
        assert child.wait(timeout=20) == 0
    shared = type(tqdm.get_lock()).mp_lock  # the semaphore itself: its acquire says whether it got it
    assert shared.acquire(timeout=5)
    shared.release()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("sent,code,headline", [(signal.SIGINT, 130, "Interrupted"), (signal.SIGTERM, 143, "Terminated")])
def test_interrupt_saves_and_prints_the_resume_hint(sent, code, headline, tiny_mnist, tmp_path):
    """Ctrl-C and SIGTERM (kill, docker stop, schedulers) alike: the last epoch is saved, one line
    says which and how to resume, the lock is released; a jsonl stream ends with a record saying
    why it stopped."""
    out = tmp_path / "run"
    proc = _start_training(tiny_mnist, out, "-f", "jsonl")
    try:
        _wait_for(out / "last.pt", proc)
        time.sleep(0.3)
        proc.send_signal(sent)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr
    epoch = load_checkpoint(out / "last.pt").epoch
    # the message names the epoch on disk, also when the signal lands between saving and the epoch line
    assert epoch >= 1
    _stop_line(stderr, headline, epoch, out / "last.pt")
    records = [json.loads(line) for line in stdout.splitlines()]
    assert [r["record"] for r in records] == ["epoch"] * (len(records) - 1) + ["stopped"]
    assert records[-1] == {"format_version": 1, "record": "stopped", "command": "train", "why": headline.lower(),
                           "epoch": epoch, "checkpoint": str(out / "last.pt"),
                           "message": stderr.splitlines()[-1].removeprefix(f"{headline}: ")}
    assert not (out / ".ponder.lock").exists()
    # `ponder info` on the folder tells the interrupted run, and how to go on
    from ponder_cli.api import run_info
    info = run_info(out).meta
    assert info["status"].startswith(f"interrupted after epoch {epoch} of ") and info["epochs_trained"] == epoch
    assert info["status"].endswith(f"resume with: ponder train --resume {out / 'last.pt'}")


def _signal_self_when(module, name: str, *signals):
    """Patch module.name (in the forked child alone) to send this process `signals` the first
    time it is called, then do what it did."""
    real = getattr(module, name)
    sent = []

    def signalling(*args, **kwargs):
        if not sent:
            sent.append(True)
            for signum in signals:
                os.kill(os.getpid(), signum)
        return real(*args, **kwargs)

    setattr(module, name, signalling)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_signals_while_an_interrupt_unwinds_are_ignored(tiny_mnist, tmp_path):
    """A second Ctrl-C (or torchrun's SIGTERM after one) while the first unwinds: still the first's
    one line and status, no traceback. They arrive here as the resume hint is being worked out."""
    from ponder_cli.runs import RunFolder
    out = tmp_path / "run"

    def train_twice_signalled():
        _signal_self_when(RunFolder, "resume_hint", signal.SIGINT, signal.SIGTERM, signal.SIGINT)
        processes.run_cli([*map(str, LONG_RUN), "--data-dir", str(tiny_mnist), "--out", str(out)])

    with processes.fork(train_twice_signalled) as proc:
        _wait_for(out / "last.pt", proc)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    epoch = load_checkpoint(out / "last.pt").epoch
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    _stop_line(stderr, "Interrupted", epoch, out / "last.pt")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_signal_while_checkpoints_are_written_waits_for_both(tiny_mnist, tmp_path):
    """SIGTERM as epoch 1's best.pt is being written: best.pt and last.pt are both written, then
    training stops with epoch 1 saved (the signal was raised inside torch.save, leaving neither)."""
    from ponder_cli import checkpoint
    out = tmp_path / "run"

    def train_signalled_while_saving():
        _signal_self_when(checkpoint.torch, "save", signal.SIGTERM)
        processes.run_cli([*map(str, LONG_RUN), "--data-dir", str(tiny_mnist), "--out", str(out)])

    with processes.fork(train_signalled_while_saving) as proc:
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    _stop_line(stderr, "Terminated", 1, out / "last.pt")
    assert load_checkpoint(out / "best.pt").epoch == load_checkpoint(out / "last.pt").epoch == 1


def test_an_interrupt_held_while_writing_is_raised_once_written():
    """ponder_cli.uninterrupted, as the CLI's signal handler uses it: held inside (nested too),
    raised when the outermost block ends; dropped when the block fails."""
    from ponder_cli import hold_interrupt, uninterrupted

    assert not hold_interrupt(KeyboardInterrupt())  # outside: the handler raises it at once
    interrupt, done = KeyboardInterrupt(), []
    with pytest.raises(KeyboardInterrupt) as raised:
        with uninterrupted():
            with uninterrupted():
                assert hold_interrupt(interrupt)
            done.append("inner")  # the inner block's end does not raise it
            done.append("outer")
    assert raised.value is interrupt and done == ["inner", "outer"]
    with pytest.raises(PonderError):
        with uninterrupted():
            hold_interrupt(KeyboardInterrupt())
            raise PonderError("disk full")
    with uninterrupted():  # nothing left over from the failed block
        pass


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_background_run_from_a_script_ignores_sigint_and_stops_on_sigterm(tiny_mnist, tmp_path):
    """`ponder train … &` in a script: the shell starts it with SIGINT ignored, so that a Ctrl-C
    meant for the foreground leaves it alone; it keeps that ignore (as Python does) and stops
    cleanly on SIGTERM. (A child forked with SIGINT ignored is what such an interpreter starts as.)"""
    out = tmp_path / "run"

    def started_with_sigint_ignored():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        processes.run_cli([*map(str, LONG_RUN), "--data-dir", str(tiny_mnist), "--out", str(out)])

    with processes.fork(started_with_sigint_ignored) as proc:
        deadline = time.monotonic() + 60
        _wait_for(out / "last.pt", proc)
        proc.send_signal(signal.SIGINT)
        interrupted_at = load_checkpoint(out / "last.pt").epoch
        while load_checkpoint(out / "last.pt").epoch < interrupted_at + 2:  # trains on after the SIGINT
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "Traceback" not in stderr, stderr
    _stop_line(stderr, "Terminated", load_checkpoint(out / "last.pt").epoch, out / "last.pt")


# --- losing work: run folders, the shipped models, the lock ---------------------------------------

def test_default_out_is_a_fresh_run_folder_and_never_the_shipped_models(checkpoint, tiny_mnist, tmp_path,
                                                                        monkeypatch, quick, invoke):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    shipped = tmp_path / "checkpoints" / "best.pt"
    shipped.write_bytes(checkpoint.read_bytes())
    for folder in ("pondernet-mlp-seed1234", "pondernet-mlp-seed1234-2"):
        result = invoke("train", *quick, "--data-dir", tiny_mnist, "--no-progress")
        assert result.exit_code == 0, result.output
        assert f"writing checkpoints to {Path('runs') / folder}/" in result.stderr.splitlines()
        assert load_checkpoint(Path("runs") / folder / "best.pt").epoch == 1
    assert shipped.read_bytes() == checkpoint.read_bytes()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["best.pt"]
    result = invoke("train", *quick, "--seed", 7, "--method", "act", "--data-dir", tiny_mnist, "--no-progress")
    assert result.exit_code == 0 and (tmp_path / "runs" / "act-mlp-seed7" / "best.pt").exists()


def test_a_folder_with_checkpoints_is_not_overwritten_without_overwrite(checkpoint, tiny_mnist, tmp_path,
                                                                       monkeypatch, quick, invoke, one_error_line):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "other-run"
    out.mkdir()
    (out / "best.pt").write_bytes(checkpoint.read_bytes())
    line = one_error_line(invoke("train", *quick, "--data-dir", tiny_mnist, "--out", out))
    assert str(out) in line and "another run's checkpoints" in line
    assert "--overwrite" in line
    assert [p.name for p in out.iterdir()] == ["best.pt"] and (out / "best.pt").read_bytes() == checkpoint.read_bytes()
    result = invoke("train", *quick, "--data-dir", tiny_mnist, "--out", out, "--overwrite", "--no-progress")
    assert result.exit_code == 0, result.output
    assert load_checkpoint(out / "best.pt").config.method.max_steps == 2  # the new run's


def test_the_repository_shipped_models_are_refused_from_any_directory(tmp_path, monkeypatch, invoke, one_error_line):
    monkeypatch.chdir(tmp_path)  # the check happens before any data is read: none is needed here
    shipped = Path(__file__).resolve().parent.parent / "ponder_cli" / "checkpoints"
    for out in (shipped, shipped / "align"):
        line = one_error_line(invoke("train", "--out", out, "--data-dir", tmp_path / "none", "--no-download"))
        assert "shipped models" in line
    for resume in (shipped / "best.pt", "align", "checkpoints/interpolation/best.pt"):
        line = one_error_line(invoke("train", "--resume", resume, "--epochs", 100, "--data-dir", tmp_path / "none",
                                     "--no-download"))
        assert "shipped models" in line and "--out" in line


def test_out_that_is_a_file(tmp_path, tiny_mnist, invoke, error):
    (tmp_path / "notes.txt").write_text("mine")
    error(invoke("train", "--out", tmp_path / "notes.txt", "--data-dir", tiny_mnist), 1, f"--out {tmp_path / 'notes.txt'}")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_latest_reads_the_newest_run_and_says_which(checkpoint, tiny_mnist, tmp_path, monkeypatch, invoke):
    monkeypatch.chdir(tmp_path)
    for age, name in ((200, "older"), (100, "newer")):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "best.pt").write_bytes(checkpoint.read_bytes())
        stamp = time.time() - age
        os.utime(tmp_path / "runs" / name / "best.pt", (stamp, stamp))
    result = invoke("extrapolate", "latest", "--angles", 10, "--data-dir", tiny_mnist, "-f", "json")
    assert result.exit_code == 0, result.output
    newer = str(Path("runs") / "newer" / "best.pt")
    assert result.stderr.splitlines()[0].startswith(f"using {newer} (latest")
    assert json.loads(result.stdout)["checkpoints"] == [newer]


def test_run_lock_is_exclusive_and_stale_locks_are_taken_over(tmp_path):
    from ponder_cli.folders import RunLock

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".ponder.lock").write_text(dead.stdout)  # a process that no longer exists
    with RunLock(tmp_path):
        assert (tmp_path / ".ponder.lock").read_text().strip() == str(os.getpid())
    assert not (tmp_path / ".ponder.lock").exists()
    (tmp_path / ".ponder.lock").write_text("")  # died between creating and writing it
    RunLock(tmp_path).acquire().release()
    (tmp_path / ".ponder.lock").write_text(f"{os.getppid()}\n")  # alive: our parent
    with pytest.raises(PonderError, match=f"in use by another ponder command \\(PID {os.getppid()}"):
        RunLock(tmp_path).acquire()
    assert (tmp_path / ".ponder.lock").read_text().strip() == str(os.getppid())


def test_two_runs_on_one_folder(tiny_mnist, tmp_path, invoke, error):
    """A second process is refused while the first trains; after the first is killed, its stale
    lock is taken over and the run resumes; the lock is gone when training ends."""
    out = tmp_path / "run"
    proc = _start_training(tiny_mnist, out)
    try:
        _wait_for(out / "last.pt", proc)
        assert (out / ".ponder.lock").read_text().strip() == str(proc.pid)
        for args in (["--resume", out / "last.pt"], ["--out", out, "--overwrite"]):
            epochs = load_checkpoint(out / "last.pt").epoch + 3
            error(invoke("train", *args, "--epochs", epochs, "--data-dir", tiny_mnist), 1, f"PID {proc.pid}")
    finally:
        proc.kill()
        proc.communicate()
    assert (out / ".ponder.lock").exists()  # SIGKILL left it behind
    epoch = load_checkpoint(out / "last.pt").epoch
    result = invoke("train", "--resume", out / "last.pt", "--epochs", epoch + 1, "--data-dir", tiny_mnist,
                    "--no-progress")
    assert result.exit_code == 0, result.output
    assert load_checkpoint(out / "last.pt").epoch == epoch + 1
    assert not (out / ".ponder.lock").exists()


# --- resume edge cases ----------------------------------------------------------------------------

def test_resuming_a_finished_run_says_so(checkpoint, tiny_mnist, tmp_path, invoke, error):
    last = tmp_path / "last.pt"
    last.write_bytes((checkpoint.parent / "last.pt").read_bytes())  # epoch 1 of 1
    error(invoke("train", "--resume", last, "--data-dir", tiny_mnist), 1, last, "1 of 1 epochs", "--epochs N (N > 1)")
    assert last.read_bytes() == (checkpoint.parent / "last.pt").read_bytes()


def test_resuming_with_fewer_epochs_than_trained_says_so(tiny_mnist, tmp_path, invoke, quick, error):
    out = tmp_path / "run"
    assert invoke("train", *quick, "--epochs", 2, "--data-dir", tiny_mnist, "--out", out, "-q").exit_code == 0
    # the epochs trained, and the command that trains it longer
    error(invoke("train", "--resume", out, "--epochs", 1, "--data-dir", tiny_mnist), 1, "2 epochs", "--epochs 1",
          f"ponder train --resume {out / 'last.pt'} --epochs N (N > 2)")


def test_resuming_best_does_not_rewind_a_newer_last(checkpoint, tiny_mnist, tmp_path, invoke, error):
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.pt").write_bytes(checkpoint.read_bytes())  # epoch 1
    newer = load_checkpoint(checkpoint.parent / "last.pt")
    newer.epoch = 2
    save_checkpoint(newer, run / "last.pt")
    before = (run / "last.pt").read_bytes()
    error(invoke("train", "--resume", run / "best.pt", "--epochs", 3, "--data-dir", tiny_mnist), 1, run / "last.pt",
          "epoch 2", "--overwrite")
    assert (run / "last.pt").read_bytes() == before
    result = invoke("train", "--resume", run / "best.pt", "--epochs", 2, "--overwrite", "--data-dir", tiny_mnist,
                    "--no-progress")
    assert result.exit_code == 0, result.output
    assert "resuming after epoch 1" in result.stderr and load_checkpoint(run / "last.pt").epoch == 2


def test_resume_with_an_enabled_scaler_from_a_run_without_one(monkeypatch, tiny_mnist, tmp_path):
    """A CPU run saves an empty GradScaler state; resuming it where the scaler is enabled (fp16
    on CUDA) starts a fresh scaler. An enabled CPU scaler stands in for CUDA here."""
    cfg = CFG.replace(epochs=1)
    train(cfg, *_data(tiny_mnist), device=torch.device("cpu"), out_dir=tmp_path, progress=False)
    assert load_checkpoint(tmp_path / "last.pt").scaler == {}
    real = torch.amp.GradScaler
    monkeypatch.setattr(torch.amp, "GradScaler", lambda device, enabled=True: real("cpu", enabled=True))
    result = train(CFG, *_data(tiny_mnist), device=torch.device("cpu"), out_dir=tmp_path, progress=False,
                   resume=load_checkpoint(tmp_path / "last.pt"))
    assert result.last_epoch == 2
    assert load_checkpoint(tmp_path / "last.pt").scaler["scale"] > 0


# --- disk full ------------------------------------------------------------------------------------

class _FullDisk(io.RawIOBase):
    """A file on a disk that fills up after `room` bytes."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def writable(self):
        return True

    def write(self, data):
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)


def test_disk_full_while_saving_is_one_line_and_keeps_earlier_checkpoints(checkpoint, tiny_mnist, tmp_path,
                                                                         monkeypatch, invoke, one_error_line):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("best.pt", "last.pt"):
        (run / name).write_bytes((checkpoint.parent / name).read_bytes())
    before = {name: (run / name).read_bytes() for name in ("best.pt", "last.pt")}
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f: real_save(obj, _FullDisk(f, 50_000)))
    result = invoke("train", "--resume", run / "last.pt", "--epochs", 2, "--data-dir", tiny_mnist, "--no-progress",
                    "-f", "jsonl")
    # epoch 2 improves: best.pt is written first, and fails; what the run has, and how to go on
    # (the results went on stdout, as jsonl records, before the error: not the helper's "nothing on stdout")
    line = one_error_line(result)
    assert result.exit_code == 1 and all(str(part) in line for part in (
        run / "best.pt", "No space left on device", "epoch 1 ", run / "last.pt", f"ponder train --resume {run / 'last.pt'}"))
    assert json.loads(result.stdout.splitlines()[-1]) == {
        "format_version": 1, "record": "stopped", "command": "train", "why": "error", "epoch": 1,
        "checkpoint": str(run / "last.pt"), "message": line.removeprefix("Error: ")}
    assert {name: (run / name).read_bytes() for name in ("best.pt", "last.pt")} == before
    # no temp file, no lock left
    assert sorted(p.name for p in run.iterdir()) == ["best.pt", "config.json", "config.toml", "environment.json", "last.pt", "metrics.csv"]


def test_best_is_written_before_last_so_a_failure_between_never_leaves_it_behind(tiny_mnist, tmp_path, quick,
                                                                                 monkeypatch, invoke, error):
    """A disk that takes best.pt and refuses last.pt: epoch 1 is in best.pt, and the line says so and
    how to resume from it, which works once the disk takes files again."""
    from ponder_cli import checkpoint as checkpoint_module
    out = tmp_path / "run"
    real_save, saves = torch.save, []

    def refusing_the_second(obj, f):  # epoch 1's best.pt, then its last.pt
        saves.append(f)
        if len(saves) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_save(obj, f)

    monkeypatch.setattr(checkpoint_module.torch, "save", refusing_the_second)
    line = error(invoke("train", *quick, "--epochs", 2, "--data-dir", tiny_mnist, "--out", out), 1, out / "last.pt",
                 "No space left on device", "epoch 1 ", f"ponder train --resume {out / 'best.pt'}")
    assert not (out / "last.pt").exists() and load_checkpoint(out / "best.pt").epoch == 1
    monkeypatch.setattr(checkpoint_module.torch, "save", real_save)
    result = invoke("train", "--resume", out / "best.pt", "--data-dir", tiny_mnist, "--no-progress")
    assert result.exit_code == 0, result.output
    assert load_checkpoint(out / "last.pt").epoch == 2


def test_a_full_disk_under_metrics_says_what_the_run_has_saved(tiny_mnist, tmp_path, quick, monkeypatch, invoke,
                                                               error):
    from ponder_cli.runs import MetricsFile
    out = tmp_path / "run"

    def full(self, row):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))

    monkeypatch.setattr(MetricsFile, "append", full)
    error(invoke("train", *quick, "--epochs", 2, "--data-dir", tiny_mnist, "--out", out), 1, out / "metrics.csv",
          "No space left on device", "epoch 1 ", f"ponder train --resume {out / 'last.pt'}")


def test_an_interrupt_while_saving_stays_an_interrupt_and_keeps_the_previous_checkpoint(checkpoint, tmp_path,
                                                                                         monkeypatch):
    """Ctrl-C (or SIGTERM) inside torch.save makes its zip writer fail on closing the file, a
    RuntimeError raised while the interrupt unwinds: the interrupt must come out, not that
    error (a traceback), and the earlier last.pt stay as it was, with no temp file left."""
    from ponder_cli import SigTerm as _SigTerm
    from ponder_cli.checkpoint import save_checkpoint

    run = tmp_path / "run"
    run.mkdir()
    (run / "last.pt").write_bytes(checkpoint.read_bytes())
    before = (run / "last.pt").read_bytes()
    state = load_checkpoint(checkpoint)
    for interrupt in (KeyboardInterrupt(), _SigTerm()):
        def interrupted_save(obj, f, interrupt=interrupt):
            f.write(b"PK\x03\x04")  # the first bytes of the container
            try:
                raise interrupt
            except BaseException:  # as torch's writer closing the file: the interrupt is its context
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

        monkeypatch.setattr(torch, "save", interrupted_save)
        with pytest.raises(KeyboardInterrupt) as raised:
            save_checkpoint(state, run / "last.pt")
        assert raised.value is interrupt
        assert (run / "last.pt").read_bytes() == before
        assert sorted(p.name for p in run.iterdir()) == ["last.pt"]


def _can_mount_tmpfs(path: Path) -> bool:
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {path}"],
                           capture_output=True) if shutil.which("unshare") else None
    return probe is not None and probe.returncode == 0


@pytest.mark.skipif(sys.platform != "linux", reason="tmpfs in a private mount namespace")
def test_disk_full_on_a_real_tmpfs(checkpoint, tiny_mnist, tmp_path):
    """A 1.5-checkpoint tmpfs as --out: best.pt of epoch 1 fits, last.pt does not."""
    out = tmp_path / "small"
    out.mkdir()
    if not _can_mount_tmpfs(out):
        pytest.skip("cannot mount a tmpfs here (needs root or user namespaces)")
    size = checkpoint.stat().st_size * 3 // 2 // 1024
    code = "import sys; from ponder_cli.cli import app; app(sys.argv[1:], prog_name='ponder')"
    command = [sys.executable, "-c", code, "train", "--epochs", "1", "--max-steps", "5", "--val-size", "100",
               "--batch-size", "64", "--data-dir", str(tiny_mnist), "--out", str(out), "--no-progress"]
    script = f'mount -t tmpfs -o size={size}k tmpfs "$0" && "$@"; status=$?; ls -a "$0"; exit $status'
    done = subprocess.run(["unshare", "-m", "sh", "-c", script, str(out), *command], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stderr
    # best.pt, written first, fits; last.pt does not: the line names the epoch saved and how to resume
    last = done.stderr.splitlines()[-1]
    assert last.startswith("Error: ") and all(str(part) in last for part in (
        out / "last.pt", "No space left on device", "epoch 1 ", f"ponder train --resume {out / 'best.pt'}"))
    assert "Traceback" not in done.stderr
    # epoch 1 saved; no temp file, no lock
    assert done.stdout.split() == [".", "..", "best.pt", "config.json", "config.toml", "environment.json", "metrics.csv"]


def test_nothing_is_written_inside_the_installed_package_whatever_the_names(tmp_path, monkeypatch, invoke, error):
    import ponder_cli

    monkeypatch.chdir(tmp_path)
    package = Path(ponder_cli.__file__).parent  # where the package really is, not a folder named like it
    before = sorted(package.rglob("*"))
    for out, shipped in ((package / "checkpoints" / "parity", True), (package / "checkpoints" / "new", True),
                         (package / "steps" / "run", False), (package, False)):
        for extra in ([], ["--overwrite"]):
            line = error(invoke("train", "--task", "parity", "--elems", 4, "--epochs", 1, "--batches-per-epoch", 1,
                                "--batch-size", 8, "--out", out, *extra), 1, f"--out {out}", package.resolve())
            assert ("shipped models" in line) == shipped
    error(invoke("eval", "parity16", "--plot", package / "figure.png"), 1, f"--plot {package / 'figure.png'}",
          package.resolve())
    assert sorted(package.rglob("*")) == before


@pytest.mark.parametrize("args", [["train", "--out", ""], ["train", "--data-dir", " "], ["eval", "--plot", ""],
                                  ["predict", "align", "x.png", "--plot", ""], ["info", "--plot", ""]])
def test_an_empty_path_is_refused_not_read_as_the_current_folder(args, tmp_path, monkeypatch, invoke, error):
    monkeypatch.chdir(tmp_path)
    error(invoke(*args), 2, args[-2], "empty path")
    assert list(tmp_path.iterdir()) == []


# each message names the setting, the value given and the range allowed
PIECE_ERRORS = [
    ({"method": "act", "tau": -1.0}, ["tau", "-1.0", "0"]),
    ({"method": "act", "act_epsilon": 1.0}, ["act-epsilon", "1.0", "(0, 1)"]),
    ({"truncation": 1.0}, ["truncation", "1.0", "[0, 1)"]),
    ({"method": "act", "truncation": -0.5}, ["truncation", "-0.5", "[0, 1)"]),
    ({"step": "align", "turn_gate": 2.0}, ["turn-gate", "2.0", "[0, 1]"]),
    ({"step": "align", "align_turn": 0.0}, ["align-turn", "0.0", "(0, 180]"]),
    ({"kernel_size": 13}, ["kernel-size", "13", "[1, 12]"]),
    ({"step": "align", "cnn_dropout": 1.0}, ["cnn-dropout", "1.0", "[0, 1)"]),
    ({"mlp_dropout": -0.1}, ["mlp-dropout", "-0.1", "[0, 1)"]),
    ({"task": "parity", "elems": 8, "train_counts": "3-9"}, ["train-counts", "3-9", "8"]),
    ({"task": "parity", "elems": 16, "curriculum": 10, "curriculum_start": 20}, ["curriculum-start", "20", "16"]),
    ({"step": "align", "turn_gate": 2.0, "method": "act", "tau": -1.0},  # two pieces, both said in one line
     ["turn-gate", "2.0", "tau", "-1.0"]),
]


@pytest.mark.parametrize("given,named", PIECE_ERRORS, ids=[str(g) for g, _ in PIECE_ERRORS])
def test_each_chosen_piece_checks_its_own_settings(given, named):
    with pytest.raises(PonderError) as caught:
        PonderConfig.of(**given)
    assert "\n" not in str(caught.value) and all(part in str(caught.value) for part in named), str(caught.value)
