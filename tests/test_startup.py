"""Start-up cost: what a command imports before its first batch, and that avoiding it changes
no arithmetic."""

import json
import subprocess
import sys

import torch

from ponder_cli.config import PonderConfig
from ponder_cli.train import make_optimizer


def test_training_and_evaluation_never_import_the_compiler_stack(tiny_mnist, tmp_path):
    """torch.optim's wrappers import torch._dynamo (over a second) on first use; a whole train,
    resume and eval must not."""
    common = ["--data-dir", str(tiny_mnist)]
    commands = [["train", "--epochs", "1", "--max-steps", "2", "--val-size", "100", "--batch-size", "100",
                 "--train-size", "200", "--out", str(tmp_path / "run"), *common],
                ["train", "--resume", str(tmp_path / "run"), "--epochs", "2", "--val-size", "100", *common],
                ["eval", str(tmp_path / "run"), "--limit", "50", *common]]
    # the three commands in one interpreter, one after the other, as a session would run them
    code = ("import json, sys; from ponder_cli.cli import app\n"
            "for args in json.loads(sys.argv[1]):\n"
            "    try: app(args, prog_name='ponder')\n"
            "    except SystemExit as done: assert not done.code, (args, done.code)\n"
            "    print(sorted(m for m in sys.modules if m.startswith(('torch._dynamo', 'torch._inductor'))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(commands)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


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


def test_a_typo_is_refused_before_torch_loads():
    """--device tpu, --epochs 0, --lambda-p 2, --time-limit 90 (no unit): one error line before torch is imported (seconds
    of start-up for a typo); the same message the library gives."""
    code = ("import sys; from ponder_cli.cli import app\n"
            "for args in (['train', '--epochs', '0'], ['train', '--device', 'tpu'], ['eval', '--device', 'cpu:1'],\n"
            "             ['train', '--lambda-p', '2', '--max-steps', '0'], ['predict', 'x', 'y', '--device', 'meta'],\n"
            "             ['train', '--time-limit', '90']):\n"
            "    try: app(args, prog_name='ponder')\n"
            "    except SystemExit as done: print(done.code, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == ["2 False"] * 6, done.stderr  # usage mistakes: 2, as click's
    assert done.stderr.splitlines() == [
        "Error: epochs must be > 0 (got 0)", "Error: unknown device 'tpu'; use auto, cpu, cuda or cuda:N",
        "Error: --device cpu:1: there is one CPU device, use --device cpu",
        "Error: max-steps must be from 1 to 100 (got 0): every step is computed for every training input, so an epoch "
        "takes about max-steps times longer; lambda-p must be in (0, 1] (got 2.0)",
        "Error: unsupported device 'meta'; use auto, cpu, cuda or cuda:N",
        "Error: --time-limit must be a duration such as 90s, 9m, 2h or 1h30m (got '90')"]
