"""What makes the host wait for the device, seen two ways, kept apart.

`DeviceSyncs`, on a GPU: the device's own sync debug mode counts every synchronisation it makes
the host wait for, what no operator shows (a copy to the host) included. It sees the device only.

`Operators`, on any machine (the CPU proof of tests/test_graph_safe.py and test_syncs.py): a
TorchDispatchMode that records every operator as it is issued, with its arguments, and names what
a CUDA graph cannot hold: a host read (`.item()`, `bool(t)`, a boolean mask's `nonzero`), a tensor
made from Python data (a copy from the host), a draw from a generator the step does not own, and
a tensor factory called without a device (a host tensor on CUDA). A capture also freezes what the
host hands a kernel: a Python number, and a 0-dim host tensor made before the batch (read at
launch); both are recorded by value, so two batches' operators must agree in value as well. It
never reads a tensor's value off a device: that read would be a sync of its own.
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

TORCH = Path(torch.__file__).parent
PACKAGE = Path(ponder_cli.__file__).parent


class DeviceSyncs:
    """While open, the synchronisations torch.cuda's sync debug mode reports: `count`."""

    def __enter__(self) -> DeviceSyncs:
        self._warnings = warnings.catch_warnings(record=True)
        self._caught = self._warnings.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.set_sync_debug_mode("default")
        self._warnings.__exit__(*exc)
        self.count = sum("synchroniz" in str(w.message) and "prototype" not in str(w.message) for w in self._caught)


def _caller(frame, *, through_torch: bool = True) -> tuple:
    """The nearest code outside torch and this module, as "ponder_cli/steps/align.py:12" (None
    where it is torch's own, unless `through_torch`), and whether a torch optimizer's step is on
    the way there."""
    in_optimizer = False
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        in_optimizer = in_optimizer or path.is_relative_to(TORCH / "optim")
        if path != Path(__file__) and not (through_torch and path.is_relative_to(TORCH)):
            if path.is_relative_to(TORCH):
                return None, in_optimizer
            where = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path
            return f"{where}:{frame.f_lineno}", in_optimizer
        frame = frame.f_back
    return None, in_optimizer


class _Factories(TorchFunctionMode):
    """Tensor factories called without a device (only a function mode sees that: by dispatch the
    device is chosen)."""

    def __init__(self, problems: list):
        super().__init__()
        self.problems, self.constructors = problems, _device_constructors()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.constructors and kwargs.get("device") is None:
            where, _ = _caller(sys._getframe(1), through_torch=False)
            if where is not None:  # torch places its own tensors
                self.problems.append(f"{func.__name__} without a device at {where}: a host tensor on CUDA")
        return func(*args, **kwargs)


class Operators(TorchDispatchMode):
    """While open, every operator issued: `ops` (each with its arguments: a tensor by its shape, a
    Python value as it is, a 0-dim host tensor made before the batch by its value), `reads` (a
    Counter: each host read by operator, each tensor made from Python data by where it was made)
    and `problems` (those, each draw from a generator not among `owned`, and each factory called
    without a device).

    `state`: the tensors that are training's state, read and written in place by every batch and
    different between batches by design (the weights, the optimizer's and the GradScaler's state,
    the learning rate, the source's static inputs): their values are not recorded.

    What a torch optimizer's step does inside is its own bookkeeping, not counted: an unfused
    Adam reads its step counters, which then live on the host, and torch refuses an optimizer that
    is not capturable inside a capture itself."""

    def __init__(self, owned=(), state=()):
        super().__init__()
        self.owned, self.ops, self.reads, self.problems = tuple(owned), [], Counter(), []
        self.state = {id(t) for t in state}
        self._made = weakref.WeakValueDictionary()  # the tensors the watched code made, by id
        self._factories = _Factories(self.problems)

    def _argument(self, value):
        if isinstance(value, torch.Tensor):
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
        self._factories.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        result = super().__exit__(*exc)
        self._factories.__exit__(*exc)
        return result

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        if name in MASK_INDEXING and any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                                         for i in (args[1] if len(args) > 1 else ()) if i is not None):
            name = "nonzero"
        if name in HOST_READS or name in FROM_PYTHON_DATA:
            where, in_optimizer = _caller(sys._getframe(1))
            if in_optimizer:
                pass
            elif name in FROM_PYTHON_DATA:
                self.reads[f"from Python data at {where}"] += 1
                self.problems.append(f"{name}: a tensor from Python data at {where}")
            else:
                self.reads[name] += 1
                self.problems.append(f"{name} reads on the host")
        generator = kwargs.get("generator")
        # the generator reaches the operator in a wrapper of its own: the same one has the same
        # state (a generator's state is a host tensor, on CUDA too)
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


def count_host_reads(work, owned=()) -> Counter:
    """What `work()` makes the host read or copy up (`Operators.reads`)."""
    with Operators(owned) as seen:
        work()
    return seen.reads
