"""The CUDA path on a real GPU: fp16 training with the GradScaler and truncation, early exit
against the full forward pass, resuming across devices, repeatable evaluation, host syncs.

Marked `cuda` (`python -m pytest -m cuda`) and skipped where no CUDA GPU is visible, as in CI.
"""

import math
import warnings

import pytest
import torch

from ponder_cli import distributed
from ponder_cli import train as train_module
from ponder_cli.checkpoint import load_checkpoint
from ponder_cli.config import PonderConfig
from ponder_cli.data import load_mnist, train_val_split
from ponder_cli.tasks.mnist import evaluate
from ponder_cli.checkpoint import new_model
from ponder_cli.methods import get_method
from ponder_cli.runtime import grad_scaler
from ponder_cli.train import make_optimizer, train, train_one_epoch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GPU, CPU = torch.device("cuda"), torch.device("cpu")
SMALL = dict(hidden=16, hidden_cnn=16, hidden_lin=16, val_size=100, batch_size=64)


def _data(tiny_mnist, device=CPU):
    train_set, val_set = train_val_split(load_mnist(tiny_mnist, train=True, download=False), val_size=100,
                                         train_size=0, seed=1)
    return train_set.to(device), val_set.to(device)


class _SyncWarnings:
    """Counts the synchronising CUDA calls made inside the block (torch's sync debug mode)."""

    def __enter__(self):
        self._caught = warnings.catch_warnings(record=True)
        self.records = self._caught.__enter__()
        warnings.simplefilter("always")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")
        self._caught.__exit__(*exc)

    @property
    def count(self) -> int:
        return sum("synchronizing" in str(w.message) for w in self.records)


def _loop_syncs(steps_run: int, max_steps: int) -> int:
    return steps_run - 1 if steps_run == max_steps else steps_run


@pytest.mark.parametrize("step", ["mlp", "align"])
def test_one_fp16_training_batch_with_the_grad_scaler_and_truncation(step, tiny_mnist, truncated_steps):
    cfg = PonderConfig.from_options(step=step, max_steps=6, truncation=0.05, halting_bias=0.0, **SMALL)
    torch.manual_seed(0)
    model = new_model(cfg).to(GPU)
    train_set, _ = _data(tiny_mnist, GPU)
    batch = train_set.subset(slice(0, 64))
    optimizer, scaler = make_optimizer(model, cfg, GPU), grad_scaler(GPU, True)
    assert scaler.is_enabled() and optimizer.defaults["fused"] is True
    before = [p.detach().clone() for p in model.parameters()]
    with _SyncWarnings() as syncs:
        stats = train_one_epoch(model, get_method(cfg), optimizer, scaler, batch, cfg, amp=True, progress=False)
    assert stats["batches"] == 1 and math.isfinite(stats["loss"]) and 1 <= stats["steps"] <= 6
    stepped = stats["scaler_backoffs"] == 0
    assert stats["skipped_batches"] == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters())) == stepped
    # the truncated forward's one sync per step, plus the epoch's: its permutation and the one
    # read of its metrics; none for the GradScaler (fused Adam skips on the device)
    loop = _loop_syncs(int(truncated_steps[0].max().cpu()), cfg.method.max_steps)
    print(f"{step}: {syncs.count} synchronising calls, {loop} of them the truncated forward's")
    assert syncs.count <= loop + 2


@pytest.mark.parametrize("method, rule", [("pondernet", "sample"), ("pondernet", "median"), ("act", "act")])
@pytest.mark.parametrize("step", ["mlp", "align"])
def test_early_exit_equals_the_full_forward_on_cuda(method, rule, step):
    cfg = PonderConfig.from_options(method=method, step=step, max_steps=6, **SMALL)
    torch.manual_seed(0)
    model, chooser = new_model(cfg).to(GPU).eval(), get_method(cfg)
    with torch.no_grad():
        model.halting_head.bias.fill_(-1.0)
    x = (torch.randn(500, 1, 28, 28) * torch.linspace(0, 3, 500).view(-1, 1, 1, 1)).to(GPU)
    uniforms = torch.rand(cfg.method.max_steps, 500, generator=torch.Generator().manual_seed(3)).to(GPU)
    with _SyncWarnings() as syncs:
        early, early_steps = model.infer(x, chooser.early_exit(rule, uniforms))
    with torch.no_grad():
        out = model(x)
    full, full_steps = chooser.predict(out.logits, out.lambda_logits, uniforms, rule)
    # cuDNN and cuBLAS may pick other kernels for the smaller batches of later steps: a halting
    # decision right at its threshold could flip. With these weights none is that close.
    assert torch.equal(early_steps, full_steps)
    assert torch.equal(early.argmax(1), full.argmax(1))
    assert torch.allclose(early.float(), full.float(), rtol=1e-3, atol=1e-4)
    assert syncs.count <= _loop_syncs(int(early_steps.max().cpu()), cfg.method.max_steps)


def test_resume_cpu_then_cuda_then_cpu(tiny_mnist, tmp_path):
    cfg = PonderConfig.of(epochs=1, max_steps=4, **SMALL)
    train(cfg, *_data(tiny_mnist), device=CPU, out_dir=tmp_path, progress=False)
    on_cpu = load_checkpoint(tmp_path / "last.pt")
    assert "cuda" not in on_cpu.rng and on_cpu.optimizer["param_groups"][0]["fused"] is None

    # on CUDA with fp16: a fresh GradScaler (the CPU run had none), fused Adam, the GPU's stream
    result = train(cfg.replace(epochs=2), *_data(tiny_mnist, GPU), device=GPU, out_dir=tmp_path, amp=True,
                   progress=False, resume=on_cpu)
    assert [h.epoch for h in result.history] == [1, 2]
    on_gpu = load_checkpoint(tmp_path / "last.pt")
    assert isinstance(on_gpu.rng["cuda"], torch.Tensor)  # the training GPU's state, not a list
    assert on_gpu.optimizer["param_groups"][0]["fused"] is True and on_gpu.scaler["scale"] > 0

    result = train(cfg.replace(epochs=3), *_data(tiny_mnist), device=CPU, out_dir=tmp_path, progress=False,
                   resume=on_gpu)
    assert [h.epoch for h in result.history] == [1, 2, 3]
    back = load_checkpoint(tmp_path / "last.pt")
    assert back.optimizer["param_groups"][0]["fused"] is None and "cuda" not in back.rng
    assert all(torch.isfinite(p).all() for p in back.model.values())
    assert all(math.isfinite(h.train_loss) for h in result.history)


# --- the CUDA generator in checkpoints -------------------------------------------------------

TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


def _draws(seed: int, device: str) -> torch.Tensor:
    """What the device's generator gives right after being seeded with `seed`."""
    with torch.cuda.device(device):
        torch.cuda.manual_seed(seed)
    return torch.rand(4, device=device)


def _seeded_state(seed: int) -> torch.Tensor:
    torch.cuda.manual_seed(seed)
    return torch.cuda.get_rng_state()


def test_a_checkpoint_continues_the_training_gpus_stream():
    torch.cuda.manual_seed(7)
    saved = train_module._rng_state(GPU)
    assert isinstance(saved["cuda"], torch.Tensor)  # the training GPU's state, not every GPU's
    torch.cuda.manual_seed(99)
    train_module._set_rng_state(saved, GPU)
    assert torch.equal(torch.rand(4, device=GPU), _draws(7, "cuda:0"))


@pytest.mark.parametrize("saved, device, ddp, continued", [
    # a list holds every GPU's state (an earlier version); the seeds 10, 11, 12, 13 stand for
    # cuda:0 to cuda:3 of the host that wrote it
    ("list", "cuda:0", False, 10),
    ("list", "cuda:0", True, 10),  # torchrun: every rank continues rank 0's cuda:0 stream
    ("empty", "cuda:0", False, None),  # nothing usable: the stream goes on from where it was
    ("absent", "cuda:0", False, None),  # a CPU run resumed on CUDA
    ("list", "cpu", False, None),  # a CUDA run resumed on the CPU: the GPU's stream untouched
    pytest.param("list", "cuda:1", False, 11, marks=TWO_GPUS),  # the one this device drew from
    pytest.param("first", "cuda:1", False, 10, marks=TWO_GPUS),  # from a host with one GPU: its only one
    pytest.param("list", "cuda:1", True, 10, marks=TWO_GPUS),
])
def test_resuming_restores_the_cuda_stream_training_drew_from(saved, device, ddp, continued, monkeypatch):
    monkeypatch.setattr(distributed, "active", lambda: ddp)
    states = [_seeded_state(10 + k) for k in range(4)]
    cuda = {"list": states, "first": states[:1], "empty": [], "absent": None}[saved]
    cpu_state = torch.get_rng_state()
    torch.manual_seed(1)
    gpu = "cuda:0" if device == "cpu" else device
    with torch.cuda.device(gpu):
        torch.cuda.manual_seed(99)
    train_module._set_rng_state({"torch": cpu_state, **({} if cuda is None else {"cuda": cuda})},
                                torch.device(device))
    assert torch.equal(torch.get_rng_state(), cpu_state)
    assert torch.equal(torch.rand(4, device=gpu), _draws(99 if continued is None else continued, gpu))


@pytest.mark.parametrize("amp", [False, True])
@pytest.mark.parametrize("halting", ["sample", "median", "expected"])
def test_evaluation_gives_the_same_numbers_twice_on_cuda(amp, halting, tiny_mnist):
    cfg = PonderConfig.of(max_steps=6, **SMALL)
    torch.manual_seed(0)
    model = new_model(cfg).to(GPU)
    test = load_mnist(tiny_mnist, train=False, download=False).to(GPU)
    first, second = (evaluate(model, test, cfg, max_angle=45, seed=7, halting=halting, amp=amp, with_loss=True,
                              batch_size=64) for _ in range(2))
    assert first == second
    assert first.images == 200 and 0 <= first.accuracy <= 1


def test_evaluation_on_cuda_agrees_with_the_cpu(tiny_mnist):
    """The same seeded rotations and coins on both devices (drawn on the CPU); only the kernels'
    rounding differs, which may move a decision that sits right at its threshold."""
    cfg = PonderConfig.of(max_steps=6, **SMALL)
    torch.manual_seed(0)
    model = new_model(cfg)
    test = load_mnist(tiny_mnist, train=False, download=False)
    on_cpu = evaluate(model, test, cfg, max_angle=45, seed=7, halting="sample")
    on_gpu = evaluate(model.to(GPU), test.to(GPU), cfg, max_angle=45, seed=7, halting="sample")
    assert on_gpu.accuracy == pytest.approx(on_cpu.accuracy, abs=0.01)
    assert on_gpu.mean_steps == pytest.approx(on_cpu.mean_steps, abs=0.02)


def test_every_command_names_the_gpu_it_used(checkpoint, tiny_mnist, ponder):
    """`--device auto` on a GPU machine: the stderr line names the GPU and why, the JSON `device`."""
    import json

    result = ponder("eval", checkpoint, "--angles", 10, "--data-dir", tiny_mnist, "-f", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["device"] == "cuda:0"
    assert f"device cuda:0 ({torch.cuda.get_device_name(0)}) (--device auto: a CUDA GPU available)" in \
        result.stderr.splitlines()
