"""What makes the host wait for the device, counted the one way every test counts it.

On a GPU every operator whose result size or value the host must know (a boolean mask's
`nonzero`, an `.item()`, `bool(tensor)`) waits for the device to finish all queued work: with a
model this small each such wait costs more than a step, and a CUDA graph cannot hold one. A tensor
made from Python data (a list, a number) is a copy from the host, which waits too and cannot be
captured; so is a draw from a generator the capture does not know. A TorchDispatchMode sees every
operator as it is issued, on the CPU as on a GPU, so these are counted here on any machine.
On CUDA the device's own sync debug mode counts every sync it sees as well, under DEVICE_SYNC:
what no operator shows (a copy to the host), and again each host read counted by its operator.
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter
from pathlib import Path

import torch
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


class Watch(TorchDispatchMode):
    """While it is open, every operator issued: `ops` (each operator with the shapes of its tensor
    arguments), `reads` (a Counter: each host read by operator, each tensor made from Python data
    by where, "from Python data at ponder_cli/steps/align.py:12"; on CUDA the device's own syncs)
    and `problems` (the same, and each draw from a generator not among `owned`).

    What a torch optimizer's step does inside is its own bookkeeping, not counted: an unfused
    Adam reads its step counters, which then live on the host, and torch refuses an optimizer that
    is not capturable inside a CUDA graph capture itself."""

    def __init__(self, owned=()):
        super().__init__()
        self.owned, self.ops, self.reads, self.problems = tuple(owned), [], Counter(), []
        self._device = torch.cuda.is_available() and torch.cuda.is_initialized()

    def __enter__(self):
        if self._device:
            self._warnings = warnings.catch_warnings(record=True)
            self._caught = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return super().__enter__()

    def __exit__(self, *exc):
        result = super().__exit__(*exc)
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
                where = path.relative_to(PACKAGE.parent) if path and path.is_relative_to(PACKAGE.parent) else path
                self.reads[f"from Python data at {where}:{line}"] += 1
                self.problems.append(f"{name}: a tensor from Python data at {where}:{line}")
            else:
                self.reads[name] += 1
                self.problems.append(f"{name} reads on the host")
        generator = kwargs.get("generator")
        # the generator reaches the operator in a wrapper of its own: the same one has the same state
        if generator is not None and not any(torch.equal(generator.get_state(), g.get_state()) for g in self.owned):
            self.problems.append(f"{name} draws from a generator the step does not own")
        shapes = tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else
                       tuple(tuple(t.shape) for t in a if isinstance(t, torch.Tensor)) if isinstance(a, (list, tuple))
                       else None for a in args)
        self.ops.append((str(func), shapes))
        return func(*args, **kwargs)


def count_syncs(work, owned=()) -> Counter:
    """What `work()` makes the host wait for (`Watch.reads`)."""
    with Watch(owned) as watch:
        work()
    return watch.reads
