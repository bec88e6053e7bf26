"""The GPU machine's scripts, rehearsed on the CPU with their --cpu-smoke: the plumbing a window
on a GPU depends on is proven here, where a GPU is rarely lent."""

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CAMPAIGN = REPO / "benchmarks" / "parity_campaign"


def _digests() -> dict:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(CAMPAIGN.iterdir())}


@pytest.mark.gpu_scripts
@pytest.mark.long  # six windows of 1.25 s of wall clock
def test_the_parity_window_rehearses_every_stage_on_the_cpu_and_leaves_the_tracked_files_alone(tmp_path):
    """gpu_parity.sh --cpu-smoke: the tracked checkpoint evaluated from a copy, a stage trained to
    its time limit and resumed the next window, each later stage started once the one before is
    done, one log row per window, then the campaign complete (parity_campaign.smoke asserts each)."""
    before = _digests()
    assert (CAMPAIGN / "parity64.pt").stat().st_size < 2 * 2 ** 20
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_parity.sh"), "--cpu-smoke", str(tmp_path)],
                          capture_output=True, text=True, timeout=150, env={"PYTHON": sys.executable,
                                                                             "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-2].startswith("smoke: OK") and lines[-1].startswith("gpu_parity.sh: exit 0")
    assert sum(line.startswith("| 20") for line in lines) == 5  # a row per window that trained
    assert any(line.startswith("parity64: resuming") for line in lines)
    rows = (tmp_path / "campaign" / "log.md").read_text().splitlines()
    # the last window named its stage (--stage), done already, and worked on it alone
    assert [row.split(" | ")[1] for row in rows[2:]] == ["parity64", "parity64", "parity96-pondernet", "parity96-act",
                                                         "parity96-act"]
    assert (tmp_path / "summary.txt").read_text() == done.stdout
    assert _digests() == before


@pytest.mark.parametrize("script", ["gpu_parity.sh", "gpu_check.sh"])
def test_a_python_without_torch_is_one_error_line_not_a_traceback(script, tmp_path):
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")  # no site-packages: no torch
    (shims / "python3").chmod(0o755)
    done = subprocess.run(["bash", str(REPO / "benchmarks" / script), str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=60, env={"PATH": f"{shims}:/usr/bin:/bin"})
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and "torch" in lines[0], done.stderr


def test_the_files_of_the_long_tests_are_handed_out_first(request):
    """The rehearsal above is the suite's longest test: under `-n 2 --dist loadfile` its file must
    start first, not run alone at the end (tests/conftest.py orders the files, setup.cfg keeps
    xdist from reordering them); the other files follow by their number of tests, most first."""
    files = {}
    for item in request.session.items:
        files.setdefault(item.path, []).append(item)
    long = [any(t.get_closest_marker("long") for t in tests) for tests in files.values()]
    assert long == sorted(long, reverse=True), [path.name for path in files]
    counts = [len(tests) for tests, is_long in zip(files.values(), long) if not is_long]
    assert counts == sorted(counts, reverse=True)
    assert "--no-loadscope-reorder" in request.config.getini("addopts")
