"""--compile: a setting of the run (saved, in the reproduce line, `info` and `diff`, kept on
resume), the forward and loss handed to torch.compile at fixed shapes, and a missing C++ compiler
one error line. The compilation itself takes a minute even at a tiny size: it is measured by
`benchmarks/parity_speed.py --compile`, not here; these tests compile with an identity."""

import json

import pytest
import torch

from ponder_cli import train as train_module
from ponder_cli.checkpoint import load_checkpoint, new_model
from ponder_cli.config import PonderConfig
from ponder_cli.tasks import get_task

PARITY = ["--task", "parity", "--elems", "4", "--max-steps", "2", "--hidden", "8", "--batch-size", "16",
          "--batches-per-epoch", "2", "--no-progress"]


@pytest.fixture
def compiled(monkeypatch) -> list:
    """torch.compile replaced by an identity that records what it was handed."""
    handed = []

    def identity(function):
        handed.append(function)
        return function
    monkeypatch.setattr(train_module, "compiled", identity)
    return handed


def test_the_setting_parses_and_defaults_off():
    assert PonderConfig.of().training.compile is False
    assert PonderConfig.of(compile=True).training.compile is True
    with pytest.raises(Exception, match="compile"):
        PonderConfig.of(compile="yes")


def test_a_compiled_batch_runs_the_forward_and_loss_through_the_compiler_at_fixed_shapes(compiled):
    device = torch.device("cpu")
    for cfg, hands in ((PonderConfig.of(task="parity", elems=4, hidden=8, max_steps=2, batch_size=16), 0),
                       (PonderConfig.of(task="parity", elems=4, hidden=8, max_steps=2, batch_size=16, compile=True),
                        1)):
        torch.manual_seed(0)
        step = train_module.batch_step(new_model(cfg), cfg, get_task(cfg).training_source(None, device))
        assert len(compiled) == hands and step.shrink is not cfg.training.compile  # compiled: truncation as a mask
        if hands:
            assert compiled[-1] == step._forward_loss
    # ACT truncates every batch: compiled, it masks instead of shrinking (no shape follows the data)
    act = PonderConfig.of(task="parity", elems=4, hidden=8, max_steps=3, batch_size=16, method="act", compile=True)
    torch.manual_seed(0)
    step = train_module.batch_step(new_model(act), act, get_task(act).training_source(None, device))
    step.warm_up()
    assert step.shrink is False and int(step.totals[train_module.INPUTS]) == 16 * 5


def test_the_fused_gru_steps_aside_while_the_compiler_traces(monkeypatch):
    cfg = PonderConfig.of(task="parity", elems=4, hidden=8, max_steps=2)
    model = new_model(cfg)
    context, state = model.step.start(torch.ones(3, 4), 2)
    assert model.step.all_steps(context, state, 2) is not None
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert model.step.all_steps(context, state, 2) is None


def test_a_compiled_run_saves_it_shows_it_and_resumes_with_it(compiled, ponder, error, tmp_path):
    out = tmp_path / "run"
    result = ponder("train", *PARITY, "--epochs", "1", "--compile", "--out", out, "-f", "json")
    assert result.exit_code == 0, result.output
    assert len(compiled) == 1
    saved = json.loads((out / "config.json").read_text())
    assert saved["config"]["compile"] is True
    assert "compile = true" in (out / "config.toml").read_text()
    assert load_checkpoint(out / "last.pt").config.training.compile is True
    info = ponder("info", out, "-f", "json")
    assert info.exit_code == 0, info.output
    assert "--compile" in json.loads(info.stdout)["train_command"].split()
    # resumed, it compiles again (the checkpoint's setting), with or without the option given
    for epochs, given in ((2, []), (3, ["--compile"])):
        again = ponder("train", "--resume", out, "--epochs", str(epochs), *given, "--no-progress", "-q")
        assert again.exit_code == 0, again.output
        assert load_checkpoint(out / "last.pt").epoch == epochs
    assert len(compiled) == 3
    error(ponder("train", "--resume", out, "--epochs", "4", "--no-compile", "--no-progress"), 2, "--compile")
    eager = tmp_path / "eager"
    assert ponder("train", *PARITY, "--epochs", "1", "--out", eager, "-q").exit_code == 0
    diff = ponder("diff", out, eager)
    assert diff.exit_code == 0 and "compile" in diff.stdout, diff.output


def test_no_cpp_compiler_is_one_error_line_before_a_folder_is_claimed(ponder, error, tmp_path):
    from torch._inductor import config as inductor_config

    out = tmp_path / "run"
    # inductor's own patch: monkeypatch's undo leaves the setting missing for the tests after it
    with inductor_config.patch({"cpp.cxx": (None, "no-such-compiler-for-ponder")}):
        error(ponder("train", *PARITY, "--epochs", "1", "--compile", "--out", out), 1, "--compile")
    assert not out.exists()


def test_compile_off_the_cpu_is_one_error_line_before_a_folder_is_claimed(ponder, error, tmp_path, monkeypatch):
    from ponder_cli.api import training

    # as if a GPU were there: the refusal comes before anything runs on it
    monkeypatch.setattr(training, "device_and_amp", lambda device, amp: (torch.device("cuda"), False))
    out = tmp_path / "run"
    error(ponder("train", *PARITY, "--epochs", "1", "--compile", "--out", out), 1, "--compile")
    assert not out.exists()


def test_a_narrow_head_is_a_product_and_a_sum_only_while_compiling(monkeypatch):
    from ponder_cli.model import narrow_linear

    torch.manual_seed(0)
    x = torch.randn(5, 7, 16, requires_grad=True)
    for layer in (torch.nn.Linear(16, 1), torch.nn.Linear(16, 2), torch.nn.Linear(16, 3)):
        assert torch.equal(narrow_linear(layer, x), layer(x))  # eager: the layer itself, to the bit
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    for layer in (torch.nn.Linear(16, 1), torch.nn.Linear(16, 2)):
        by_hand, expected = narrow_linear(layer, x), layer(x)
        torch.testing.assert_close(by_hand, expected)
        wanted = torch.autograd.grad(expected.square().sum(), (x, layer.weight, layer.bias))
        for got, want in zip(torch.autograd.grad(by_hand.square().sum(), (x, layer.weight, layer.bias)), wanted):
            torch.testing.assert_close(got, want)
