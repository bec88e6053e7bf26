"""The CUDA training path, as far as the CPU can run it: fp16 with the GradScaler, its back-offs
against real non-finite batches, checkpoints moving between device counts, fused Adam's state,
DDP's unused-parameter search, and the signal watcher that unblocks a rank stuck on nccl."""

import math
import os
import signal
import time
from pathlib import Path

import pytest
import torch

import ponder_cli
from ponder_cli import PonderError, distributed
from ponder_cli import train as train_module
from ponder_cli.checkpoint import load_checkpoint, save_checkpoint
from ponder_cli.config import PonderConfig
from ponder_cli.tasks.mnist import load_mnist, train_val_split
from ponder_cli.checkpoint import new_model
from ponder_cli.tasks import get_task
from ponder_cli.model import PonderNetMethod, amp_dtype, grad_scaler
from ponder_cli.train import batch_step, make_optimizer, train, train_one_epoch

import processes

REPO = Path(ponder_cli.__file__).resolve().parent.parent
CFG = PonderConfig.of(epochs=2, max_steps=3, batch_size=8, val_size=50, hidden=16, hidden_cnn=16, hidden_lin=16)
CPU = torch.device("cpu")


def _data(tiny_mnist):
    """76 training images: 10 batches of 8 (the last of 4); fp16 on the CPU is slow."""
    return train_val_split(load_mnist(tiny_mnist, train=True, download=False), val_size=50, train_size=76, seed=1)


@pytest.fixture
def fp16_on_cpu(monkeypatch):
    """Autocast computes in fp16 on the CPU, so training runs the GradScaler as it does on CUDA."""
    monkeypatch.setattr("ponder_cli.model.amp_dtype", lambda device: torch.float16)


def _every(calls: set[int], change):
    """Wrap a function so that its n-th calls (1-based) in `calls` return change(result)."""
    count = {"n": 0}

    def wrapper(real):
        def wrapped(*args, **kwargs):
            result = real(*args, **kwargs)
            count["n"] += 1
            return change(result) if count["n"] in calls else result
        return wrapped
    return wrapper


def _overflow_at(monkeypatch, calls: set[int]):
    """The scaled loss of those batches is 2**100 times too large: finite in float32, but the
    fp16 backward pass overflows, as it does when the GradScaler's scale is too high."""
    wrap = _every(calls, lambda scaled: scaled * 2.0 ** 100)
    monkeypatch.setattr(torch.amp.GradScaler, "scale", wrap(torch.amp.GradScaler.scale))


def _nan_loss_at(monkeypatch, calls: set[int]):
    wrap = _every(calls, lambda parts: parts._replace(total=parts.total * float("nan")))
    monkeypatch.setattr(PonderNetMethod, "loss", wrap(PonderNetMethod.loss))


# --- fp16 and the GradScaler ----------------------------------------------------------------------

def test_the_grad_scaler_is_on_exactly_for_fp16(fp16_on_cpu):
    assert grad_scaler(CPU, True).is_enabled()
    assert not grad_scaler(CPU, False).is_enabled()


def test_bf16_needs_no_grad_scaler():
    assert amp_dtype(CPU) == torch.bfloat16 and not grad_scaler(CPU, True).is_enabled()


def test_mixed_precision_is_off_unless_asked_on_a_gpu_too(monkeypatch):
    """float32 by default everywhere (under CUDA graphs it is the faster choice for align and
    parity); --amp is fp16 with the GradScaler on CUDA, bf16 on the CPU."""
    import ponder_cli.api as api

    monkeypatch.setattr(api, "resolve_device", torch.device)  # a GPU, as far as the rule can tell
    for device in ("cuda", "cuda:1", "cpu"):
        assert api.device_and_amp(device, None) == (torch.device(device), False)
        assert api.device_and_amp(device, True) == (torch.device(device), True)
    assert amp_dtype(torch.device("cuda")) == torch.float16


def test_fp16_back_offs_are_told_from_non_finite_batches(fp16_on_cpu, monkeypatch, tiny_mnist, tmp_path):
    _overflow_at(monkeypatch, {2, 5})  # epoch 1: two overflows...
    _nan_loss_at(monkeypatch, {7})  # ... and one batch whose loss is NaN
    result = train(CFG, *_data(tiny_mnist), device=CPU, out_dir=tmp_path, amp=True, progress=False)
    assert [(h.skipped_batches, h.scaler_backoffs) for h in result.history] == [(1, 2), (0, 0)]
    assert all(math.isfinite(h.train_loss) for h in result.history)
    state = load_checkpoint(tmp_path / "last.pt")
    # each of the three halved the scale (2**16 at first; it grows only after 2000 clean steps)
    assert state.scaler["scale"] == 2.0 ** 16 / 2 ** 3
    assert all(torch.isfinite(p).all() for p in state.model.values())
    assert state.history[0]["scaler_backoffs"] == 2


def test_back_offs_leave_the_weights_and_count_in_the_metrics(fp16_on_cpu, monkeypatch, tiny_mnist):
    """A backed-off batch does not step, but its loss (finite) counts in the epoch's metrics; a
    non-finite batch does neither."""
    train_set, _ = _data(tiny_mnist)
    data = train_set.subset(slice(0, 16))  # two batches
    torch.manual_seed(0)
    model = new_model(CFG)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = make_optimizer(model, CFG, CPU)
    _overflow_at(monkeypatch, {1, 2})
    stats = train_one_epoch(batch_step(model, CFG, data, amp=True, optimizer=optimizer,
                                       scaler=grad_scaler(CPU, True)), progress=False)
    assert (stats["skipped_batches"], stats["scaler_backoffs"], stats["batches"]) == (0, 2, 2)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert math.isfinite(stats["loss"]) and stats["loss"] > 0


def test_an_epoch_of_non_finite_batches_stops_training(fp16_on_cpu, monkeypatch, tiny_mnist, tmp_path):
    _nan_loss_at(monkeypatch, set(range(1, 11)))
    with pytest.raises(PonderError) as raised:
        train(CFG.replace(epochs=1), *_data(tiny_mnist), device=CPU, out_dir=tmp_path, amp=True, progress=False)
    # no last.pt to speak of: the first epoch is the one that failed
    assert str(raised.value) == (f"epoch 1: every batch had a non-finite loss or gradient; training stopped, no "
                                 f"epoch was saved in {tmp_path} (try a lower --lr)")


def test_an_epoch_of_grad_scaler_back_offs_is_not_an_error(fp16_on_cpu, monkeypatch, tiny_mnist, tmp_path):
    """Every batch overflowed fp16 at the scale of the time: the scale halved each time and no
    step was taken, but nothing is wrong with the batches or the learning rate; training goes on."""
    torch.manual_seed(CFG.training.seed)
    start = new_model(CFG).state_dict()
    _overflow_at(monkeypatch, set(range(1, 11)))
    result = train(CFG.replace(epochs=1), *_data(tiny_mnist), device=CPU, out_dir=tmp_path, amp=True,
                   progress=False)
    (epoch,) = result.history
    assert (epoch.skipped_batches, epoch.scaler_backoffs) == (0, 9) and math.isfinite(epoch.train_loss)
    state = load_checkpoint(tmp_path / "last.pt")
    assert state.scaler["scale"] == 2.0 ** 16 / 2 ** 9  # 9 whole batches
    assert all(torch.equal(start[k], v) for k, v in state.model.items())  # not one step taken


def test_fp16_checkpoints_resume_with_their_scale(fp16_on_cpu, monkeypatch, tiny_mnist, tmp_path):
    _overflow_at(monkeypatch, {3})
    train(CFG.replace(epochs=1), *_data(tiny_mnist), device=CPU, out_dir=tmp_path, amp=True, progress=False)
    assert load_checkpoint(tmp_path / "last.pt").scaler["scale"] == 2.0 ** 15
    result = train(CFG, *_data(tiny_mnist), device=CPU, out_dir=tmp_path, amp=True, progress=False,
                   resume=load_checkpoint(tmp_path / "last.pt"))
    assert [h.scaler_backoffs for h in result.history] == [1, 0]
    assert load_checkpoint(tmp_path / "last.pt").scaler["scale"] == 2.0 ** 15


def test_history_written_before_back_offs_were_counted_still_loads(tiny_mnist, tmp_path):
    train(CFG.replace(epochs=1), *_data(tiny_mnist), device=CPU, out_dir=tmp_path, progress=False)
    state = load_checkpoint(tmp_path / "last.pt")
    for record in state.history:
        del record["scaler_backoffs"]
    save_checkpoint(state, tmp_path / "last.pt")
    result = train(CFG, *_data(tiny_mnist), device=CPU, out_dir=tmp_path, progress=False,
                   resume=load_checkpoint(tmp_path / "last.pt"))
    assert [h.scaler_backoffs for h in result.history] == [0, 0]


# --- random number generators across devices ----------------------------------------------------

FAKE_CUDA_STATES = [torch.full((16,), k, dtype=torch.uint8) for k in range(4)]  # one per GPU of a 4-GPU host


def test_a_checkpoint_from_a_four_gpu_host_resumes_on_the_cpu(tiny_mnist, tmp_path):
    """Before, resuming set every saved GPU's state (IndexError with fewer GPUs, a traceback).
    The CPU ignores the CUDA states: the run continues exactly as it would have."""
    data = _data(tiny_mnist)
    straight = train(CFG, *data, device=CPU, out_dir=tmp_path / "straight", progress=False)
    train(CFG.replace(epochs=1), *data, device=CPU, out_dir=tmp_path / "moved", progress=False)
    state = load_checkpoint(tmp_path / "moved" / "last.pt")
    state.rng["cuda"] = list(FAKE_CUDA_STATES)  # as get_rng_state_all wrote it on that host
    save_checkpoint(state, tmp_path / "moved" / "last.pt")
    resumed = train(CFG, *data, device=CPU, out_dir=tmp_path / "moved", progress=False,
                    resume=load_checkpoint(tmp_path / "moved" / "last.pt"))
    assert resumed.history[-1].train_loss == straight.history[-1].train_loss
    a, b = (load_checkpoint(tmp_path / run / "last.pt").model for run in ("straight", "moved"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_an_unfused_adam_checkpoint_resumes_fused_and_the_other_way(tmp_path):
    """Adam's param groups record how it ran (earlier versions: unfused on the CPU, a float
    learning rate); a resumed optimizer keeps its own implementation and its learning-rate
    tensor, given the saved value."""
    torch.manual_seed(0)
    model = new_model(CFG)
    plain = torch.optim.Adam(model.parameters(), lr=5e-4)  # as every CPU run before 0.3 saved it
    model(torch.randn(4, 1, 28, 28)).logits.sum().backward()
    plain.step()
    fused = make_optimizer(model, CFG, CPU)
    rate = fused.param_groups[0]["lr"]
    train_module._load_optimizer_state(fused, plain.state_dict())
    assert fused.param_groups[0]["fused"] is True and fused.param_groups[0]["lr"] is rate
    assert train_module.learning_rate(fused.param_groups[0]["lr"]) == 5e-4
    step = fused.state[next(iter(model.parameters()))]["step"]
    assert step.device.type == "cpu" and float(step) == 1
    fused.step()  # fused needs its step counters as float32 tensors beside the parameters
    again = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_module._load_optimizer_state(again, train_module._optimizer_state(fused))
    assert again.param_groups[0]["fused"] is None and again.param_groups[0]["lr"] == 5e-4
    again.step()
    assert float(again.state[next(iter(model.parameters()))]["step"]) == 3


def test_a_run_checkpoints_a_fused_adam_with_a_float_learning_rate(tiny_mnist, tmp_path):
    """Every device trains with a fused Adam whose learning rate is a tensor (a captured step reads
    it); the checkpoint records the implementation and the rate as a float, as before."""
    train(CFG.replace(epochs=1), *_data(tiny_mnist), device=CPU, out_dir=tmp_path, progress=False)
    groups = load_checkpoint(tmp_path / "last.pt").optimizer["param_groups"]
    assert [group["fused"] for group in groups] == [True]
    assert [type(group["lr"]) for group in groups] == [float] and groups[0]["lr"] == CFG.training.lr


def test_the_plateau_schedule_cuts_the_learning_rate_tensor_in_place():
    model = new_model(CFG)
    optimizer = make_optimizer(model, CFG, CPU)
    rate = optimizer.param_groups[0]["lr"]
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=0.1, patience=0)
    for accuracy in (0.5, 0.4):
        scheduler.step(accuracy)
    assert optimizer.param_groups[0]["lr"] is rate
    assert train_module.learning_rate(optimizer.param_groups[0]["lr"]) == CFG.training.lr * 0.1


# --- DDP: which configurations need the unused-parameter search -----------------------------------

TURN = ["step.turn.weight", "step.turn.bias", "step.view_turn.weight", "step.view_turn.bias"]


@pytest.mark.parametrize("options, left_out", [
    (dict(step="mlp", hidden_lin=16, truncation=0.05), ["step.mlp.from_state.weight"]),  # h_0 = 0 meets it from step 2 on
    (dict(method="plain", hidden_lin=16), ["step.mlp.from_state.weight"]),
    # the turn acts on the view from step 2 on; halting reads it (align's defaults) detached
    (dict(step="align"), TURN),
    (dict(step="align", halting_input="state", turn_gate=0.0), TURN),
    (dict(step="align", halting_input="state", turn_gate=0.2), TURN),  # the gate reads it detached
])
def test_parameters_a_one_step_forward_leaves_out(options, left_out):
    torch.manual_seed(0)
    cfg = PonderConfig.of(hidden=16, hidden_cnn=16, **options)
    model = new_model(cfg)
    before = torch.get_rng_state()
    assert model.left_out_by_one_step(get_task(cfg).example_input(2, "cpu")) == left_out
    assert torch.equal(torch.get_rng_state(), before)  # the training stream is untouched
    assert all(p.grad is None for p in model.parameters())


# --- nccl: a rank blocked on a dead peer ----------------------------------------------------------

def _watched(on_signal, wait: float) -> None:
    import threading
    unblock, started = threading.Event(), time.monotonic()

    def handler(signum, frame):
        print(f"handler ran after {time.monotonic() - started:.1f} s", flush=True)
        on_signal()

    signal.signal(signal.SIGTERM, handler)
    distributed.abort_when_signal_unanswered(1.0, abort=lambda: (print("aborted", flush=True), unblock.set()))
    # The main thread cannot run the handler, as inside a CUDA wait: the signal, sent once it
    # waits, goes to the watcher's thread, and the main thread waits on what only the abort ends.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
    unblock.wait(wait)
    for _ in range(100):  # Python code again: the pending handler runs
        pass
    print("no handler ran", flush=True)


def _raise_143():
    raise SystemExit(143)


def _exit_143():
    os._exit(143)


def _run_watcher(on_signal, wait: float) -> list[str]:
    with processes.fork(_watched, on_signal, wait) as proc:
        stdout, _ = proc.communicate(timeout=60)
    return stdout.splitlines()


def test_an_unanswered_sigterm_aborts_the_process_group_so_the_handler_runs():
    lines = _run_watcher(_raise_143, wait=30)
    assert len(lines) == 2 and lines[0] == "aborted" and lines[1].startswith("handler ran after"), lines
    assert 1.1 <= float(lines[1].split()[3]) < 10  # signal + grace, long before the wait would end


def test_a_process_that_acts_on_the_signal_is_not_aborted():
    # the main thread's wait ends by itself, after the signal but before the grace is over, and
    # the handler leaves at once
    lines = _run_watcher(_exit_143, wait=0.5)
    assert len(lines) == 1 and lines[0].startswith("handler ran after"), lines


@pytest.mark.parametrize("environment, handling", [("1", "2"), (None, "2"), ("3", "3"), ("0", "0")],
                         ids=["torchrun's-own", "unset", "user-3", "user-0"])
def test_nccl_stops_on_errors_without_ending_the_process(environment, handling, monkeypatch):
    """TORCH_NCCL_ASYNC_ERROR_HANDLING=2: the watchdog aborts the communicators and the next
    collective raises (torch's default, 3, kills the process with no resume hint). torchrun hands
    every process 1 unless its own environment says otherwise: that 1 is replaced, a user's other
    value wins. (nccl itself cannot run here; this checks what setup() asks of it.)"""
    seen = {}
    if environment is None:
        monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    else:
        monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", environment)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend, **kwargs: seen.update(
        backend=backend, handling=os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")))
    monkeypatch.setattr(torch.distributed, "barrier", lambda: None)
    watched = []
    monkeypatch.setattr(distributed, "abort_when_signal_unanswered", lambda grace: watched.append(grace))
    distributed.setup(torch.device("cuda", 0), distributed.Launch(0, 0, 2))
    assert seen == {"backend": "nccl", "handling": handling} and watched == [distributed.ABORT_AFTER_SIGNAL_S]


def test_torchrun_hands_its_processes_nccl_error_handling_1():
    """What the test above stands for: torchrun's agent sets the variable for every worker, 1
    unless its own environment holds one (read in torch's source, so a torch that changes it
    fails here)."""
    import inspect

    from torch.distributed.elastic.agent.server import local_elastic_agent

    source = inspect.getsource(local_elastic_agent)
    assert '"TORCH_NCCL_ASYNC_ERROR_HANDLING": os.getenv(' in source
    assert distributed.TORCHRUN_NCCL_ERROR_HANDLING == "1" and \
        '"TORCH_NCCL_ASYNC_ERROR_HANDLING", str(1)' in source


def test_gloo_needs_no_watcher(monkeypatch):
    watched = []
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend, **kwargs: None)
    monkeypatch.setattr(torch.distributed, "barrier", lambda: None)
    monkeypatch.setattr(distributed, "abort_when_signal_unanswered", lambda grace: watched.append(grace))
    distributed.setup(CPU, distributed.Launch(0, 0, 2))
    assert watched == []


def test_epoch_line_tells_backoffs_from_skipped_batches():
    from ponder_cli.render import epoch_line
    from ponder_cli.train import EpochStats

    stats = EpochStats(epoch=3, train_loss=0.5, train_reconstruction=0.4, train_regularisation=10.0,
                       train_accuracy=0.9, train_steps=4.0, val_accuracy=0.95, val_steps=3.5, lr=1e-3,
                       seconds=12.0, improved=False, skipped_batches=1, scaler_backoffs=2)
    line = epoch_line(stats, 20)
    assert line.endswith("12.0s  (1 non-finite batches skipped)  (2 fp16 back-offs)")
    assert "back-offs" not in epoch_line(EpochStats(**{**stats.__dict__, "scaler_backoffs": 0}), 20)
