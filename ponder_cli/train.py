"""The hand-written training loop: Adam, optional AMP, clipping, plateau LR, early stopping."""

from __future__ import annotations

import ctypes
import functools
import inspect
import logging
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
from tqdm import tqdm

from . import PonderError, brief, distributed, durations
from .checkpoint import TrainingState, new_model, save_checkpoint
from .config import PonderConfig
from .folders import BEST, LAST
from .model import Method, autocast, drops_rows, get_method, grad_scaler, truncate
from .registry import AT_CHANCE, EARLY_STOP, FINISHED, TIME_LIMIT
from .tasks import TrainingSource, get_task


class Adam(torch.optim.Adam):
    """torch.optim.Adam without torch.optim's wrappers, which keep torch.compile out and import
    torch._dynamo on their first call (over a second on a 2-core CPU; no option avoids it): these
    are the methods they wrap. ponder never compiles an optimizer."""

    add_param_group = inspect.unwrap(torch.optim.Optimizer.add_param_group)
    zero_grad = inspect.unwrap(torch.optim.Optimizer.zero_grad)
    state_dict = inspect.unwrap(torch.optim.Optimizer.state_dict)
    load_state_dict = inspect.unwrap(torch.optim.Optimizer.load_state_dict)
    _step = inspect.unwrap(torch.optim.Adam.step)

    def step(self, closure=None):
        # what the step's wrapper does besides importing torch._dynamo: no autograd graph for
        # the update unless the optimizer is differentiable
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return self._step(closure)


# glibc's mallopt parameters (malloc.h) and the largest mmap threshold it takes on 64-bit Linux
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX = -1, -3, 32 * 1024 * 1024


@functools.cache
def keep_freed_memory() -> bool:
    """On glibc, have malloc keep the memory a batch frees for the next batch (once a process):
    by default a freed block over ~128 KiB goes back to the system, and the next batch faults its
    pages in afresh (hundreds of page faults a parity batch). Whether it took effect."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


@dataclass(frozen=True)
class EpochStats:
    epoch: int
    train_loss: float
    train_reconstruction: float
    train_regularisation: float
    train_accuracy: float
    train_steps: float
    val_accuracy: float
    val_steps: float
    lr: float
    seconds: float
    improved: bool
    skipped_batches: int = 0  # batches skipped for a non-finite loss or gradient
    # fp16 batches whose gradients overflowed at the GradScaler's scale: it skipped their step
    # and halved the scale (routine, mostly early in training; not a fault of the batch)
    scaler_backoffs: int = 0
    # validation images halting at step 1, 2, ..., max_steps (the halting-step histogram)
    val_halting_histogram: tuple = ()
    # how the epoch's batches ran (BatchStep.path): "captured" (a CUDA graph, replayed), or
    # "eager: why" ("eager: on the CPU"); "" in runs saved before it was recorded
    training_step: str = ""


@dataclass
class TrainResult:
    out_dir: Path
    best_accuracy: float = -1.0
    best_epoch: int = 0
    last_epoch: int = 0
    stopped_early: bool = False
    history: list[EpochStats] = field(default_factory=list)
    stop_reason: str = FINISHED  # registry's FINISHED, EARLY_STOP, TIME_LIMIT or AT_CHANCE
    stop_note: str = ""  # the one line that says why, where the run did not simply finish

    @property
    def best_path(self) -> Optional[Path]:
        """None where the folder has no best.pt (resumed into another folder, no epoch better)."""
        path = self.out_dir / BEST
        return path if path.is_file() else None


def _source(data, cfg: PonderConfig, device: torch.device) -> TrainingSource:
    """`data` if a TrainingSource already, else the task's source of its training data (MNIST: an ImageSet)."""
    return data if isinstance(data, TrainingSource) else get_task(cfg).training_source(data, device)


WARMUP_BATCHES = 3  # eager batches before the capture
CAPTURED, WARMING_UP = "captured", "warming up"

# BatchStep.totals, summed on the device and read once per epoch: the epoch's means (each summed
# times the batch size; accuracy and steps as counts), then the inputs in batches that were used,
# the batches skipped for a non-finite loss or gradient and the GradScaler's back-offs
MEANS = ("loss", "reconstruction", "regularisation", "accuracy", "steps")
INPUTS, SKIPPED, BACKED_OFF = len(MEANS), len(MEANS) + 1, len(MEANS) + 2


def graphs_line(path: str) -> str:
    """The stderr line that says how training batches run on CUDA, for CAPTURED or "eager: why"."""
    if path == CAPTURED:
        return "CUDA graphs: each training batch is captured once and replayed"
    return f"CUDA graphs: off, {path.removeprefix('eager: ')}; batches run eagerly"


class BatchStep:
    """One training batch, whole: forward, truncation as a mask, the float32 loss, backward,
    clipping, the update (skipped on the device when the loss or a gradient is not finite) and the
    epoch's metrics summed on the device. Eager, or on CUDA the replay of the batch captured once:
    fixed shapes, no host read (tests/test_graph_safe.py), randomness from torch's default
    generator or the source's own. `shrink` (the CPU's default): the truncated forward drops the
    inputs that are done (the mask's loss and gradients, fewer steps computed; a host read a step).
    `--compile` (cfg.training.compile): the forward, loss and metrics (`_forward_loss`) through
    torch.compile, truncation as the mask (one process on the CPU: api.training refuses the rest).

    `state`: WARMING_UP, CAPTURED or "eager: why". WARMUP_BATCHES eager batches on the graph's
    side stream build kernels, workspaces and optimizer state; the next is captured and replayed
    once, checked by one host read: the replay must advance the totals and Adam's step count (a
    capture on another device than the tensors' records nothing, pytorch#87894). Then every batch
    is a replay, or eager for good, said in one line. `graph(device, generators)` makes the CudaGraph.
    """

    def __init__(self, model: torch.nn.Module, cfg: PonderConfig, data, *, amp: bool = False,
                 method: Method | None = None, optimizer: torch.optim.Optimizer | None = None,
                 scaler: torch.amp.GradScaler | None = None, shrink: bool | None = None, graphs: bool = False,
                 path: str | None = None, graph: Callable | None = None, log: Callable[[str], None] | None = None):
        """`data`: the task's training data or a TrainingSource; a fresh method, optimizer and
        GradScaler unless given (benchmarks and tests)."""
        self.params = list(model.parameters())
        self.device = device = self.params[0].device
        self.model, self.cfg, self.amp = model, cfg, amp
        self.method = method or get_method(cfg, device)
        self.optimizer = optimizer or make_optimizer(model, cfg, device)
        self.scaler = scaler or grad_scaler(device, amp)
        self.source = _source(data, cfg, device)
        if self.device.type == "cpu":
            keep_freed_memory()  # no batch faults its tensors' pages in afresh
        # compiled: fixed shapes, so truncation as the mask (the shrinking forward's shapes follow the data)
        self.shrink = (drops_rows(self.device) and not cfg.training.compile) if shrink is None else shrink
        self.forward_loss = compiled(self._forward_loss) if cfg.training.compile else self._forward_loss
        self.totals = torch.zeros(BACKED_OFF + 1, dtype=torch.float64, device=self.device)  # MEANS, INPUTS, ...
        self._no_step = torch.zeros((), dtype=torch.float32, device=self.device)
        path = path or (CAPTURED if graphs else "eager")
        self.state = WARMING_UP if path == CAPTURED else path
        self.new_graph, self.graph = graph or CudaGraph, None  # the graph, once the warm-up begins
        self.warmed = self.replays = 0
        self.log = log or (lambda line: print(line, file=sys.stderr))

    @property
    def taken(self) -> torch.Tensor:
        """Adam's step count on the device (a resumed run's goes on): --beta-warmup's clock."""
        state = next(iter(self.optimizer.state.values()), None)
        return self._no_step if state is None else state["step"]

    @property
    def graphs(self) -> bool:
        return self.state in (WARMING_UP, CAPTURED)

    @property
    def path(self) -> str:
        """What the run's record says: CAPTURED from the warm-up on, or "eager: why"."""
        return CAPTURED if self.state == WARMING_UP else self.state

    def run(self) -> None:
        """The batch, eagerly: what the captured graph replays."""
        cfg = self.cfg
        x, targets = self.source.batch()
        batch = targets.shape[0]
        loss, (correct, steps) = self.forward_loss(x, targets, self.taken)
        # nanoGPT's AMP order: scale -> backward -> unscale_ -> clip -> step -> update (the
        # GradScaler is off unless fp16)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss.total).backward()
        self.scaler.unscale_(self.optimizer)
        if cfg.training.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.training.grad_clip)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
        finite_loss = torch.isfinite(loss.total)
        if distributed.active():
            # The gradients (so grad_norm) are already averaged and equal on every rank, but the
            # loss is this rank's own. Ranks that disagreed would step on some replicas and not on
            # others, which would drift apart for good: finite only if finite on every rank.
            finite_loss = finite_loss.to(torch.int32)
            torch.distributed.all_reduce(finite_loss, op=torch.distributed.ReduceOp.MIN)
            finite_loss = finite_loss.bool()
        finite_grads = torch.isfinite(grad_norm)
        if self.scaler.is_enabled():
            # The scaler skips the step when the gradients are not finite (a non-finite loss
            # makes them so too). With a finite loss that is its scale overflowing fp16: it halves
            # the scale, a back-off, not a bad batch.
            self.scaler.step(self.optimizer)
            skipped = ~finite_loss
            backed_off = finite_loss & ~finite_grads
        else:
            skipped = ~(finite_loss & finite_grads)
            backed_off = torch.zeros_like(skipped)
            step_unless(self.optimizer, skipped)
        self.scaler.update()
        with torch.no_grad():
            values = torch.stack([loss.total * batch, loss.reconstruction * batch, loss.regularisation * batch,
                                  correct, steps]).double()
            # a backed-off batch had a finite loss on the weights of the time: its metrics count
            used = ~skipped
            self.totals[:INPUTS] += torch.where(used, values, torch.zeros_like(values))
            self.totals[INPUTS] += used.double() * batch
            self.totals[SKIPPED] += skipped.double()
            self.totals[BACKED_OFF] += backed_off.double()

    def _forward_loss(self, x: torch.Tensor, targets: torch.Tensor, taken: torch.Tensor):
        """The float32 loss of a batch and its metrics (correct, steps): what --compile compiles."""
        method, device = self.method, self.device
        truncation = method.truncation(targets.shape[0], device)
        with autocast(device, self.amp, cache=not self.graphs):  # a capture keeps no cast copies
            # Under DDP no collective happens in the forward (a shrinking one may run fewer steps
            # on one rank than on another); DDP synchronises in backward, once per batch.
            out = self.model(x, stop=truncation if self.shrink else None)
        if truncation is not None and not self.shrink and not truncation.mask_is_identity:
            out = truncate(out, truncation)
        loss = method.loss(out.logits, out.lambda_logits, targets, out.computed, progress=taken)
        with torch.no_grad():
            return loss, method.batch_metrics(out, targets)

    def __call__(self) -> None:
        """The batch the source has staged: eagerly, warming up, captured or replayed."""
        if self.state == CAPTURED:
            self.graph.replay()
            self.replays += 1
        elif self.state != WARMING_UP:
            self.run()
        elif self.warmed < WARMUP_BATCHES:
            self.graph = self.graph or self.new_graph(self.device, self.source.generators())
            self.graph.warm_up(self.run)
            self.warmed += 1
        else:
            why = self._capture_and_check()
            if why is None:
                self.state, self.replays = CAPTURED, 1
                return
            self.graph.reset()
            self.graph = None
            capturable(self.optimizer, False)
            self.state = f"eager: {why}"
            self.log(graphs_line(self.state))
            self.run()

    def _capture_and_check(self) -> str | None:
        """None when the captured batch trained; else why not."""
        capturable(self.optimizer, True)  # the update is captured: its step counts stay on the device
        self.optimizer.zero_grad(set_to_none=True)  # the captured backward allocates the gradients
        try:
            self.graph.capture(self.run)
        except PonderError:  # the user's to hear, captured or not
            raise
        except Exception as exc:
            # whatever a capture raises (CUDA's errors, torch.cuda.graph's checks, an operation that
            # cannot be captured); a fault of the batch itself raises again in the eager rerun. The
            # GradScaler may hold an unscale_ record the rerun would refuse; its scale stays
            self.scaler.update(self.scaler.get_scale())
            return f"the capture failed ({brief(exc)})"
        def progress():  # what every batch advances: inputs used plus batches skipped; Adam's steps; steps not taken
            t = self.totals
            return torch.stack([t[INPUTS] + t[SKIPPED], self.taken.to(t.dtype), t[SKIPPED] + t[BACKED_OFF]])

        before, totals = progress(), self.totals.clone()
        self.graph.replay()
        counted, steps, passed = (progress() - before).tolist()  # the one read, once a run
        why = ("the captured batch did nothing when replayed (the epoch's totals stood still)" if counted <= 0 else
               "the captured batch did nothing when replayed (Adam's step count stood still)"
               if steps != 1 and passed == 0 else None)
        if why is not None:
            self.totals.copy_(totals)  # the eager step reruns the batch: what a partial replay counted goes
        return why

    def warm_up(self) -> int:
        """For benchmarks: start an epoch and run its batches until the graph is captured and
        replayed once; the index of the next batch."""
        self.source.start_epoch()
        for index in range(WARMUP_BATCHES + 2):
            self.source.stage(index)
            self()
        return WARMUP_BATCHES + 2


def require_compiler() -> None:
    """--compile's one environment need, checked before a run starts: the C++ compiler inductor
    builds its kernels with (its wrapper code on every device)."""
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # a CUDA_HOME without CUDA: no matter
    from torch._inductor import cpp_builder, exc

    try:
        cpp_builder.get_cpp_compiler()
    except (exc.InvalidCxxCompiler, OSError, RuntimeError) as error:
        raise PonderError(f"--compile needs a C++ compiler, and none was found ({brief(error)}): install g++ "
                          f"(or set CXX to one), or train without --compile") from None


def compiled(function: Callable) -> Callable:
    """`function` under torch.compile (inductor), one graph of fixed shapes: `fullgraph` makes a
    graph break an error, so nothing in it can read the host."""
    require_compiler()
    return torch.compile(function, fullgraph=True, dynamic=False)


class CudaGraph:
    """Where BatchStep's batch is captured and replayed, on the training device, with a side stream
    and a memory pool of its own (torch.cuda.graph's pattern); `generators`: the source's own."""

    def __init__(self, device: torch.device, generators: tuple = ()):
        self.device, self.generators = device, tuple(generators)
        with torch.cuda.device(device):
            self.side = torch.cuda.Stream()
            self.pool = torch.cuda.graph_pool_handle()
        self.graph: torch.cuda.CUDAGraph | None = None

    def warm_up(self, run: Callable[[], None]) -> None:
        with torch.cuda.device(self.device):
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                run()
            torch.cuda.current_stream().wait_stream(self.side)

    def capture(self, run: Callable[[], None]) -> None:
        with torch.cuda.device(self.device):
            graph = torch.cuda.CUDAGraph()
            for generator in self.generators:
                graph.register_generator_state(generator)
            stream = torch.cuda.current_stream()
            try:
                with torch.cuda.graph(graph, pool=self.pool, stream=self.side):
                    run()
            finally:  # a failed capture's end raises before torch puts the stream back
                torch.cuda.set_stream(stream)
        self.graph = graph

    def replay(self) -> None:
        with torch.cuda.device(self.device):
            self.graph.replay()

    def reset(self) -> None:
        if self.graph is not None:
            self.graph.reset()
        self.graph = None


def capturable(optimizer: torch.optim.Optimizer, on: bool) -> None:
    """Mark Adam capturable exactly while its step is captured: torch reads the flag only to refuse
    a capture of an unmarked step and to warn about a marked one run eagerly."""
    for group in optimizer.param_groups:
        group["capturable"] = on
    optimizer.defaults["capturable"] = on


batch_step = BatchStep  # the name benchmarks and tests know it by


def step_unless(optimizer: torch.optim.Optimizer, skip: torch.Tensor) -> None:
    """optimizer.step(), a no-op where `skip` (a bool scalar on the device) is True: the fused Adam's
    `found_inf` flag, as the GradScaler passes it. No host read."""
    optimizer.grad_scale, optimizer.found_inf = None, skip.float()
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale, optimizer.found_inf


def train_one_epoch(step: BatchStep, *, desc: str = "train", progress: bool = True,
                    timer: Optional[Callable[[int, int], None]] = None) -> dict:
    """One epoch, its metrics on the device until the one host read at the end. Under torchrun each
    rank trains on its slice of every global batch; the metrics cover all ranks."""
    training_mode(step.model, step.cfg)
    source, device = step.source, step.device
    count = source.start_epoch()  # what the epoch draws up front (MNIST: the permutation, shared stream)
    step.totals.zero_()
    # Under torchrun rotations, dropout, truncation and coin flips come from this rank's own RNG
    # stream until the shared stream is put back at the end of the epoch.
    with distributed.rank_rng(device):
        for index in tqdm(range(count), desc=desc, unit="batch", leave=False, file=sys.stderr,
                          disable=not progress, dynamic_ncols=True):
            if timer is not None:
                timer(index, count)
            source.stage(index)  # global batch `index` into the source's static inputs
            step()
    # Sum the images, losses and correct counts of every rank: the epoch line covers the whole
    # epoch. The skip and back-off counts are not summed: every rank counted the same ones.
    totals = step.totals.clone()
    totals[:SKIPPED] = distributed.sum_over_ranks(totals[:SKIPPED])
    values = totals.tolist()  # the one host read of the epoch
    used = max(values[INPUTS], 1.0)
    stats = {key: value / used for key, value in zip(MEANS, values[:INPUTS])}
    stats.update(skipped_batches=int(values[SKIPPED]), scaler_backoffs=int(values[BACKED_OFF]), batches=count)
    return stats


def _rng_state(device: torch.device, source: TrainingSource | None = None) -> dict:
    """The CPU generator's state, the training GPU's alone (it resumes on any number of GPUs, or
    none) and the task's own training stream under "task"."""
    state = {"torch": torch.get_rng_state()}
    task_state = source.state() if source is not None else None
    if task_state is not None:
        state["task"] = task_state
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if device.type != "cuda":
        return  # a CUDA run resumed on the CPU: its CUDA stream has nothing left to feed
    if isinstance(cuda, (list, tuple)):
        # Written by an earlier version: every visible GPU's state. Training drew from its own
        # device's, and under torchrun from rank 0's cuda:0, the stream every rank shares.
        index = 0 if distributed.active() or device.index is None else device.index
        cuda = cuda[index] if index < len(cuda) else (cuda[0] if cuda else None)
    if cuda is not None:  # else a CPU run resumed on CUDA: the CUDA stream starts from the seed
        # Under torchrun every rank continues the shared stream on its own GPU.
        torch.cuda.set_rng_state(cuda, device)


HALTING_HEAD = "halting_head."  # the tensors a refit (--refit-halting) starts anew and trains alone


def freeze_body(model: torch.nn.Module) -> None:
    """--refit-halting: every weight frozen but the halting head's."""
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.startswith(HALTING_HEAD))


def training_mode(model: torch.nn.Module, cfg: PonderConfig) -> None:
    """Training mode; a refit's frozen step function as at evaluation: the answers the head will see."""
    model.train()
    if cfg.training.refit_halting:
        getattr(model, "module", model).step.eval()


def make_optimizer(model: torch.nn.Module, cfg: PonderConfig, device: torch.device) -> torch.optim.Adam:
    """Fused on every device: one kernel, and a flag on the device that skips a step (step_unless).
    The learning rate is a tensor the plateau schedule cuts in place: a captured step reads it."""
    trained = [p for p in model.parameters() if p.requires_grad]  # a refit freezes all but the halting head
    return Adam(trained, lr=torch.tensor(cfg.training.lr, device=device), fused=True)


def learning_rate(rate) -> float:
    """A learning rate as a float, a float32 tensor's read back to 7 digits (1e-3, not 0.0010000000474974513)."""
    return float(f"{float(rate):.7g}") if isinstance(rate, torch.Tensor) else rate


def _optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    saved = optimizer.state_dict()
    return {**saved, "param_groups": [{**group, "lr": learning_rate(group["lr"])} for group in saved["param_groups"]]}


def _load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Load a checkpoint's optimizer state, keeping this optimizer's implementation flags (how Adam
    runs, not what it has learnt: a fused CUDA Adam's would come with the saved groups) and its
    learning-rate tensor, given the saved value."""
    rates = [group["lr"] for group in optimizer.param_groups]
    groups = [{**group, **{flag: optimizer.defaults[flag] for flag in ("fused", "foreach", "capturable")
                           if flag in group}} for group in saved["param_groups"]]
    optimizer.load_state_dict({**saved, "param_groups": groups})
    for group, rate in zip(optimizer.param_groups, rates):
        if isinstance(rate, torch.Tensor):
            group["lr"] = rate.fill_(float(group["lr"]))


def use_graphs(device: torch.device, wanted: bool, pieces: dict, log: Callable[[str], None] | None = None) -> str:
    """CAPTURED on CUDA, unless --no-cuda-graphs, torchrun or one of `pieces` (graph_pieces) that
    does not declare `graph_safe = True` stands in the way: "eager: why"."""
    if device.type != "cuda":
        return "eager: on the CPU"
    unsafe = [name for name, piece in pieces.items() if getattr(piece, "graph_safe", False) is not True]
    why = ("--no-cuda-graphs" if not wanted else
           "under torchrun (DDP's gradient hooks are not captured)" if distributed.active() else
           f"{unsafe[0]} does not declare graph_safe = True" if unsafe else None)
    path = CAPTURED if why is None else f"eager: {why}"
    if log is not None and wanted:  # --no-cuda-graphs needs no word
        log(graphs_line(path))
    return path


def graph_pieces(model: torch.nn.Module, method: Method, source: TrainingSource, cfg: PonderConfig) -> dict:
    """What a training batch runs besides the model's own layers, by name."""
    return {f"the task {cfg.task.name!r}'s training source": source,
            f"the step function {cfg.step.name!r}": model.step, f"the method {cfg.method.name!r}": method}


def train(cfg: PonderConfig, train_set, val_set, *, device: torch.device,
          out_dir: Path, amp: bool = False, resume: TrainingState | None = None,
          on_epoch: Callable[[EpochStats], None] | None = None, progress: bool = True,
          log: Callable[[str], None] | None = None, cuda_graphs: bool = True,
          time_limit: float | None = None, clock: Callable[[], float] | None = None,
          init: dict | None = None, run: dict | None = None) -> TrainResult:
    """Train, validating once per epoch; write last.pt every epoch and best.pt on improvement.
    train_set and val_set are the task's (MNIST: ImageSets; parity: None and a ParityBatch).
    `resume`: a checkpoint continued at its next epoch. `time_limit`: seconds on `clock`. `init`:
    weights the fresh model starts from (--init-from; a refit's lack the halting head). `run`: the
    run's record (folders.run_record), kept in every checkpoint. Under torchrun every rank calls
    it alike; rank 0 alone validates, writes and decides when time is up."""
    limit = TimeLimit(time_limit, clock or CLOCK) if time_limit is not None else None
    out_dir, epochs, patience = Path(out_dir), cfg.training.epochs, cfg.training.patience
    torch.manual_seed(cfg.training.seed)
    task = get_task(cfg)
    method = get_method(cfg, device)
    model = new_model(cfg).to(device)
    if init is not None:  # under --refit-halting without the halting head: the model's own, new
        model.load_state_dict({**model.state_dict(), **init})
    if cfg.training.refit_halting:
        freeze_body(model)
    source = _source(train_set, cfg, device)
    optimizer = make_optimizer(model, cfg, device)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer, mode="max", factor=cfg.training.lr_factor, patience=cfg.training.lr_patience)
    scaler = grad_scaler(device, amp)

    result, without_improvement = TrainResult(out_dir=out_dir), 0
    if resume is not None:  # weights, optimizer, scheduler, scaler, random streams and the history
        resume.require_resumable(out_dir)
        try:
            model.load_state_dict(resume.model)
            _load_optimizer_state(optimizer, resume.optimizer)
            scheduler.load_state_dict(resume.scheduler)
            if resume.scaler:
                # A run saved without a live scaler (bf16 on the CPU, or AMP off) has an empty
                # state, which an enabled scaler refuses: resumed with fp16 it starts a fresh
                # scaler instead.
                scaler.load_state_dict(resume.scaler)
            _set_rng_state(resume.rng, device)
            source.load_state(resume.rng.get("task"))
            result.history = [EpochStats(**h) for h in resume.history]
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as exc:
            raise PonderError(f"cannot resume: the checkpoint's training state does not fit ({brief(exc)})") from None
        result.best_accuracy, result.best_epoch, result.last_epoch = resume.best_accuracy, resume.best_epoch, \
            resume.epoch
        without_improvement = resume.epochs_without_improvement
        if patience and without_improvement >= patience:
            raise PonderError(f"this run already stopped early after epoch {resume.epoch} "
                              f"(no better validation accuracy for {patience} epochs); raise --patience to go on")
    path = use_graphs(device, cuda_graphs, graph_pieces(model, method, source, cfg), log)
    # the clock starts once the capture is done: it would count as batches
    timer = EpochTimer(epochs - result.last_epoch, log, device=device,
                       skip=WARMUP_BATCHES + 1 if path == CAPTURED else 1) if log is not None else None
    # DDP must be told when a parameter may get no gradient on a rank, and then searches every
    # backward for such parameters (a graph walk, a collective and a host sync per batch): only
    # where a forward may stop after one step and that step leaves some parameter out (h_0 = 0
    # never meets mlp's from_state; align's turn acts at step 1 only if halting sees it)
    left_out = []
    if distributed.active() and (cfg.method.max_steps == 1 or cfg.method.truncation > 0):
        left_out = model.left_out_by_one_step(task.example_input(2, device))
    step = BatchStep(distributed.wrap(model, device, find_unused_parameters=bool(left_out)), cfg, source, amp=amp,
                     method=method, optimizer=optimizer, scaler=scaler, path=path, log=log)

    def save(state: TrainingState, improved: bool) -> None:
        """best.pt (on improvement) before last.pt, as one (an interrupt waits for both): a write that
        fails between them leaves best.pt ahead of last.pt, never behind the best epoch it names."""
        if distributed.is_main():  # every rank holds this same state; one writes it
            save_checkpoint(state, *[out_dir / BEST] * improved, out_dir / LAST)

    for epoch in range(result.last_epoch + 1, epochs + 1):
        started = time.perf_counter()
        if limit is not None:
            limit.epoch_started = limit.clock()
        stats = train_one_epoch(step, desc=f"epoch {epoch}/{epochs}", progress=progress, timer=timer)
        if stats["skipped_batches"] == stats["batches"]:
            # every batch had a non-finite loss (or, without the GradScaler, gradient); back-offs
            # are no fault: the scale halves until the gradients fit fp16
            kept = (f"{out_dir / LAST} still holds the last good epoch" if (out_dir / LAST).is_file()
                    else "no epoch was saved in " + str(out_dir))
            raise PonderError(f"epoch {epoch}: every batch had a non-finite loss or gradient; training "
                              f"stopped, {kept} (try a lower --lr)")
        # Validation from rank 0 (its own seeded generator) on every rank, so that all step the
        # scheduler and early stopping alike
        val = task.validate(model, val_set, amp) if distributed.is_main() else None
        val_accuracy, val_steps, *histogram = distributed.broadcast_from_main(
            [val.accuracy, val.mean_steps, *val.histogram] if val is not None else [0.0] * (2 + cfg.method.max_steps),
            device)
        lr = learning_rate(optimizer.param_groups[0]["lr"])
        scheduler.step(val_accuracy)
        # only a model whose weights and epoch's loss are finite becomes "best"
        finite = bool(torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all())  # one sync
        improved = finite and math.isfinite(stats["loss"]) and val_accuracy > result.best_accuracy
        if improved:
            result.best_accuracy, result.best_epoch, without_improvement = val_accuracy, epoch, 0
        else:
            without_improvement += 1
        record = EpochStats(
            epoch=epoch, train_loss=stats["loss"], train_reconstruction=stats["reconstruction"],
            train_regularisation=stats["regularisation"], train_accuracy=stats["accuracy"],
            train_steps=stats["steps"], val_accuracy=val_accuracy, val_steps=val_steps, lr=lr,
            seconds=time.perf_counter() - started, improved=improved, skipped_batches=stats["skipped_batches"],
            scaler_backoffs=stats["scaler_backoffs"], val_halting_histogram=tuple(map(int, histogram)),
            training_step=step.path)
        result.history.append(record)
        result.last_epoch = epoch
        schedule = scheduler.state_dict()  # the rates it last set as floats
        schedule["_last_lr"] = [learning_rate(rate) for rate in schedule.get("_last_lr", [])]
        state = TrainingState(config=cfg, model=model.state_dict(), epoch=epoch, optimizer=_optimizer_state(optimizer),
                              scheduler=schedule, scaler=scaler.state_dict(), best_accuracy=result.best_accuracy,
                              best_epoch=result.best_epoch, epochs_without_improvement=without_improvement,
                              history=[asdict(h) for h in result.history], rng=_rng_state(device, source), run=run)
        save(state, improved)
        if on_epoch is not None:
            on_epoch(record)
        if state.stopped_early:
            result.stopped_early, result.stop_reason = True, EARLY_STOP
            break
        # the decision needs the epoch timed whole, its first save included
        if limit is not None and epoch < epochs and not limit.next_epoch_fits(device):
            result.stop_reason, result.stop_note = TIME_LIMIT, limit.why_stopped(epoch)
            break
    if result.stop_reason != TIME_LIMIT:
        note = at_chance(result, cfg, task.classes, learning_rate(optimizer.param_groups[0]["lr"]))
        if note:
            result.stop_reason, result.stop_note = AT_CHANCE, note
    if result.stop_reason in (TIME_LIMIT, AT_CHANCE):
        # last.pt again, saying why it ended (`ponder runs`: "time limit", not "interrupted";
        # "at chance", not "finished")
        state.stop_reason = result.stop_reason
        save(state, improved=False)
    distributed.barrier()  # under torchrun every rank returns once rank 0 has written the checkpoints
    return result


CLOCK = time.monotonic  # what a time limit is measured on (a test gives its own)


class TimeLimit:
    """`--time-limit`: training ends after the last epoch that fits. Each epoch is timed whole; the
    next is expected to take as long as the slowest of the last few, this process's first (its
    one-time costs) left out once another is timed. The first epoch always runs. Under torchrun
    rank 0's clock decides."""

    RECENT = 3  # epochs the next one is judged from

    def __init__(self, seconds: float, clock: Callable[[], float]):
        self.seconds, self.clock = float(seconds), clock
        self.started = self.epoch_started = clock()
        self.epochs: list[float] = []  # seconds each epoch of this process took, in order

    def next_epoch(self) -> float:
        return max((self.epochs[1:] or self.epochs)[-self.RECENT:])

    def left(self) -> float:
        return self.seconds - (self.clock() - self.started)

    def next_epoch_fits(self, device: torch.device) -> bool:
        """Times the epoch just ended; whether the next fits (rank 0's answer on every rank)."""
        self.epochs.append(self.clock() - self.epoch_started)
        fits = self.next_epoch() <= self.left()
        return bool(distributed.broadcast_from_main([float(fits)], device)[0])

    def why_stopped(self, epoch: int) -> str:
        def spoken(seconds: float) -> str:  # tenths under 10 s, where the two figures are close
            return durations.rough(seconds, tenths=True)

        left = self.left()
        return (f"stopped at its time limit ({durations.exact(self.seconds)}) after epoch {epoch}: the next epoch "
                f"would take about {spoken(self.next_epoch())}, "
                + (f"{spoken(left)} {'is' if spoken(left) == '1.0 s' else 'are'} left" if left >= 0.05 else
                   "the time is up"))


# A run "at chance": its best validation accuracy within three standard errors of guessing, and its
# learning rate cut to a thousandth of where it started or below (Adam's steps no longer move it)
LR_FLOOR = 1e-3


def at_chance(result: TrainResult, cfg: PonderConfig, classes: int, lr: float) -> Optional[str]:
    """The line that says a run never left chance and its learning rate was cut to the floor; else None."""
    if not result.history or lr > cfg.training.lr * LR_FLOOR * (1 + 1e-6):
        return None
    chance = 1 / classes
    inputs = sum(result.history[-1].val_halting_histogram) or 1
    if result.best_accuracy > chance + 3 * math.sqrt(chance * (1 - chance) / inputs):
        return None
    return (f"the run sits at chance: its best validation accuracy is {result.best_accuracy:.4f} (chance "
            f"{chance:g}) and its learning rate was cut from {cfg.training.lr:g} to {lr:.0e}; it did not learn "
            f"(what learns where the defaults did not: a larger --batch-size, the learning rate held by a large "
            f"--lr-patience, --patience 0)")


# How long a run will take: the first epoch's batches timed, one line said once ---------------

# Estimated once, as soon as this many batches are timed or this many seconds have passed, but
# from no fewer than ESTIMATE_MIN_BATCHES; a run under ESTIMATE_FROM_SECONDS gets no estimate.
ESTIMATE_AFTER_BATCHES, ESTIMATE_AFTER_SECONDS, ESTIMATE_FROM_SECONDS = 20, 5.0, 60.0
ESTIMATE_MIN_BATCHES = 10


def duration_estimate(epoch_seconds: float, epochs: int) -> Optional[str]:
    """The line that says how long an epoch and the `epochs` to go will take; None for a short run."""
    if epoch_seconds * epochs < ESTIMATE_FROM_SECONDS:
        return None
    if epochs == 1:
        return f"about {durations.rough(epoch_seconds)} for 1 epoch"
    total = durations.rough(epoch_seconds * epochs)
    return f"about {durations.rough(epoch_seconds)} an epoch, {total} for {epochs} epochs"


class EpochTimer:
    """Times a session's first epoch, called before each batch is staged, until its batches give the
    run's duration_estimate, said to `log` once. The clock starts after the first `skip` batches
    (start-up costs, the capture). On the CPU the median batch (the first ones after start-up are
    slow); on CUDA, where the host runs ahead, the mean between two waits for the device."""

    def __init__(self, epochs: int, log: Callable[[str], None], clock: Callable[[], float] = time.perf_counter,
                 *, device=None, skip: int = 1):
        self.epochs, self.log, self.clock, self.skip = epochs, log, clock, skip
        self.epochs_started, self.started = 0, 0.0
        self.on_cuda = device is not None and torch.device(device).type == "cuda"
        self.synchronize = (lambda: torch.cuda.synchronize(device)) if self.on_cuda else (lambda: None)
        self.stamps: list[float] = []  # when each timed batch was staged (the CPU's per-batch times)

    def __call__(self, index: int, batches: int) -> None:
        self.epochs_started += index == 0
        if self.epochs_started != 1 or index < self.skip or self.started is None:
            return
        if index == self.skip:  # the batches before it, with their start-up costs, are done: the clock starts
            self.synchronize()
            self.started = self.clock()
            self.stamps = [self.started]
            return
        timed, now = index - self.skip, self.clock()
        self.stamps.append(now)
        # the host's clock decides when; the device is waited for only to read the time
        if timed >= ESTIMATE_AFTER_BATCHES or (timed >= ESTIMATE_MIN_BATCHES and
                                               now - self.started >= ESTIMATE_AFTER_SECONDS):
            self.synchronize()
            if self.on_cuda:
                per_batch = (self.clock() - self.started) / timed
            else:
                per_batch = statistics.median(b - a for a, b in zip(self.stamps, self.stamps[1:]))
            self.started, self.stamps = None, []  # once
            line = duration_estimate(per_batch * batches, self.epochs)
            if line is not None:
                self.log(line)
