"""The training batch is safe to capture as a CUDA graph, proved on the CPU.

A captured graph replays the device work of one batch: it cannot run what needs the host to
read a value (`.item()`, `bool(t)`, a boolean mask's `nonzero`), a tensor made from Python data
(a host-to-device copy), or a draw from a generator the capture does not know, and it replays
the same kernels on buffers of the same shapes. A TorchDispatchMode sees every operator that
BatchStep.run issues, for every task x step x method and each truncation rule: none may be one
of those, and two different batches must issue the same operators on the same shapes with the
same Python values (a value that changes per batch would stay the captured batch's), none may
make a tensor without a device (a host tensor on CUDA), and the source's static inputs must keep
their storage when the next batch is staged (the replay reads the captured storage). Each of
these hazards is shown caught below, on the real code changed the way it would break.
Evaluation's full forward with a rule applied on the device is held to the same.
"""

import pytest
import torch

from ponder_cli.checkpoint import new_model
from ponder_cli.config import PonderConfig
from ponder_cli.model import autocast, get_method, truncate
from ponder_cli.train import SKIPPED, WARMUP_BATCHES, BatchStep, batch_step, freeze_body, step_unless, training_mode
from host_reads import Operators
from synthetic_data import synthetic_digits

SMALL_IMAGES = dict(hidden=12, hidden_cnn=12, batch_size=16)
SMALL_VECTORS = dict(task="parity", elems=8, hidden=12, batch_size=16, batches_per_epoch=8, curriculum=6,
                     curriculum_start=2)

# task x step x method, and the truncation rules (cut, roulette, ACT's) and AMP's paths
CASES = [
    dict(step="mlp", method="pondernet"), dict(step="mlp", method="pondernet", truncation=0.05),
    dict(step="mlp", method="pondernet", truncation=0.3, truncation_rule="roulette"),
    dict(step="mlp", method="act", truncation=0.05), dict(step="mlp", method="act"), dict(step="mlp", method="plain"),
    dict(step="align", method="pondernet", max_steps=4), dict(step="align", method="act", max_steps=4),
    dict(step="align", method="plain"),
    dict(step="gru", method="pondernet", **SMALL_VECTORS), dict(step="gru", method="act", **SMALL_VECTORS),
    dict(step="gru", method="plain", **SMALL_VECTORS), dict(step="rnn", method="pondernet", **SMALL_VECTORS),
    dict(step="rnn", method="act", truncation=0.05, **SMALL_VECTORS), dict(step="rnn", method="plain", **SMALL_VECTORS),
    dict(step="gru", method="pondernet", truncation=0.2, truncation_rule="roulette", **SMALL_VECTORS),
    # the halting study's training settings: a warm-up read from the device, a uniform prior, a
    # random depth drawn on the device, alone and with the cut
    dict(step="align", method="pondernet", max_steps=4, beta_warmup=3, prior="uniform", depth_min=2),
    dict(step="mlp", method="pondernet", truncation=0.05, depth_min=1),
    dict(step="gru", method="pondernet", depth_min=3, beta_warmup=2, **SMALL_VECTORS),
    # a halting head trained on the answer it reads: the targets and the features made on the device
    dict(step="align", method="pondernet", max_steps=4, truncation=0.0, halting_target="final",
         halting_input="state+turn+answer"),
    dict(step="mlp", method="pondernet", halting_target="correct", halting_input="state+confidence+answer"),
]


def _config(case: dict) -> PonderConfig:
    sizes = {} if case.get("task") == "parity" else dict(SMALL_IMAGES, **({"hidden_lin": 12} if case["step"] == "mlp"
                                                                           else {}))
    if case["method"] != "plain":
        case = {"max_steps": 5, **case}
    return PonderConfig.of(**sizes, **case)


def _step(cfg: PonderConfig, *, amp: bool = False, scaler=None) -> BatchStep:
    torch.manual_seed(0)
    model = new_model(cfg)
    data = synthetic_digits(80, 0) if cfg.task.name == "mnist" else None
    return batch_step(model, cfg, data, amp=amp, scaler=scaler, shrink=False)


def static_inputs(source) -> dict:
    """The source's static inputs: the tensors it holds (MNIST's staged rows, parity's top count),
    by name; the epoch's draws made by start_epoch (MNIST's permutation) are held apart by name."""
    return {name: value for name, value in vars(source).items() if isinstance(value, torch.Tensor)
            and name != "order"}


def device_state(step: BatchStep) -> list:
    """The tensors a batch reads and writes in place, whose values differ between batches by design."""
    optimizer_state = [value for state in step.optimizer.state.values() for value in state.values()]
    rates = [group["lr"] for group in step.optimizer.param_groups]
    scaler = [getattr(step.scaler, name) for name in ("_scale", "_growth_tracker") if hasattr(step.scaler, name)]
    return [*step.params, *optimizer_state, *rates, *scaler, step.totals, step.taken, *static_inputs(step.source).values()]


def _watched_batches(step: BatchStep, count: int = 2) -> list[Operators]:
    """Warm up as a capture would, then watch `count` more batches of the epoch, each staged
    after the Python side of the source moved on (another index; parity: its curriculum further),
    the static inputs checked to keep their storage across each stage()."""
    training_mode(step.model, step.cfg)
    step.source.start_epoch()
    for index in range(WARMUP_BATCHES):
        step.source.stage(index)
        step.run()
    watches = []
    for index in range(WARMUP_BATCHES, WARMUP_BATCHES + count):
        storage = {name: tensor.data_ptr() for name, tensor in static_inputs(step.source).items()}
        step.source.stage(index)
        moved = [name for name, tensor in static_inputs(step.source).items() if tensor.data_ptr() != storage[name]]
        assert not moved, f"stage() re-allocated the static inputs {moved}: a replay would read the old ones"
        with Operators(step.source.generators(), device_state(step)) as watch:
            step.run()
        watches.append(watch)
    return watches


def _case_id(case):
    return "-".join(f"{value}" for key, value in case.items() if key in ("task", "step", "method", "truncation",
                                                                          "truncation_rule", "depth_min", "prior",
                                                                          "halting_target"))


def assert_graph_safe(step: BatchStep) -> None:
    """The proof, on two batches of `step`: no problem, and the same operators on the same shapes
    and values (a replay fits every batch); stage() keeps the static inputs (_watched_batches)."""
    first, second = _watched_batches(step)
    assert first.problems == [] and second.problems == []
    assert len(first.ops) > 50  # the watch saw the batch
    different = [(a, b) for a, b in zip(first.ops, second.ops) if a != b]
    assert len(first.ops) == len(second.ops) and not different, different[:3]


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_a_training_batch_reads_nothing_on_the_host_and_repeats_its_operators(case):
    assert_graph_safe(_step(_config(case)))


def test_a_refit_batch_trains_the_new_head_alone_and_is_graph_safe():
    # --init-from CHECKPOINT --refit-halting: the body frozen (no gradient, no optimizer state) and
    # run without dropout, the head reading the answer; the batch as safe to capture as any
    cfg = _config(dict(step="mlp", method="pondernet", halting_target="final", halting_input="state+answer",
                       refit_halting=True))
    torch.manual_seed(0)
    model = new_model(cfg)
    freeze_body(model)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    step = batch_step(model, cfg, synthetic_digits(80, 0), shrink=False)
    assert_graph_safe(step)
    assert not model.step.training and model.training  # the body as at evaluation, the rest training
    changed = sorted(name for name, p in model.named_parameters() if not torch.equal(p, before[name]))
    assert changed == ["halting_head.bias", "halting_head.weight"]


def test_the_two_batches_compared_differ_on_the_python_side():
    """What makes the comparison above worth making: between the two batches the source's own
    Python state moves on (parity's curriculum raises its top count), so a value read from it
    inside the batch would differ; the batches still issue the same operators."""
    step = _step(_config(dict(step="gru", method="pondernet", **SMALL_VECTORS)))
    tops = []
    original = step.source.stage

    def stage(index):
        original(index)
        tops.append(int(step.source.top))
    step.source.stage = stage
    _watched_batches(step)
    assert tops[-2] < tops[-1]  # the curriculum moved between the watched batches


def test_the_graph_safe_batch_draws_parity_vectors_from_the_sources_generator_only():
    step = _step(_config(dict(step="gru", method="pondernet", **SMALL_VECTORS)))
    (watch,) = _watched_batches(step, 1)
    drawing = [op for op, _ in watch.ops if "rand" in op or "uniform" in op]
    assert drawing and watch.problems == []
    # and a generator the watch does not know is caught
    with pytest.raises(AssertionError):
        with Operators() as stranger:
            torch.rand(3, generator=torch.Generator().manual_seed(0))
        assert stranger.problems == []


@pytest.mark.parametrize("scaled", [False, True], ids=["bf16", "fp16-grad-scaler"])
def test_mixed_precision_batches_are_graph_safe_too(scaled):
    cfg = _config(dict(step="mlp", method="pondernet", truncation=0.05))
    scaler = torch.amp.GradScaler("cpu", enabled=True) if scaled else None
    first, second = _watched_batches(_step(cfg, amp=True, scaler=scaler))
    assert first.problems == [] and second.problems == [] and first.ops == second.ops


# Each hazard, caught: the real code changed the way it would break a capture --------------------

MLP = dict(step="mlp", method="pondernet", truncation=0.05)


def test_a_random_draw_made_on_the_host_and_moved_to_the_device_is_caught(monkeypatch):
    """`torch.rand(n).to(device)`: on CUDA a host tensor, drawn once at capture and copied up by
    every replay, the same mask forever. The real dropout mask draws on the device."""
    from ponder_cli.steps import mlp

    assert_graph_safe(_step(_config(MLP)))

    def on_the_host(shape, p, like):
        return (torch.rand(shape) < 1 - p).to(like.device).to(like.dtype).div_(1 - p)
    monkeypatch.setattr(mlp, "dropout_mask", on_the_host)
    first, _ = _watched_batches(_step(_config(MLP)))
    # both of the step's dropout draws (the CNN's channels, the MLP's units), and nothing else
    assert first.problems and {problem.split(":")[0] for problem in first.problems} == \
        {"rand without a device at tests/test_graph_safe.py"}


def test_a_python_value_that_changes_per_batch_read_inside_the_batch_is_caught(monkeypatch):
    """A Python number read inside the batch (here: the loss weighed by how many batches ran) is
    captured as the value of the capture's batch and replayed unchanged."""
    from ponder_cli.model import PonderNetMethod

    assert_graph_safe(_step(_config(MLP)))
    real_loss, batches = PonderNetMethod.loss, [0]

    def weighed(self, *args, **kwargs):
        batches[0] += 1
        parts = real_loss(self, *args, **kwargs)
        return parts._replace(total=parts.total * (1 + batches[0] / 100))
    monkeypatch.setattr(PonderNetMethod, "loss", weighed)
    with pytest.raises(AssertionError, match="mul"):
        assert_graph_safe(_step(_config(MLP)))


def test_a_host_scalar_made_before_the_batch_is_seen_by_its_value(monkeypatch):
    """The same value held in a 0-dim tensor made outside the batch (a host scalar on CUDA, read
    at launch and so frozen by a capture): recorded by value, so two batches differ."""
    from ponder_cli.model import PonderNetMethod

    real_loss, weight = PonderNetMethod.loss, {}

    def weighed(self, *args, **kwargs):
        parts = real_loss(self, *args, **kwargs)
        return parts._replace(total=parts.total * weight["now"])
    monkeypatch.setattr(PonderNetMethod, "loss", weighed)
    step = _step(_config(MLP))
    original = step.source.stage

    def stage(index):  # the per-batch value set on the host, between batches
        weight["now"] = torch.tensor(1 + index / 100)
        original(index)
    step.source.stage = stage
    with pytest.raises(AssertionError, match="0-dim"):
        assert_graph_safe(step)


def test_a_static_input_reallocated_instead_of_copied_into_is_caught(monkeypatch):
    """stage() must copy the next batch into the storage the capture read: a new tensor leaves
    every replay reading the captured batch."""
    from ponder_cli import distributed
    from ponder_cli.tasks.mnist import ImageBatches

    assert_graph_safe(_step(_config(MLP)))

    def reallocating(self, index):
        start = index * self.batch_size
        self.rows = distributed.shard(self.order[start:start + self.batch_size]).clone()
    monkeypatch.setattr(ImageBatches, "stage", reallocating)
    with pytest.raises(AssertionError, match="re-allocated the static inputs \\['rows'\\]"):
        assert_graph_safe(_step(_config(MLP)))


def test_the_recorder_catches_a_host_read():
    x = torch.ones(2)
    with Operators() as watch:
        bool(x.sum() > 0)
        torch.tensor([1.0, 2.0])
        x[x > 0]  # a boolean mask: its indices on the host
        torch.zeros(2, device=x.device), torch.rand(2, device="cpu")  # a device given: fine
        torch.arange(3)  # none: a host tensor on CUDA
    assert [p.split(" ")[0].rstrip(":") for p in watch.problems] == ["_local_scalar_dense", "tensor", "lift_fresh",
                                                                       "nonzero", "arange"]


def test_the_recorder_never_reads_a_value_off_a_device():
    """A 0-dim device tensor is recorded by its shape: a kernel reads it at replay (nothing is
    frozen), and reading it would be the recorder's own sync. A meta tensor stands in for a
    device's here: it has no value to read, so a read would raise."""
    top, scalar = torch.zeros((), device="meta"), torch.tensor(2.0)
    with Operators() as watch:
        top + 1, scalar * 3
    assert [arguments[0] for _, arguments in watch.ops] == [(), ("0-dim", torch.float32, 2.0)]


# Truncation as a mask equals the shrinking truncated forward -----------------------------------

TRUNCATIONS = [dict(method="pondernet", truncation=0.2), dict(method="pondernet", truncation=0.3,
                                                                truncation_rule="roulette"),
               dict(method="act", truncation=0.05), dict(method="pondernet", depth_min=2),
               dict(method="pondernet", truncation=0.2, depth_min=3)]


@pytest.mark.parametrize("step_name", ["mlp", "align", "gru"])
@pytest.mark.parametrize("rule", TRUNCATIONS, ids=lambda r: "-".join(f"{k}{v}" for k, v in r.items()))
def test_truncation_as_a_mask_gives_the_truncated_forwards_loss_and_gradients(rule, step_name):
    case = dict(step=step_name, max_steps=6, **rule, **(SMALL_VECTORS if step_name == "gru" else {}))
    cfg = _config(case)
    torch.manual_seed(0)
    model = new_model(cfg)
    with torch.no_grad():  # a halting head that tells inputs apart: they halt at several steps
        torch.nn.init.normal_(model.halting_head.weight, std=30 / model.halting_head.weight.shape[1] ** 0.5)
        model.halting_head.bias.zero_()
    model.eval()  # no dropout: both forwards see the same network
    inputs = torch.Generator().manual_seed(3)
    x = torch.randn(24, 1, 28, 28, generator=inputs) * torch.linspace(0.1, 3, 24).view(24, 1, 1, 1) \
        if cfg.task.name == "mnist" else torch.randint(-1, 2, (24, 8), generator=inputs).float()
    targets = torch.randint(0, 10 if cfg.task.name == "mnist" else 2, (24,), generator=torch.Generator().manual_seed(4))
    method = get_method(cfg)
    results = []
    for shrink in (True, False):
        torch.manual_seed(5)  # the roulette's coins
        rule_object = method.truncation(24, torch.device("cpu"))
        out = model(x, stop=rule_object) if shrink else model(x)
        if not shrink:
            out = truncate(out, rule_object)
        loss = method.loss(out.logits, out.lambda_logits, targets, out.computed)
        grads = torch.autograd.grad(loss.total, list(model.parameters()), allow_unused=True)
        results.append((out.computed, loss, grads))
    (computed_a, loss_a, grads_a), (computed_b, loss_b, grads_b) = results
    assert torch.equal(computed_a, computed_b)
    assert 1 < computed_a.float().mean() < cfg.method.max_steps  # inputs really stop at different steps
    assert len(set(computed_a.tolist())) >= 2
    for part_a, part_b in zip(loss_a, loss_b):
        torch.testing.assert_close(part_a, part_b, rtol=1e-5, atol=1e-6)
    for grad_a, grad_b in zip(grads_a, grads_b):
        if grad_a is None or grad_b is None:
            assert grad_a is None or not grad_a.any()
            assert grad_b is None or not grad_b.any()
        else:
            torch.testing.assert_close(grad_a, grad_b, rtol=1e-4, atol=1e-6)
    if method.truncation(24, torch.device("cpu")).mask_is_identity:  # BatchStep leaves the mask out
        out = model(x)
        loss_full = method.loss(out.logits, out.lambda_logits, targets, out.computed)
        grads_full = torch.autograd.grad(loss_full.total, list(model.parameters()), allow_unused=True)
        assert all(torch.equal(a, b) for a, b in zip(loss_full, loss_b))
        assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(grads_full, grads_b))


def test_a_skipped_step_leaves_weights_moments_and_step_count_as_they_were():
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(layer.parameters(), lr=torch.tensor(1e-2), fused=True)
    layer(torch.ones(1, 3)).sum().backward()
    step_unless(optimizer, torch.tensor(False))
    before = [p.detach().clone() for p in layer.parameters()]
    moments = [optimizer.state[p]["exp_avg"].clone() for p in layer.parameters()]
    step_unless(optimizer, torch.tensor(True))
    assert all(torch.equal(a, p) for a, p in zip(before, layer.parameters()))
    assert all(torch.equal(m, optimizer.state[p]["exp_avg"]) for m, p in zip(moments, layer.parameters()))
    assert all(float(optimizer.state[p]["step"]) == 1 for p in layer.parameters())
    step_unless(optimizer, torch.tensor(False))
    assert not any(torch.equal(a, p) for a, p in zip(before, layer.parameters()))


def test_a_non_finite_batch_is_skipped_on_the_device_and_counted():
    cfg = _config(dict(step="mlp", method="pondernet"))
    step = _step(cfg)
    training_mode(step.model, step.cfg)
    step.source.start_epoch()
    step.source.stage(0)
    step.run()
    weights = [p.detach().clone() for p in step.params]
    with torch.no_grad():
        step.model.output_head.bias.fill_(float("nan"))
    step.source.stage(1)
    step.run()
    assert step.totals[SKIPPED] == 1  # one batch skipped
    for (name, param), before in zip(step.model.named_parameters(), weights):  # step.params' order
        if name != "output_head.bias":  # the poisoned one
            assert torch.equal(param, before), name


# Evaluation's full forward, the rule chosen on the device ---------------------------------------

@pytest.mark.parametrize("method, rule", [("pondernet", "sample"), ("pondernet", "median"),
                                          ("pondernet", "expected"), ("pondernet", "quantile:0.8"),
                                          ("pondernet", "patience:2"), ("pondernet", "confidence:0.5"),
                                          ("pondernet", "threshold:0.5"),
                                          ("act", "act"), ("plain", "sample")])
def test_an_evaluation_batch_on_the_full_forward_reads_nothing_on_the_host(method, rule):
    cfg = _config(dict(step="mlp", method=method))
    torch.manual_seed(0)
    model = new_model(cfg).eval()
    method_object = get_method(cfg)
    x = synthetic_digits(32, 2).images.unsqueeze(1).float() / 255
    uniforms = torch.rand(cfg.method.max_steps, 32)
    with torch.inference_mode(), Operators() as watch, autocast(torch.device("cpu"), False):
        out = model(x)
        scores, steps = method_object.predict(out.logits, out.lambda_logits, uniforms, rule)
        (scores.argmax(dim=1) == 0).sum(), steps.sum()
    assert watch.problems == []
