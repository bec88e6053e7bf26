"""What makes the host wait for the device, counted the one way every test counts it.

On a GPU every operator whose result size or value the host must know (a boolean mask's
`nonzero`, an `.item()`, `bool(tensor)`) waits for the device to finish all queued work: with a
model this small each such wait costs more than a step, and a CUDA graph cannot hold one. A tensor
made from Python data (a list, a number) is a copy from the host, which waits too and cannot be
captured; so is a draw from a generator the capture does not know. A TorchDispatchMode sees every
operator as it is issued, on the CPU as on a GPU, so these are counted here on any machine.
On CUDA the device's own sync debug mode counts every sync it sees as well, under DEVICE_SYNC:
what no operator shows (a copy to the host), and again each host read counted by its operator.

A capture also freezes what the host hands a kernel: a Python number an operator is given (a
value that changes per batch stays the captured batch's), a 0-dim tensor made before the batch
outside the device state (a host scalar on CUDA, read at launch), and a tensor a factory makes
without a device (`torch.rand(n)`: a host tensor on CUDA, drawn once). The watch records the
first two in `ops` beside the shapes, so two batches' operators must agree in value as well,
and flags the third as a problem.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors
from torch.utils._python_dispatch import TorchDispatchMode

import ponder_cli

# operators that make the host wait for the device, or need a value on the host to shape their output
HOST_READS = {"_local_scalar_dense", "item", "is_nonzero", "nonzero", "nonzero_static", "masked_select",
              "_unique2", "unique_consecutive", "unique_dim", "repeat_interleave", "bincount", "histc",
              "masked_scatter", "equal", "allclose"}
# a tensor made from Python data: on CUDA a copy from the host
FROM_PYTHON_DATA = {"lift_fresh", "lift_fresh_copy"}
# indexing by a boolean mask: the mask's indices first (its `nonzero`, inside the operator on
# the CPU, so counted by that name here)
MASK_INDEXING = {"index", "index_put", "index_put_", "_index_put_impl_"}
DEVICE_SYNC = "device sync"  # what torch.cuda's sync debug mode reports (on CUDA only)

TORCH = Path(torch.__file__).parent
OPTIMIZERS = TORCH / "optim"
PACKAGE = Path(ponder_cli.__file__).parent


def _caller() -> tuple:
    """The innermost Python frame outside torch and this module, as (file, line), and whether a
    torch optimizer's step is on the way to it."""
    frame, in_optimizer = sys._getframe(2), False
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(OPTIMIZERS):
            in_optimizer = True
        if not path.is_relative_to(TORCH) and path != Path(__file__):
            return path, frame.f_lineno, in_optimizer
        frame = frame.f_back
    return None, 0, in_optimizer


def _where(path, line) -> str:
    return f"{path.relative_to(PACKAGE.parent) if path and path.is_relative_to(PACKAGE.parent) else path}:{line}"


class _Factories(TorchFunctionMode):
    """Each tensor factory (torch.rand, torch.zeros, torch.arange, ...) that the code outside torch
    calls without a device: torch's default device, the host, where training runs on CUDA."""

    def __init__(self, problems: list):
        super().__init__()
        self.problems, self.constructors = problems, _device_constructors()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.constructors and kwargs.get("device") is None:
            frame = sys._getframe(1)
            while frame is not None and Path(frame.f_code.co_filename) == Path(__file__):
                frame = frame.f_back
            path = Path(frame.f_code.co_filename) if frame is not None else None
            if path is not None and not path.is_relative_to(TORCH):  # torch places its own tensors
                self.problems.append(f"{func.__name__} without a device at {_where(path, frame.f_lineno)}: "
                                     "a host tensor on CUDA")
        return func(*args, **kwargs)


class Watch(TorchDispatchMode):
    """While it is open, every operator issued: `ops` (each operator with its arguments: a
    tensor's shape, a Python value as it is, a 0-dim tensor from outside the batch by its value),
    `reads` (a Counter: each host read by operator, each tensor made from Python data by where,
    "from Python data at ponder_cli/steps/align.py:12"; on CUDA the device's own syncs) and
    `problems` (the same, each draw from a generator not among `owned`, and each tensor factory
    called without a device).

    `state`: the tensors that are the device state of training, which a batch reads and writes in
    place and whose values differ from batch to batch by design (the weights, the optimizer's and
    the GradScaler's state, the learning rate, the source's static inputs): their 0-dim values are
    not recorded. Any other 0-dim tensor made before the batch is, by value.

    What a torch optimizer's step does inside is its own bookkeeping, not counted: an unfused
    Adam reads its step counters, which then live on the host, and torch refuses an optimizer that
    is not capturable inside a CUDA graph capture itself."""

    def __init__(self, owned=(), state=()):
        super().__init__()
        self.owned, self.ops, self.reads, self.problems = tuple(owned), [], Counter(), []
        self.state = {id(t) for t in state}
        self._made = weakref.WeakValueDictionary()  # the tensors the watched code made, by id
        self._factories = _Factories(self.problems)
        self._device = torch.cuda.is_available() and torch.cuda.is_initialized()

    def _argument(self, value):
        """What `ops` records of one argument."""
        if isinstance(value, torch.Tensor):
            # a host scalar only: a kernel reads a 0-dim device tensor at replay (nothing frozen),
            # and reading its value would be the watch's own sync (a parity curriculum's top)
            if value.dim() == 0 and value.device.type == "cpu" and id(value) not in self.state \
                    and self._made.get(id(value)) is not value and not value.requires_grad:
                return ("0-dim", value.dtype, value.item())
            return tuple(value.shape)
        if isinstance(value, (list, tuple)):
            return tuple(self._argument(v) for v in value)
        if value is None or isinstance(value, (bool, int, float, complex, str, torch.dtype, torch.device,
                                               torch.layout, torch.memory_format)):
            return value  # as the kernel gets it
        return type(value).__name__  # a generator, a profiler's record: what it is

    def __enter__(self):
        if self._device:
            self._warnings = warnings.catch_warnings(record=True)
            self._caught = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        self._factories.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        result = super().__exit__(*exc)
        self._factories.__exit__(*exc)
        if self._device:
            torch.cuda.set_sync_debug_mode("default")
            self._warnings.__exit__(*exc)
            syncs = sum("synchroniz" in str(w.message) and "prototype" not in str(w.message) for w in self._caught)
            if syncs:
                self.reads[DEVICE_SYNC] += syncs
                self.problems += [f"{DEVICE_SYNC} on the host"] * syncs
        return result

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        if name in MASK_INDEXING and any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                                         for i in (args[1] if len(args) > 1 else ()) if i is not None):
            name = "nonzero"
        if name in HOST_READS or name in FROM_PYTHON_DATA:
            path, line, in_optimizer = _caller()
            if in_optimizer:
                pass
            elif name in FROM_PYTHON_DATA:
                self.reads[f"from Python data at {_where(path, line)}"] += 1
                self.problems.append(f"{name}: a tensor from Python data at {_where(path, line)}")
            else:
                self.reads[name] += 1
                self.problems.append(f"{name} reads on the host")
        generator = kwargs.get("generator")
        # the generator reaches the operator in a wrapper of its own: the same one has the same state
        if generator is not None and not any(torch.equal(generator.get_state(), g.get_state()) for g in self.owned):
            self.problems.append(f"{name} draws from a generator the step does not own")
        arguments = tuple(self._argument(a) for a in args) + tuple(
            (key, self._argument(value)) for key, value in sorted(kwargs.items()) if key != "generator")
        self.ops.append((str(func), arguments))
        out = func(*args, **kwargs)
        for tensor in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(tensor, torch.Tensor):
                self._made[id(tensor)] = tensor
        return out


def count_syncs(work, owned=()) -> Counter:
    """What `work()` makes the host wait for (`Watch.reads`)."""
    with Watch(owned) as watch:
        work()
    return watch.reads
