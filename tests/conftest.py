"""Shared test plumbing: no real MNIST and no network unless a test is marked `mnist`, tiny
generated MNIST, the CLI runner, the one-error-line checks, trained tiny checkpoints of every
method, a checkpoint payload that would run code if unpickled, and the early-exit loop driven on
given outputs.

Tests use these as fixtures; nothing imports from this file.
"""

import os
import struct
from pathlib import Path

import pytest
import torch
from tqdm import tqdm
from typer.testing import CliRunner

from ponder_cli.cli import app
from synthetic_data import synthetic_digits

# One torch thread for the suite: the tests' models are tiny, so a second thread only adds
# synchronisation, and when other work shares the cores, OpenMP's spinning threads make every
# operator wait (a run took 10-13 minutes under load with torch's default threads, a third of
# that with one). And a process a test forks (tests/processes.py) would hang in OpenMP's pool of
# threads had this process ever run one. The interpreters the suite starts get one too, unless
# OMP_NUM_THREADS says otherwise.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# nor any other thread to copy held by a fork: tqdm's monitor wakes every 10 s holding tqdm's lock
tqdm.monitor_interval = 0


def _write_idx(path: Path, data: torch.Tensor) -> None:
    kind = 0x08  # unsigned byte
    header = struct.pack(">HBB", 0, kind, data.dim()) + struct.pack(f">{data.dim()}I", *data.shape)
    path.write_bytes(header + data.to(torch.uint8).contiguous().numpy().tobytes())


def _write_mnist(root: Path, n_train: int = 700, n_test: int = 200, seed: int = 0) -> Path:
    """A tiny MNIST in torchvision's layout: root/MNIST/raw/<four IDX files>."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, count, offset in (("train", n_train, 0), ("t10k", n_test, 1)):
        data = synthetic_digits(count, seed + offset)
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", data.images)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", data.labels)
    return root


@pytest.fixture(scope="session")
def tv():
    """torchvision's transforms (T, TF), imported only by the tests that compare with them: over a
    second to import, in every worker's collection otherwise."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as TF
    return T, TF


@pytest.fixture(scope="session")
def scipy_stats():
    """scipy.stats, imported only by the tests that compare with it, as `tv`."""
    return pytest.importorskip("scipy.stats")


@pytest.fixture(scope="session")
def write_idx():
    """write_idx(path, uint8 tensor): one IDX file of unsigned bytes."""
    return _write_idx


@pytest.fixture(scope="session")
def tiny_mnist(tmp_path_factory) -> Path:
    """700 training and 200 test generated digits (`synthetic_data.synthetic_digits`, seeds 0 and 1)."""
    return _write_mnist(tmp_path_factory.mktemp("data"))


def _invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="session")
def ponder():
    """ponder(*args): run the CLI in-process; returns click's Result (stdout, stderr apart)."""
    return _invoke


def _one_error_line(result) -> str:
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture(scope="session")
def one_error_line():
    """one_error_line(result): asserts a clean failure (non-zero exit, no traceback, exactly
    one `Error:` line on stderr) and returns that line."""
    return _one_error_line


def _error(result, code: int, *named) -> str:
    """The kind of a message, not its sentence: a clean failure (as `_one_error_line`) with exit
    status `code`, nothing on stdout, and an `Error:` line that names each of `named` (an option,
    a value, a file). Takes click's Result or a finished process (returncode, stdout, stderr)."""
    if not hasattr(result, "exit_code"):  # subprocess.CompletedProcess or processes.Process
        out, err = (result.stdout, result.stderr) if hasattr(result, "args") else result.communicate()
        lines = [line for line in (err or "").splitlines() if line.startswith("Error")]
        assert "Traceback" not in (out or "") + (err or ""), err
        assert len(lines) == 1, err
        status, line = result.returncode, lines[0]
    else:
        line, status, out = _one_error_line(result), result.exit_code, result.stdout
    assert status == code, (status, line)
    assert not out, out
    assert line.startswith("Error: "), line
    for name in named:
        assert str(name) in line, (name, line)
    return line


@pytest.fixture(scope="session")
def error():
    """error(result, code, *named): asserts one `Error:` line on stderr naming each of `named`,
    exit status `code` and nothing on stdout; returns the line."""
    return _error


TINY = ["--val-size", "100", "--batch-size", "64", "--no-progress"]


@pytest.fixture(scope="session")
def runs(tiny_mnist, tmp_path_factory) -> Path:
    """Tiny trained runs, one folder each: pn1 and pn2 (pondernet, 5 steps, seeds 1 and 2), act
    (5 steps) and plain; 2 epochs without training rotation."""
    root = tmp_path_factory.mktemp("runs")
    common = ["--epochs", "2", *TINY, "--data-dir", tiny_mnist, "--train-rotation", "0", "--lr", "3e-3"]
    specs = {"pn1": ["--max-steps", "5", "--seed", "1"], "pn2": ["--max-steps", "5", "--seed", "2"],
             "act": ["--method", "act", "--max-steps", "5"], "plain": ["--method", "plain"]}
    for name, args in specs.items():
        result = _invoke("train", *args, *common, "--out", root / name)
        assert result.exit_code == 0, result.output
    return root


@pytest.fixture(scope="session")
def checkpoint(tiny_mnist, tmp_path_factory) -> Path:
    """best.pt of a one-epoch pondernet run (5 steps, default ±22.5° training rotation); its
    folder also holds last.pt."""
    out = tmp_path_factory.mktemp("ck")
    result = _invoke("train", "--epochs", 1, "--max-steps", 5, *TINY, "--data-dir", tiny_mnist, "--out", out)
    assert result.exit_code == 0, result.output
    return out / "best.pt"


REPO = Path(__file__).resolve().parent.parent


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """The files in the order `-n 2 --dist loadfile` hands them to the workers (setup.cfg turns
    xdist's own order off): a file holding a test marked `long` first, then the rest by their
    number of tests, most first, as xdist would order them. By count alone the files of one long
    test (the parity rehearsal, real MNIST, a fresh session) came last, one worker running them
    alone while the other had finished."""
    files = {}
    for item in items:
        files.setdefault(item.path, []).append(item)
    first = sorted(files.values(), key=lambda tests: (not any(t.get_closest_marker("long") for t in tests), -len(tests)))
    items[:] = [item for tests in first for item in tests]


@pytest.fixture(autouse=True)
def hermetic(request, monkeypatch, tmp_path_factory):
    """No test reads the real MNIST or reaches the network unless it is marked `mnist`: the
    default data folder is an empty one, and a download fails at once, online or not."""
    if request.node.get_closest_marker("mnist"):
        return
    from ponder_cli.tasks import mnist

    def offline(root, train):
        raise OSError("the tests are offline: give the command --data-dir (tiny_mnist), or mark the test mnist")

    monkeypatch.setenv("PONDER_DATA_DIR", str(tmp_path_factory.getbasetemp() / "no-mnist"))
    monkeypatch.setattr(mnist, "_download", offline)


@pytest.fixture(scope="session", autouse=True)
def shipped_models_untouched():
    """No test may write to the shipped models (ponder_cli/checkpoints/) or create a runs/ folder
    in the repository."""
    def snapshot():
        return {p: p.read_bytes() for p in sorted((REPO / "ponder_cli" / "checkpoints").rglob("*")) if p.is_file()}
    before, runs_existed = snapshot(), (REPO / "runs").exists()
    yield
    assert snapshot() == before, "a test changed the shipped models"
    assert runs_existed or not (REPO / "runs").exists(), "a test trained into the repository's runs/"


QUICK = ["--epochs", "1", "--max-steps", "2", "--val-size", "100", "--train-size", "200", "--batch-size", "100"]


@pytest.fixture(scope="session")
def quick():
    """Options of the quickest real training run (one epoch of 200 images, 2 steps)."""
    return list(QUICK)


class _RunsCodeWhenUnpickled:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def evil_checkpoint(tmp_path):
    """(path, marker): a file shaped like a checkpoint whose unpickling would create `marker`."""
    marker, path = tmp_path / "ran", tmp_path / "evil.pt"
    torch.save({"format": "ponder_cli", "version": 2, "model": _RunsCodeWhenUnpickled(marker)}, path)
    return path, marker


@pytest.fixture(scope="session")
def vector_config():
    """vector_config(**fields): a PonderConfig for vector inputs of `elems` entries (default 8),
    as the vector step functions (rnn, gru) read it; the rest what parity and the step imply."""
    from ponder_cli.config import PonderConfig

    return lambda **fields: PonderConfig.of(**{"task": "parity", "step": "gru", "elems": 8, **fields})


@pytest.fixture
def truncated_steps(monkeypatch) -> list:
    """The steps computed per image (B,) by every truncated training forward while the test
    runs, one tensor per call (PonderNet._forward_truncated, recorded)."""
    from ponder_cli.model import PonderNet

    computed, real = [], PonderNet._forward_truncated

    def recording(self, x, stop):
        out = real(self, x, stop)
        computed.append(out.computed)
        return out

    monkeypatch.setattr(PonderNet, "_forward_truncated", recording)
    return computed


def _drive(rule, logits, lambda_logits):
    steps = torch.zeros(lambda_logits.shape[1], dtype=torch.long)
    active = torch.arange(lambda_logits.shape[1])
    for n in range(lambda_logits.shape[0]):
        halts, _ = rule.decide(n, n == lambda_logits.shape[0] - 1, None if logits is None else logits[n, active],
                               lambda_logits[n, active])
        steps[active[halts]] = n + 1
        running = (~halts).nonzero().squeeze(1)
        rule.keep(running)
        active = active[running]
    return steps


@pytest.fixture(scope="session")
def drive():
    """drive(rule, logits (steps, B, classes) or None, lambda_logits (steps, B)): what
    PonderNet.infer (or a truncated forward, without logits) does with a rule (model.py), on
    given outputs: each step shows the rule only the rows still running; returns the 1-based halting step of each row."""
    return _drive
