"""Host synchronisations per step, counted on the CPU so that they cannot creep back.

On a GPU every op whose result size or value the host must know (a boolean mask's `nonzero`, an
`.item()`, `bool(tensor)`) waits for the device to finish all queued work: with a model this
small, each such wait costs more than a step. host_reads.Operators sees these operators on the CPU
too, so counting them here counts the stalls a GPU would have, and the tensors built from Python
data (a copy from the host on a GPU) with them.
"""

from collections import Counter

import pytest
import torch

from ponder_cli.checkpoint import new_model
from ponder_cli.config import PonderConfig
from ponder_cli.tasks.mnist import load_mnist
from ponder_cli.model import get_method, grad_scaler
from ponder_cli.train import batch_step, make_optimizer, train_one_epoch

from host_reads import PACKAGE, count_host_reads


@pytest.mark.parametrize("build", ["torch.tensor([0.5, 2.0])", "torch.as_tensor([0.5])", "x.new_tensor([0.5, 2.0])"])
def test_a_tensor_built_from_python_data_counts_where_it_is_built(build):
    """The counter's own check, on code compiled as if it stood in the package (line 1 of the
    align step), and the same call elsewhere."""
    x = torch.zeros(2)
    inside = compile(build, str(PACKAGE / "steps" / "align.py"), "eval")
    assert count_host_reads(lambda: eval(inside, {"torch": torch, "x": x})) == Counter(
        {"from Python data at ponder_cli/steps/align.py:1": 1})
    assert count_host_reads(lambda: eval(build, {"torch": torch, "x": x})) == Counter(
        {"from Python data at <string>:1": 1})


def test_a_host_read_counts_by_its_operator():
    x = torch.arange(4.0)
    assert count_host_reads(lambda: (x[x > 1].sum().item(), bool(x.sum() > 0))) == Counter(
        {"nonzero": 1, "_local_scalar_dense": 2})


def _model(steps: int, method: str = "pondernet", step: str = "mlp", bias=None, spread: float = 1.0, **changes):
    """A small model whose halting head's weights are scaled by `spread`: with inputs of
    different sizes (_INPUTS), images then halt at several different steps."""
    torch.manual_seed(0)
    sizes = dict(hidden=16, hidden_cnn=16, **({"hidden_lin": 16} if step == "mlp" else {}))
    halting = {} if method == "plain" else dict(max_steps=steps, halting_bias=bias)  # plain: one step, no halting
    cfg = PonderConfig.of(method=method, step=step, **sizes, **halting, **changes)
    assert cfg.method.max_steps == steps
    model = new_model(cfg)
    with torch.no_grad():
        model.halting_head.weight.mul_(spread)
    return model, cfg


# 64 noise images from faint to strong
_INPUTS = torch.randn(64, 1, 28, 28, generator=torch.Generator().manual_seed(1)) * torch.linspace(0, 4, 64).view(64, 1, 1, 1)


def _loop_syncs(steps_run: int, max_steps: int) -> int:
    """The loop's one sync per step finds the rows still running: none after the last step, and
    after an earlier step only while some row was still running there (else it ends the loop)."""
    return steps_run - 1 if steps_run == max_steps else steps_run


# (step, method, halting rule, halting bias, spread): images halt at several steps, some at
# the last one in most cases, so the loop compacts at every step it runs
EARLY_EXIT = [("mlp", "pondernet", "sample", -1.0, 3), ("mlp", "pondernet", "median", -2.0, 10),
              ("mlp", "act", "act", -2.0, 10), ("mlp", "plain", "sample", None, 1),
              ("align", "pondernet", "sample", -1.0, 3), ("align", "pondernet", "median", -1.0, 3),
              ("align", "act", "act", 0.0, 10), ("align", "plain", "sample", None, 1)]


@pytest.mark.parametrize("step, method, rule, bias, spread", EARLY_EXIT)
def test_early_exit_inference_makes_at_most_one_host_sync_per_step(step, method, rule, bias, spread):
    model, cfg = _model(1 if method == "plain" else 6, method, step, bias, spread)
    model.eval()
    uniforms = torch.rand(cfg.method.max_steps, 64, generator=torch.Generator().manual_seed(0))
    rule_object = get_method(cfg).exit_rule(rule, uniforms)
    result = {}
    with torch.inference_mode():
        syncs = count_host_reads(lambda: result.update(out=model.infer(_INPUTS, rule_object)))
    halted_at = result["out"][1]
    steps_run = int(halted_at.max())
    if method != "plain":
        assert len(set(halted_at.tolist())) >= 2  # rows really leave the loop at different steps
    expected = _loop_syncs(steps_run, cfg.method.max_steps)
    assert syncs == Counter({"nonzero": expected} if expected else {})
    assert sum(syncs.values()) <= steps_run


# (step, method, halting bias, spread): in training, truncation stops images at several steps
TRUNCATED = [("mlp", "pondernet", -1.0, 10), ("mlp", "act", -1.0, 10),
             ("align", "pondernet", 1.0, 3), ("align", "act", 1.0, 10)]


@pytest.mark.parametrize("step, method, bias, spread", TRUNCATED)
def test_truncated_training_forward_makes_at_most_one_host_sync_per_step(step, method, bias, spread):
    model, cfg = _model(6, method, step, bias, spread, truncation=0.05)
    model.train()
    result = {}

    def forward_and_backward():
        out = model(_INPUTS, stop=get_method(cfg).truncation(64, _INPUTS.device))
        (out.logits.sum() + out.lambda_logits.sum()).backward()
        result["computed"] = out.computed

    syncs = count_host_reads(forward_and_backward)
    computed = result["computed"]
    steps_run = int(computed.max())
    assert int(computed.min()) < steps_run  # rows really stop at different steps
    assert syncs == Counter({"nonzero": _loop_syncs(steps_run, cfg.method.max_steps)})
    assert sum(syncs.values()) <= steps_run


@pytest.mark.parametrize("truncation", [0.0, 0.05])
def test_a_cpu_training_batch_syncs_only_in_its_shrinking_forward(truncation, tiny_mnist, truncated_steps):
    """On the CPU a truncated forward drops the inputs that are done, which reads on the host how
    many go on: one sync per step. Nothing else waits: a non-finite batch is skipped on the device
    (the fused Adam's flag), and the epoch's metrics are read once, at the end, by a copy that a
    CPU profile cannot see. (The graph-safe batch, with no sync at all: test_graph_safe.py.)"""
    model, cfg = _model(4, bias=-1.0, spread=10, truncation=truncation, batch_size=100)
    data = load_mnist(tiny_mnist, train=True, download=False).subset(slice(0, 300))  # three batches
    device = torch.device("cpu")
    optimizer = make_optimizer(model, cfg, device)
    syncs = count_host_reads(lambda: train_one_epoch(batch_step(model, cfg, data, optimizer=optimizer), progress=False))
    loop = sum(_loop_syncs(int(c.max()), cfg.method.max_steps) for c in truncated_steps)
    assert len(truncated_steps) == (3 if truncation else 0)
    assert syncs == Counter({"nonzero": loop} if loop else {})


@pytest.mark.parametrize("fused, syncs_per_batch", [(True, 0), (None, 1)])
def test_fp16_training_with_fused_adam_never_waits_for_the_device(fused, syncs_per_batch, tiny_mnist, monkeypatch):
    """CUDA's --amp, fp16 with the GradScaler and a fused Adam: the scaler hands its overflow
    flag to the fused kernel, which skips the update on the device. An unfused Adam makes the
    scaler read the flag on the host instead, once per batch. (fp16 autocast and fused Adam run
    on the CPU as well, standing in for CUDA here.)"""
    monkeypatch.setattr("ponder_cli.model.amp_dtype", lambda device: torch.float16)
    model, cfg = _model(4, batch_size=32)
    data = load_mnist(tiny_mnist, train=True, download=False).subset(slice(0, 96))  # three batches (fp16 on the CPU is slow)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.training.lr, fused=fused)
    scaler = grad_scaler(torch.device("cpu"), True)
    assert scaler.is_enabled()
    step = batch_step(model, cfg, data, amp=True, optimizer=optimizer, scaler=scaler)
    syncs = count_host_reads(lambda: train_one_epoch(step, progress=False))
    assert syncs == Counter({"_local_scalar_dense": 3 * syncs_per_batch} if syncs_per_batch else {})
