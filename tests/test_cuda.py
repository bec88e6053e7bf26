"""The CUDA path on a real GPU: the training batch captured as a CUDA graph and replayed (reading
the learning-rate tensor, resuming onto a GPU, no sync in an epoch but its one read; the capture
engaged on whichever GPU trains, with no torch warning), fp16 with the GradScaler, evaluation's
full forward against early exit, resuming across devices, repeatable evaluation, the shipped
models against the CPU. What a replay must train and draw runs in tests/test_capture.py, on the
CPU's stand-in graph and, marked `cuda` too, on a GPU.

Marked `cuda` (`python -m pytest -m cuda`) and skipped where no CUDA GPU is visible, as in CI,
where tests/test_graph_safe.py proves on the CPU what makes the capture possible.
"""

import json
import math
import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from ponder_cli import distributed
from ponder_cli import train as train_module
from ponder_cli.checkpoint import load_checkpoint, load_model
from ponder_cli.config import PonderConfig
from ponder_cli.tasks.mnist import default_data_dir, evaluate, load_mnist, train_val_split
from ponder_cli.checkpoint import new_model
from ponder_cli.model import get_method
from ponder_cli.folders import shipped_path
from ponder_cli.train import WARMUP_BATCHES, batch_step, train, train_one_epoch

from host_reads import DeviceSyncs, Operators

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GPU, CPU = torch.device("cuda"), torch.device("cpu")
SMALL = dict(hidden=16, hidden_cnn=16, val_size=100, batch_size=64)


def _small(step: str = "mlp", **changes) -> PonderConfig:
    """A small config; hidden_lin only where the step reads it (mlp)."""
    return PonderConfig.of(step=step, **SMALL, **({"hidden_lin": 16} if step == "mlp" else {}), **changes)


def _data(tiny_mnist, device=CPU):
    train_set, val_set = train_val_split(load_mnist(tiny_mnist, train=True, download=False), val_size=100,
                                         train_size=0, seed=1)
    return train_set.to(device), val_set.to(device)


def _batches(step, count: int, start: int = 0) -> None:
    for index in range(start, start + count):
        step.source.stage(index)
        step()


# --- the captured training batch ----------------------------------------------------------------

# no dropout and no rotation: nothing random
STILL = dict(cnn_dropout=0.0, mlp_dropout=0.0, train_rotation=0.0)


def test_a_learning_rate_cut_changes_the_replayed_update(tiny_mnist):
    cfg = _small("mlp", **STILL)
    train_set, _ = _data(tiny_mnist, GPU)
    torch.manual_seed(0)
    model = new_model(cfg).to(GPU)
    step = batch_step(model, cfg, train_set, graphs=True)
    model.train()
    step.source.start_epoch()
    _batches(step, WARMUP_BATCHES + 1)  # captured
    rate = step.optimizer.param_groups[0]["lr"]
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(step.optimizer, mode="max", factor=0.0, patience=0)
    scheduler.step(0.5)
    scheduler.step(0.4)  # no better: the rate is cut to 0, in place
    assert step.optimizer.param_groups[0]["lr"] is rate and float(rate) == 0.0
    before = [p.detach().clone() for p in model.parameters()]
    _batches(step, 2, WARMUP_BATCHES + 1)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))  # Adam at rate 0 moves nothing
    rate.fill_(1e-3)
    _batches(step, 1, WARMUP_BATCHES + 3)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "fp16-grad-scaler"])
@pytest.mark.parametrize("task", ["mnist", "parity"])
def test_no_sync_inside_a_captured_epoch_but_its_one_read(amp, task, tiny_mnist):
    cfg = _small("mlp", max_steps=6, truncation=0.05) if task == "mnist" else \
        PonderConfig.of(task="parity", elems=16, hidden=32, batch_size=64, batches_per_epoch=12,
                        curriculum=8, curriculum_start=2)
    train_set = _data(tiny_mnist, GPU)[0] if task == "mnist" else None
    torch.manual_seed(0)
    model = new_model(cfg).to(GPU)
    step = batch_step(model, cfg, train_set, amp=amp, graphs=True)
    assert step.scaler.is_enabled() == amp and step.optimizer.defaults["fused"] is True
    stats = train_one_epoch(step, progress=False)  # warm-up and capture
    assert step.state == "captured" and math.isfinite(stats["loss"])
    step.source.start_epoch()
    torch.cuda.synchronize()
    # the device's count apart from the recorder, which reads no device value (its own .item() of
    # parity's 0-dim curriculum top was once the one sync found here)
    with DeviceSyncs() as syncs, Operators(step.source.generators()) as staged:
        _batches(step, 5)
    assert syncs.count == 0 and staged.reads == Counter() and staged.problems == []
    assert math.isfinite(float(step.totals[0]))


def test_a_run_resumed_onto_a_gpu_replays_from_the_loaded_state(tiny_mnist, tmp_path):
    """One epoch on the CPU; the second on CUDA captured and replayed, and, for comparison, eagerly:
    the replays start from the checkpoint's weights, optimizer and learning rate."""
    cfg = PonderConfig.of(epochs=1, max_steps=4, lr_patience=0, **STILL, **SMALL, hidden_lin=16)
    train(cfg, *_data(tiny_mnist), device=CPU, out_dir=tmp_path / "cpu", progress=False)
    saved = load_checkpoint(tmp_path / "cpu" / "last.pt")
    weights = []
    for graphs in (True, False):
        result = train(cfg.replace(epochs=2), *_data(tiny_mnist, GPU), device=GPU, out_dir=tmp_path / str(graphs),
                       progress=False, resume=saved, cuda_graphs=graphs)
        assert [h.epoch for h in result.history] == [1, 2]
        weights.append(load_checkpoint(tmp_path / str(graphs) / "last.pt").model)
    for key in weights[0]:
        torch.testing.assert_close(weights[0][key], weights[1][key], rtol=1e-4, atol=1e-6)


def test_training_with_graphs_learns_like_eager_training(tiny_mnist, tmp_path):
    cfg = PonderConfig.of(epochs=3, max_steps=6, **SMALL, hidden_lin=16)
    losses = []
    for graphs in (True, False):
        result = train(cfg, *_data(tiny_mnist, GPU), device=GPU, out_dir=tmp_path / str(graphs), amp=True,
                       progress=False, cuda_graphs=graphs)
        losses.append([h.train_loss for h in result.history])
    assert losses[0][-1] < losses[0][0] and losses[1][-1] < losses[1][0]
    assert losses[0][-1] == pytest.approx(losses[1][-1], rel=0.2)  # other random draws, the same learning


@pytest.mark.parametrize("method, rule", [("pondernet", "sample"), ("pondernet", "median"), ("act", "act")])
@pytest.mark.parametrize("step", ["mlp", "align"])
def test_early_exit_equals_the_full_forward_on_cuda(method, rule, step):
    cfg = _small(step, method=method, max_steps=6)
    torch.manual_seed(0)
    model, chooser = new_model(cfg).to(GPU).eval(), get_method(cfg)
    with torch.no_grad():
        model.halting_head.bias.fill_(-1.0)
    x = (torch.randn(500, 1, 28, 28) * torch.linspace(0, 3, 500).view(-1, 1, 1, 1)).to(GPU)
    uniforms = torch.rand(cfg.method.max_steps, 500, generator=torch.Generator().manual_seed(3)).to(GPU)
    early, early_steps = model.infer(x, chooser.exit_rule(rule, uniforms))
    with torch.no_grad():
        out = model(x)
    full, full_steps = chooser.predict(out.logits, out.lambda_logits, uniforms, rule)
    # cuDNN and cuBLAS may pick other kernels for the smaller batches of later steps: a halting
    # decision right at its threshold could flip. With these weights none is that close.
    assert torch.equal(early_steps, full_steps)
    assert torch.equal(early.argmax(1), full.argmax(1))
    assert torch.allclose(early.float(), full.float(), rtol=1e-3, atol=1e-4)


def test_an_evaluation_on_cuda_reads_the_host_once_per_bucket(tiny_mnist):
    cfg = _small("mlp", max_steps=6)
    torch.manual_seed(0)
    model = new_model(cfg).to(GPU)
    test = load_mnist(tiny_mnist, train=False, download=False).to(GPU)
    evaluate(model, test, cfg, max_angle=45, seed=7, batch_size=64)  # warm-up
    torch.cuda.synchronize()
    with DeviceSyncs() as syncs:
        evaluate(model, test, cfg, max_angle=45, seed=7, batch_size=64)
    # the coins and angles copied up once, the per-image results read once: a handful, never one per step
    assert syncs.count <= 6, syncs.count


def test_resume_cpu_then_cuda_then_cpu(tiny_mnist, tmp_path):
    cfg = PonderConfig.of(epochs=1, max_steps=4, **SMALL, hidden_lin=16)
    train(cfg, *_data(tiny_mnist), device=CPU, out_dir=tmp_path, progress=False)
    on_cpu = load_checkpoint(tmp_path / "last.pt")
    assert "cuda" not in on_cpu.rng and on_cpu.optimizer["param_groups"][0]["fused"] is True

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
    assert back.optimizer["param_groups"][0]["fused"] is True and "cuda" not in back.rng
    assert all(torch.isfinite(p).all() for p in back.model.values())
    assert all(math.isfinite(h.train_loss) for h in result.history)


def test_training_on_the_last_gpu_captures_there_without_a_warning(tiny_mnist, tmp_path):
    """The last visible GPU (cuda:1 or further on a machine with several; the current device stays
    cuda:0): the capture happens there, checked by its first replay, and the run says so; no
    torch warning, captured or not (Adam is capturable only while captured)."""
    import warnings

    device = torch.device("cuda", torch.cuda.device_count() - 1)
    # nothing random (STILL): the eager run trains on the same numbers, so it is the yardstick;
    # two tiny epochs' accuracy alone spreads 0.07-0.31 over seeds
    cfg = PonderConfig.of(epochs=2, max_steps=4, **SMALL, hidden_lin=16, **STILL)
    results = {}
    for graphs in (True, False):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results[graphs] = train(cfg, *_data(tiny_mnist, device), device=device, out_dir=tmp_path / str(graphs),
                                    progress=False, cuda_graphs=graphs)
        assert [str(w.message) for w in caught if "capturable" in str(w.message) or "torch" in w.filename] == []
    assert [h.training_step for h in results[True].history] == ["captured", "captured"]
    assert [h.training_step for h in results[False].history] == ["eager: --no-cuda-graphs"] * 2
    captured, eager = results[True].history, results[False].history
    assert captured[-1].train_loss < captured[0].train_loss
    for replayed, alike in zip(captured, eager):  # equal up to kernels' rounding, amplified by Adam
        assert replayed.train_loss == pytest.approx(alike.train_loss, rel=1e-3)
        assert replayed.val_accuracy == pytest.approx(alike.val_accuracy, abs=0.03)


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
    cfg = PonderConfig.of(max_steps=6, **SMALL, hidden_lin=16)
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
    cfg = PonderConfig.of(max_steps=6, **SMALL, hidden_lin=16)
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


# --- the shipped models on CUDA against the CPU ----------------------------------------------

REAL_MNIST = os.environ.get("PONDER_DATA_DIR")


@pytest.mark.mnist  # the real test set: the conftest's hermetic folder would hide it
@pytest.mark.skipif(not REAL_MNIST or not (Path(REAL_MNIST) / "MNIST" / "raw" / "t10k-images-idx3-ubyte").exists(),
                    reason="real MNIST not found under $PONDER_DATA_DIR")
@pytest.mark.parametrize("name", ["reference", "align"])
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "fp16"])
def test_the_shipped_models_on_cuda_agree_with_the_cpu_within_a_tenth_of_a_point(name, amp):
    test = load_mnist(default_data_dir(), train=False, download=False)
    figures = {}
    for device in (CPU, GPU):
        model, cfg, _ = load_model(shipped_path(name), device)
        figures[device.type] = [evaluate(model, test.to(device), cfg, max_angle=angle, seed=cfg.training.seed,
                                         amp=amp and device.type == "cuda").accuracy for angle in (22.5, 45, 67.5, 90)]
    gaps = [100 * abs(a - b) for a, b in zip(figures["cpu"], figures["cuda"])]
    print(name, "amp" if amp else "fp32", "gaps in points", [round(g, 3) for g in gaps])
    assert max(gaps) <= 0.1


# --- precision ------------------------------------------------------------------------------------

def test_a_gpu_trains_in_float32_unless_asked_and_fp16_with_the_grad_scaler_when_asked(tiny_mnist, tmp_path, ponder):
    args = ["train", "--epochs", 1, "--max-steps", 3, "--val-size", 100, "--train-size", 300, "--batch-size", 50,
            "--device", "cuda", "--no-progress", "--data-dir", tiny_mnist]
    for amp, flag in ((False, []), (True, ["--amp"])):
        result = ponder(*args, *flag, "--out", tmp_path / str(amp))
        assert result.exit_code == 0, result.output
        assert json.loads((tmp_path / str(amp) / "config.json").read_text())["amp"] is amp
        assert (", amp float16" in result.stderr) is amp
        state = load_checkpoint(tmp_path / str(amp) / "last.pt")
        assert bool(state.scaler) is amp and (not amp or state.scaler["scale"] > 0)
        assert [h["training_step"] for h in state.history] == ["captured"]
