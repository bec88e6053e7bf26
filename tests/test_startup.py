"""Start-up cost: what a command imports before its first batch, and that avoiding it changes
no arithmetic."""

import json
import subprocess
import sys

import pytest
import torch

from ponder_cli.config import PonderConfig
from ponder_cli.train import make_optimizer


TYPOS = [["train", "--epochs", "0"], ["train", "--device", "tpu"], ["eval", "--device", "cpu:1"],
         ["train", "--lambda-p", "2", "--max-steps", "0"], ["predict", "x", "y", "--device", "meta"],
         ["train", "--time-limit", "90"]]
TYPOS_NAME = [["epochs", "0"], ["'tpu'"], ["--device cpu:1"], ["max-steps", "0", "lambda-p", "2.0"], ["'meta'"],
              ["--time-limit", "'90'"]]


@pytest.mark.long  # a fresh interpreter's start-up is what it measures
def test_a_typo_is_refused_before_torch_loads_and_a_session_never_imports_the_compiler_stack(tiny_mnist, tmp_path):
    """One interpreter, as a session would run it. First the typos (--device tpu, --epochs 0,
    --lambda-p 2, --time-limit 90 without a unit...): each one error line and exit 2 before torch
    is imported (seconds of start-up for a typo). Then a whole train, resume and eval:
    torch.optim's wrappers import torch._dynamo (over a second) on first use; these must not."""
    common = ["--data-dir", str(tiny_mnist)]
    commands = [["train", "--epochs", "1", "--max-steps", "2", "--val-size", "100", "--batch-size", "100",
                 "--train-size", "200", "--out", str(tmp_path / "run"), *common],
                ["train", "--resume", str(tmp_path / "run"), "--epochs", "2", "--val-size", "100", *common],
                ["eval", str(tmp_path / "run"), "--limit", "50", *common]]
    code = ("import json, sys; from ponder_cli.cli import app\n"
            "typos, commands = json.loads(sys.argv[1])\n"
            "for args in typos:\n"
            "    try: app(args, prog_name='ponder')\n"
            "    except SystemExit as done: print(done.code, 'torch' in sys.modules, flush=True)\n"
            "for args in commands:\n"
            "    try: app(args, prog_name='ponder')\n"
            "    except SystemExit as done: assert not done.code, (args, done.code)\n"
            "    print(sorted(m for m in sys.modules if m.startswith(('torch._dynamo', 'torch._inductor'))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps([TYPOS, commands])], capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:len(TYPOS)] == ["2 False"] * len(TYPOS), done.stderr  # usage mistakes: 2, as click's
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == len(TYPOS) and all(errors)
    for line, named in zip(errors, TYPOS_NAME):
        assert line.startswith("Error: ") and all(part in line for part in named), line
    assert lines[-1] == "[]"


def test_the_optimizer_updates_exactly_as_torch_adam():
    """Steps, zero_grad and a state_dict round trip, bit for bit against torch.optim.Adam."""
    def model_and_batch():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)), torch.randn(32, 8)

    ours_model, x = model_and_batch()
    theirs_model, _ = model_and_batch()
    cfg = PonderConfig.of(lr=3e-3)
    ours = make_optimizer(ours_model, cfg, torch.device("cpu"))
    theirs = torch.optim.Adam(theirs_model.parameters(), lr=torch.tensor(3e-3), fused=True)
    for step in range(6):
        for model, optimizer in ((ours_model, ours), (theirs_model, theirs)):
            optimizer.zero_grad()
            model(x * (step + 1)).square().mean().backward()
            optimizer.step()
        if step == 2:  # a resume in the middle
            ours.load_state_dict(ours.state_dict())
    for a, b in zip(ours_model.parameters(), theirs_model.parameters()):
        assert torch.equal(a, b) and a.grad_fn is None
    torch.testing.assert_close(ours.state_dict(), theirs.state_dict(), rtol=0, atol=0)
