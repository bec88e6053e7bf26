"""The captured training step: BatchStep warms up, captures, checks its first replay and falls
back to the eager step when the capture fails or its replay does nothing; which path ran is in
the run's record; use_graphs asks every piece; Adam is capturable only while captured. A
stand-in for the CUDA graph (FakeGraph) plays the capture's part on the CPU. What a replay must
train and draw (k replayed batches against k eager ones, fresh dropout masks, rotations and
coins, parity's curriculum, the GradScaler's scale) runs on the CPU with the stand-in and, marked
`cuda`, with the real graph on a GPU where one is visible. And the CUDA path's mask on the CPU:
`train()` end to end with the truncation mask instead of the shrinking forward."""

import json
import sys

from types import SimpleNamespace

import pytest

import torch

from ponder_cli import PonderError
from ponder_cli import train as train_module
from ponder_cli.checkpoint import load_checkpoint, new_model
from ponder_cli.config import PonderConfig
from ponder_cli.tasks.mnist import load_mnist, train_val_split
from ponder_cli.model import get_method
from ponder_cli.tasks import get_task
from ponder_cli.train import (BACKED_OFF, CAPTURED, INPUTS, SKIPPED, WARMUP_BATCHES, batch_step, graph_pieces, train,
                              use_graphs)
from synthetic_data import synthetic_digits

CPU, GPU = torch.device("cpu"), torch.device("cuda")
ON_GPU = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
# the stand-in graph on the CPU, the real one on a GPU
DEVICES = [pytest.param(CPU, id="cpu"), pytest.param(GPU, id="cuda", marks=ON_GPU)]
CFG = PonderConfig.of(max_steps=4, truncation=0.05, batch_size=16, hidden=12, hidden_cnn=12, hidden_lin=12)
BATCHES = WARMUP_BATCHES + 4


class FakeGraph:
    """CudaGraph's part on the CPU: warm_up runs the batch, capture records it without running
    it, replay runs what was recorded. `broken`: "empty", a capture that records nothing (a
    capture on another device than the tensors'); "raises", a capture that fails."""

    def __init__(self, broken: str = "", log: list | None = None):
        self.broken, self.recorded, self.log = broken, None, log if log is not None else []

    def __call__(self, device, generators):  # the factory BatchStep calls
        return self

    def warm_up(self, run):
        self.log.append("warm_up")
        run()

    def capture(self, run):
        self.log.append("capture")
        if self.broken == "raises":
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        if isinstance(self.broken, BaseException):  # what else a capture raises
            raise self.broken
        self.recorded = None if self.broken == "empty" else run

    def replay(self):
        self.log.append("replay")
        if self.recorded is not None:
            self.recorded()

    def reset(self):
        self.log.append("reset")
        self.recorded = None


def _trained(graph=None, batches: int = BATCHES, poison_at: int | None = None):
    """A fresh seeded model trained on `batches` batches, eagerly or through `graph`; the step."""
    torch.manual_seed(0)
    model = new_model(CFG)
    lines = []
    step = batch_step(model, CFG, synthetic_digits(400, 0), graphs=graph is not None, graph=graph,
                      log=lines.append, shrink=False)
    model.train()
    step.source.start_epoch()
    for index in range(batches):
        if index == poison_at:
            with torch.no_grad():
                model.output_head.bias.fill_(float("nan"))
        step.source.stage(index)
        step()
    return step, [p.detach().clone() for p in model.parameters()], lines


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_capture_whose_replays_train_stays_captured():
    _, eager, _ = _trained()
    log = []
    step, replayed, lines = _trained(FakeGraph(log=log))
    assert step.path == CAPTURED and step.state == CAPTURED and lines == []
    assert log == ["warm_up"] * WARMUP_BATCHES + ["capture"] + ["replay"] * (BATCHES - WARMUP_BATCHES)
    assert step.replays == BATCHES - WARMUP_BATCHES  # capture engaged, counted
    assert _equal(eager, replayed)  # the replays trained exactly the eager batches


@pytest.mark.parametrize("broken, why", [
    ("empty", "the captured batch did nothing when replayed (the epoch's totals stood still)"),
    ("raises", "the capture failed (CUDA error: operation not permitted when stream is capturing)")])
def test_a_capture_that_fails_or_does_nothing_falls_back_to_the_eager_step(broken, why):
    _, eager, _ = _trained()
    log = []
    step, fallen_back, lines = _trained(FakeGraph(broken, log))
    assert step.path == f"eager: {why}" and not step.graphs and step.graph is None
    assert lines == [f"CUDA graphs: off, {why}; batches run eagerly"]  # one line, once
    assert log[-1] == "reset" and log.count("capture") == 1  # never tried again
    assert not any(group["capturable"] for group in step.optimizer.param_groups)
    assert _equal(eager, fallen_back)  # the batch the capture missed ran eagerly: nothing lost


@pytest.mark.parametrize("error", [
    AssertionError("capture_stream must not be None"),  # torch.cuda.graph's own checks
    NotImplementedError("an operation with no capturable kernel"),
    TypeError("cannot capture a host read")])
def test_a_capture_that_raises_anything_but_a_runtime_error_falls_back_too(error):
    _, eager, _ = _trained()
    step, fallen_back, lines = _trained(FakeGraph(error))
    assert step.path.startswith("eager: the capture failed") and str(error) in step.path
    assert len(lines) == 1 and lines[0].startswith("CUDA graphs: off, the capture failed")
    assert _equal(eager, fallen_back)


def test_an_interrupt_or_a_users_error_during_the_capture_is_not_swallowed():
    for error in (KeyboardInterrupt(), PonderError("the disk is full")):
        with pytest.raises(type(error)):
            _trained(FakeGraph(error))


def test_a_replay_that_leaves_adam_behind_falls_back(monkeypatch):
    """A partial capture: the replay counts the batch but the update never runs."""
    class NoUpdate(FakeGraph):
        def replay(self):
            with monkeypatch.context() as patched:
                patched.setattr(train_module, "step_unless", lambda optimizer, skip: None)
                super().replay()

    step, _, lines = _trained(NoUpdate())
    assert step.path == "eager: the captured batch did nothing when replayed (Adam's step count stood still)"
    assert len(lines) == 1
    # the batch the replay counted, then ran again eagerly, is counted once, as Adam counts it
    assert int(step.totals[INPUTS]) == BATCHES * CFG.training.batch_size
    assert float(step.taken) == BATCHES  # Adam's own count


def test_a_first_replay_whose_batch_is_skipped_is_no_false_alarm():
    """A non-finite batch at the first replay takes no step, by design: the check counts it as work."""
    step, _, lines = _trained(FakeGraph(), poison_at=WARMUP_BATCHES)
    assert step.path == CAPTURED and lines == [] and int(step.totals[SKIPPED]) == BATCHES - WARMUP_BATCHES


def test_adam_is_capturable_exactly_while_captured():
    """torch warns when a step marked capturable runs outside a capture, and refuses a capture of
    one that is not: eager warm-up unmarked, the capture and its replays marked."""
    seen = []

    class Watching(FakeGraph):
        def warm_up(self, run):
            seen.append(("warm_up", step.optimizer.param_groups[0]["capturable"]))
            run()

        def capture(self, run):
            seen.append(("capture", step.optimizer.param_groups[0]["capturable"]))
            super().capture(run)

    torch.manual_seed(0)
    model = new_model(CFG)
    step = batch_step(model, CFG, synthetic_digits(400, 0), graphs=True, graph=Watching(), shrink=False)
    assert step.optimizer.defaults["capturable"] is False  # made unmarked, whatever the device
    step.source.start_epoch()
    for index in range(WARMUP_BATCHES + 1):
        step.source.stage(index)
        step()
    assert seen == [("warm_up", False)] * WARMUP_BATCHES + [("capture", True)]


class _Piece:
    pass


def test_every_piece_must_declare_itself_graph_safe(monkeypatch):
    cfg = PonderConfig.of(max_steps=3)
    model, method = new_model(cfg), get_method(cfg)
    source = train_module._source(synthetic_digits(64, 0), cfg, CPU)
    pieces = graph_pieces(model, method, source, cfg)
    assert all(piece.graph_safe is True for piece in pieces.values())  # the built-ins say so
    lines = []
    assert use_graphs(GPU, True, pieces, lines.append) == CAPTURED
    assert lines == ["CUDA graphs: each training batch is captured once and replayed"]
    assert use_graphs(CPU, True, pieces, lines.append) == "eager: on the CPU" and len(lines) == 1
    assert use_graphs(GPU, False, pieces, lines.append) == "eager: --no-cuda-graphs" and len(lines) == 1
    # a piece of a user's own (an entry point's step) that does not declare it: eager, one line naming it
    third = {**pieces, "the step function 'mean'": _Piece()}
    assert use_graphs(GPU, True, third, lines.append) == \
        "eager: the step function 'mean' does not declare graph_safe = True"
    assert lines[-1] == "CUDA graphs: off, the step function 'mean' does not declare graph_safe = True; " \
                        "batches run eagerly"
    monkeypatch.setattr(train_module.distributed, "active", lambda: True)
    assert use_graphs(GPU, True, pieces) == "eager: under torchrun (DDP's gradient hooks are not captured)"


# The path a run took, in its record ---------------------------------------------------------------

def _data(tiny_mnist, cfg):
    return train_val_split(load_mnist(tiny_mnist, train=True, download=False), val_size=cfg.task.val_size,
                           train_size=cfg.task.train_size, seed=cfg.training.seed)


RUN = PonderConfig.of(epochs=2, max_steps=4, batch_size=64, val_size=100, hidden=16, hidden_cnn=16, hidden_lin=16,
                      lr_patience=0)


def test_the_path_each_epoch_took_is_in_the_checkpoint_and_reports(tiny_mnist, tmp_path, monkeypatch):
    """A CPU run: "eager: on the CPU"; a run whose capture fell back: that, and why, in each epoch
    of the checkpoint's history, the train report's JSON and footer, and `ponder info`."""
    from ponder_cli.listing import run_info
    from ponder_cli.reports.runs import training_report
    import io

    from ponder_cli.render import render_report

    def render(report, fmt):
        out = io.StringIO()
        render_report(report, fmt, file=out, width=200)
        return out.getvalue()
    from ponder_cli.tasks import get_task

    result = train(RUN.replace(epochs=1), *_data(tiny_mnist, RUN), device=CPU, out_dir=tmp_path / "cpu",
                   progress=False)
    assert [h.training_step for h in result.history] == ["eager: on the CPU"]

    monkeypatch.setattr(train_module, "use_graphs", lambda *args: CAPTURED)  # as on CUDA
    monkeypatch.setattr(train_module, "CudaGraph", FakeGraph("empty"))
    lines = []
    result = train(RUN, *_data(tiny_mnist, RUN), device=CPU, out_dir=tmp_path / "gpu", progress=False,
                   log=lines.append)
    why = "eager: the captured batch did nothing when replayed (the epoch's totals stood still)"
    assert [h.training_step for h in result.history] == [why, why]
    assert [line for line in lines if line.startswith("CUDA graphs")] == [f"CUDA graphs: off, {why[7:]}; "
                                                                          "batches run eagerly"]
    assert [h["training_step"] for h in load_checkpoint(tmp_path / "gpu" / "last.pt").history] == [why, why]
    report = training_report(RUN, result, 1.0, get_task(RUN).view())
    assert json.loads(render(report, "json"))["training_step"] == why
    assert f"training batches: {why}" in render(report, "table")
    info = run_info(tmp_path / "gpu")
    assert info.meta["training_step"] == why and {"what": "training batches", "value": why} in info.table_rows
    assert "training batches" not in [row["what"] for row in run_info(tmp_path / "cpu").table_rows]


# The CUDA path's mask, on the CPU -------------------------------------------------------------------

def test_train_end_to_end_with_the_truncation_mask_resumes_exactly_and_cuts_the_rate(tiny_mnist, tmp_path,
                                                                                    monkeypatch, truncated_steps):
    """What CUDA trains with (every step of every input at fixed shapes, truncation as a mask),
    run by `train()` on the CPU: checkpoints, a learning-rate cut, and a resume equal to training
    straight through; and the same training as the CPU's shrinking forward, to float rounding."""
    cfg = RUN.replace(epochs=3, truncation=0.1, lr_factor=0.5)
    validations = iter([0.5, 0.4, 0.3] * 3)  # epoch 1 the best, then none better: the rate is cut
    monkeypatch.setattr(type(get_task(cfg)), "validate", lambda *args: SimpleNamespace(
        accuracy=next(validations), mean_steps=2.0, histogram=[0, 1, 0, 0]))

    def run(out, epochs=3, resume=None):
        return train(cfg.replace(epochs=epochs), *_data(tiny_mnist, cfg), device=CPU, out_dir=tmp_path / out,
                     progress=False, resume=resume)

    monkeypatch.setattr(train_module, "drops_rows", lambda device: False)
    straight = run("straight")
    assert truncated_steps == []  # the mask, never the shrinking forward
    assert [h.lr for h in straight.history] == [cfg.training.lr, cfg.training.lr, cfg.training.lr * 0.5]
    run("resumed", epochs=1)
    resumed = run("resumed", resume=load_checkpoint(tmp_path / "resumed" / "last.pt"))
    assert [h.epoch for h in resumed.history] == [1, 2, 3]
    a, b = (load_checkpoint(tmp_path / name / "last.pt").model for name in ("straight", "resumed"))
    assert all(torch.equal(a[k], b[k]) for k in a)

    monkeypatch.setattr(train_module, "drops_rows", lambda device: True)
    validations = iter([0.5, 0.4, 0.3])
    shrinking = run("shrinking")
    assert truncated_steps  # the shrinking forward this time
    c = load_checkpoint(tmp_path / "shrinking" / "last.pt").model
    for key in a:
        torch.testing.assert_close(a[key], c[key], rtol=0, atol=1e-4)
    assert [h.lr for h in shrinking.history] == [h.lr for h in straight.history]


def _fresh(cfg) -> list:
    torch.manual_seed(0)
    return [p.detach() for p in new_model(cfg).parameters()]


@pytest.mark.parametrize("case", [dict(step="align"), dict(step="mlp", hidden_lin=12, truncation=0.2),
                                  dict(step="mlp", hidden_lin=12, method="act", truncation=0.05),
                                  dict(task="parity", step="gru", elems=8, truncation=0.2, batches_per_epoch=8,
                                       curriculum=0)],
                         ids=["align", "mlp", "mlp-act", "gru"])
def test_the_mask_and_the_shrinking_forward_train_on_the_same_draws(case):
    """In training mode, dropout on: every step's dropout is drawn per input before the steps run
    (align's and mlp's per-step masks), so the forward that drops inputs and the mask over every
    step draw the same numbers and train the same weights."""
    sizes = {} if case.get("task") == "parity" else dict(hidden=12, hidden_cnn=12)
    cfg = PonderConfig.of(max_steps=5, batch_size=16, **sizes, **case)
    weights = []
    for shrink in (True, False):
        torch.manual_seed(0)
        model = new_model(cfg)
        step = batch_step(model, cfg, synthetic_digits(200, 0) if cfg.task.name == "mnist" else None, shrink=shrink)
        model.train()
        step.source.start_epoch()
        for index in range(6):
            step.source.stage(index)
            step.run()
        weights.append([p.detach().clone() for p in model.parameters()])
    moved = max(float((p - q).abs().max()) for p, q in zip(weights[0], _fresh(cfg)))
    assert moved > 1e-3  # six steps of training, not a model left as it was
    for shrunk, masked in zip(*weights):
        torch.testing.assert_close(shrunk, masked, rtol=0, atol=1e-5)


# What a replay must train and draw: the stand-in graph on the CPU, the real one on a GPU ---------

SMALL = dict(hidden=16, hidden_cnn=16, val_size=100, batch_size=64)
# no dropout and no rotation: nothing random, so replayed and eager batches train on the same numbers
STILL = dict(cnn_dropout=0.0, mlp_dropout=0.0, train_rotation=0.0)
K = WARMUP_BATCHES + 3  # the warm-up, the capture and two replays


def _small(step: str = "mlp", **changes) -> PonderConfig:
    return PonderConfig.of(step=step, **SMALL, **({"hidden_lin": 16} if step == "mlp" else {}), **changes)


def _images(tiny_mnist, device):
    return load_mnist(tiny_mnist, train=True, download=False).subset(slice(0, 600)).to(device)


def _graph(device: torch.device):
    """What captures the batch: the stand-in on the CPU, None (train.CudaGraph) on a GPU."""
    return FakeGraph() if device.type == "cpu" else None


def _first_batches(cfg, data, device, graphs: bool, count: int, model=None, graph=None, **options):
    """A seeded model (or `model`) trained on the epoch's first `count` batches; the step and each
    batch's loss, read from the epoch's totals on the device after the batch."""
    torch.manual_seed(0)
    model = model or new_model(cfg).to(device)
    graph = (graph or _graph(device)) if graphs else None
    step = batch_step(model, cfg, data, graphs=graphs, graph=graph, shrink=False, **options)
    model.train()
    torch.manual_seed(1)  # the same permutation
    step.source.start_epoch()
    sums = [step.totals[0].clone()]
    for index in range(count):
        step.source.stage(index)
        step()
        sums.append(step.totals[0].clone())
    return step, torch.stack(sums).diff() / cfg.training.batch_size


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("step_name, changes", [("mlp", STILL), ("align", dict(cnn_dropout=0.0, train_rotation=0.0,
                                                                                max_steps=4)),
                                                ("mlp", dict(STILL, truncation=0.1))], ids=["mlp", "align", "mlp-cut"])
def test_k_replayed_batches_train_as_k_eager_batches(step_name, changes, device, tiny_mnist):
    """Compared by each batch's loss, not by the weights: Adam's first steps move a weight by about
    lr·sign(g), so a kernel's other summation order (a captured one may differ) moves weights by
    ~1e-3 but a batch's loss by ~1e-6, while a replay that trains a wrong batch, or one twice,
    moves the loss by ~1e-2. The weights are held to what 2·k Adam steps can move them."""
    cfg = _small(step_name, **changes)
    data = _images(tiny_mnist, device)
    eager, eager_losses = _first_batches(cfg, data, device, False, K)
    replayed, replayed_losses = _first_batches(cfg, data, device, True, K)
    assert replayed.state == CAPTURED and replayed.replays == K - WARMUP_BATCHES
    torch.testing.assert_close(replayed_losses, eager_losses, rtol=1e-5, atol=0)
    for a, b in zip(eager.params, replayed.params):
        assert float((a - b).detach().abs().max()) <= 2 * K * cfg.training.lr

    # one more batch from the replayed weights, replayed and eagerly: the same gradients, to rounding
    # (gradients carry no Adam amplification)
    weights = {name: value.clone() for name, value in replayed.model.state_dict().items()}
    replayed.source.stage(K)
    replayed()
    torch.manual_seed(0)
    same = new_model(cfg).to(device)
    same.load_state_dict(weights)
    check, _ = _first_batches(cfg, data, device, False, 0, model=same)
    check.source.stage(K)
    check.run()
    for a, b in zip(check.params, replayed.params):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6 * float(a.grad.abs().max()))


class Recorded:
    """Wraps a function so that every call, captured ones included, also copies its result (or
    `part` of it) into a buffer of its call site's, made at that site's first (eager) call: read
    after a replay, the buffers hold what that replay drew. One buffer per call site, as the mlp
    step draws two dropout masks of different shapes (its channels', its units')."""

    def __init__(self, real, part=lambda out: out):
        self.real, self.part, self.buffers = real, part, {}

    def __call__(self, *args, **kwargs):
        out = self.real(*args, **kwargs)
        value = self.part(out)
        caller = sys._getframe(1)
        site = (caller.f_code.co_filename, caller.f_lineno)
        if site not in self.buffers:
            self.buffers[site] = torch.empty_like(value)
        self.buffers[site].copy_(value)
        return out

    def drawn(self) -> dict:
        return {site: buffer.clone() for site, buffer in self.buffers.items()}


def _captured_step(cfg, data, device, **options):
    """A seeded step warmed up, captured and replayed once."""
    torch.manual_seed(0)
    model = new_model(cfg).to(device)
    step = batch_step(model, cfg, data, graphs=True, graph=_graph(device), shrink=False, **options)
    model.train()
    step.source.start_epoch()
    for index in range(WARMUP_BATCHES + 1):
        step.source.stage(index)
        step()
    assert step.state == CAPTURED and step.replays == 1
    return step


@pytest.mark.parametrize("device", DEVICES)
def test_two_replays_draw_fresh_dropout_masks_rotations_and_coins(device, tiny_mnist, monkeypatch):
    from ponder_cli import model
    from ponder_cli.steps import mlp
    from ponder_cli.tasks import mnist

    recorded = {"dropout masks": Recorded(mlp.dropout_mask), "rotations": Recorded(mnist.uniform_angles),
                "halting coins": Recorded(model.Roulette, part=lambda rule: rule.uniforms)}
    monkeypatch.setattr(mlp, "dropout_mask", recorded["dropout masks"])
    monkeypatch.setattr(mnist, "uniform_angles", recorded["rotations"])
    monkeypatch.setattr(model, "Roulette", recorded["halting coins"])
    cfg = _small("mlp", max_steps=6, truncation=0.2, truncation_rule="roulette", train_rotation=45.0)
    step = _captured_step(cfg, _images(tiny_mnist, device), device)
    draws = []
    for index in range(WARMUP_BATCHES + 1, WARMUP_BATCHES + 3):
        step.source.stage(index)
        step()
        draws.append({name: record.drawn() for name, record in recorded.items()})
    assert step.replays == 3
    assert len(recorded["dropout masks"].buffers) == 2  # the channels' mask and the units'
    first, second = draws
    for name in recorded:
        for site in first[name]:
            assert not torch.equal(first[name][site], second[name][site]), f"two replays drew the same {name}"
            assert first[name][site].float().std() > 0, name


@pytest.mark.parametrize("device", DEVICES)
def test_parity_curriculum_advances_under_replay(device, monkeypatch):
    from ponder_cli.tasks import parity

    tops = Recorded(parity.parity_batch, part=lambda drawn: (drawn.x != 0).sum(1).max())
    monkeypatch.setattr(parity, "parity_batch", tops)
    cfg = PonderConfig.of(task="parity", elems=16, hidden=32, batch_size=64, batches_per_epoch=40, curriculum=30,
                          curriculum_start=1)
    step = _captured_step(cfg, None, device)
    largest = []
    for index in range(WARMUP_BATCHES + 1, 30):
        step.source.stage(index)
        step()
        (drawn,) = tops.drawn().values()
        largest.append(int(drawn))
        assert largest[-1] <= int(step.source.top)  # never above the staged top
    assert largest[-1] > largest[0] + 5  # the curriculum reached the replays


@pytest.mark.parametrize("device", DEVICES)
def test_the_grad_scalers_scale_moves_under_replay(device, tiny_mnist, monkeypatch):
    """A scale far too large overflows fp16 at every batch: each replay halves it (a back-off,
    counted), as the eager step does. (fp16 autocast runs on the CPU too.)"""

    monkeypatch.setattr("ponder_cli.model.amp_dtype", lambda device: torch.float16)
    cfg = _small("mlp", **STILL)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0 ** 40)
    step = _captured_step(cfg, _images(tiny_mnist, device), device, amp=True, scaler=scaler)
    scales = [float(scaler.get_scale())]
    for index in range(WARMUP_BATCHES + 1, WARMUP_BATCHES + 4):
        step.source.stage(index)
        step()
        scales.append(float(scaler.get_scale()))
    assert scales[1:] == [scales[0] / 2 ** k for k in (1, 2, 3)]
    assert int(step.totals[BACKED_OFF]) == WARMUP_BATCHES + 4 and step.replays == 4


# A capture that fails after the GradScaler's unscale_ ---------------------------------------------

def _failing_after_unscale(device, monkeypatch):
    """What BatchStep captures with: a capture that fails right after the batch's unscale_ (on a
    GPU by a host read, which torch refuses while the stream captures)."""
    real = torch.amp.GradScaler.unscale_

    def unscale_then_fail(scaler, optimizer):
        real(scaler, optimizer)
        if device.type == "cuda":
            torch.ones((), device=device).item()
        raise RuntimeError("operation not permitted when stream is capturing")

    class Failing(FakeGraph if device.type == "cpu" else train_module.CudaGraph):
        def capture(self, run):
            with monkeypatch.context() as patched:
                patched.setattr(torch.amp.GradScaler, "unscale_", unscale_then_fail)
                # a capture runs the batch's Python to the failure (the stand-in its kernels too)
                run() if device.type == "cpu" else super().capture(run)
    return Failing() if device.type == "cpu" else Failing


def _fp16(monkeypatch) -> dict:
    """fp16 autocast with the GradScaler, on the CPU as well."""

    monkeypatch.setattr("ponder_cli.model.amp_dtype", lambda device: torch.float16)
    return dict(amp=True)


@pytest.mark.parametrize("device", DEVICES)
def test_a_capture_failing_after_unscale_falls_back_and_trains_on_under_fp16(device, tiny_mnist, monkeypatch):
    """torch refuses a second unscale_ of one optimizer between two updates: the eager rerun of the
    batch the capture failed on must not meet the record of the first."""
    cfg = _small("mlp", **STILL)
    data = _images(tiny_mnist, device)
    amp = _fp16(monkeypatch)
    count = WARMUP_BATCHES + 2
    eager, eager_losses = _first_batches(cfg, data, device, False, count, **amp)
    lines = []
    fallen, fallen_losses = _first_batches(cfg, data, device, True, count, log=lines.append,
                                           graph=_failing_after_unscale(device, monkeypatch), **amp)
    assert fallen.scaler.is_enabled() and fallen.path.startswith("eager: the capture failed (") and len(lines) == 1
    torch.testing.assert_close(fallen_losses, eager_losses, rtol=1e-5, atol=0)  # every batch trained, once
    assert float(fallen.taken) == float(eager.taken) and fallen.scaler.get_scale() == eager.scaler.get_scale()


@pytest.mark.parametrize("device", DEVICES)
def test_after_a_failed_capture_the_eager_batches_draw_fresh_dropout_masks(device, tiny_mnist, monkeypatch):
    """A capture puts the generators it draws from in capture mode (a draw becomes an offset into
    the graph's) and the capture stream in use: one that fails must leave both, so that the
    eager batches after it draw afresh, batch after batch, where they ran before."""
    from ponder_cli.steps import mlp

    masks = Recorded(mlp.dropout_mask)
    monkeypatch.setattr(mlp, "dropout_mask", masks)
    amp = _fp16(monkeypatch)
    step, _ = _first_batches(_small("mlp", max_steps=4), _images(tiny_mnist, device), device, True,
                             WARMUP_BATCHES + 1, graph=_failing_after_unscale(device, monkeypatch),
                             log=[].append, **amp)
    assert step.path.startswith("eager: the capture failed (")
    if device.type == "cuda":
        assert not torch.cuda.is_current_stream_capturing()
        assert torch.cuda.current_stream(device) == torch.cuda.default_stream(device)
    draws = []
    for index in (WARMUP_BATCHES + 1, WARMUP_BATCHES + 2):
        step.source.stage(index)
        step()
        draws.append(masks.drawn())
    assert len(draws[0]) == 2  # the channels' mask and the units'
    for site in draws[0]:
        assert not torch.equal(draws[0][site], draws[1][site]), "two eager batches drew the same dropout mask"
