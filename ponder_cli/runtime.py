"""Device choice, mixed precision and the optimizer, shared by training and evaluation."""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import sys

import torch

from . import PonderError
from .registry import device_problem


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when present; an explicit device that is not usable is an error."""
    problem = device_problem(name)
    if problem is not None:
        raise PonderError(problem)
    name = name.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this PyTorch has no CUDA support" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise PonderError(f"--device {name} requested but CUDA is not available ({why}); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise PonderError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return device


def drops_rows(device: torch.device) -> bool:
    """Whether inputs that are done leave the later steps (training's truncated forward,
    evaluation's early exit): on the CPU, where fewer rows cost less; on a GPU every step runs on
    every input at fixed shapes (a mask), which asks the host nothing and can be captured."""
    return device.type == "cpu"


def amp_dtype(device: torch.device) -> torch.dtype:
    """fp16 on CUDA (with a GradScaler), bf16 on CPU (no scaler needed, same code path)."""
    return torch.float16 if device.type == "cuda" else torch.bfloat16


def grad_scaler(device: torch.device, amp: bool) -> torch.amp.GradScaler:
    """The GradScaler training needs: enabled exactly when autocast computes in fp16, whose small
    range lets gradients underflow unless the loss is scaled up (bf16 has float32's range)."""
    return torch.amp.GradScaler(device.type, enabled=amp and amp_dtype(device) == torch.float16)


def autocast(device: torch.device, enabled: bool, *, cache: bool = True):
    """Mixed precision on `device` when enabled; `cache` False keeps no fp16 copies of the weights
    between uses (a CUDA graph's capture must not: the copies would be made once, at capture)."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=amp_dtype(device), cache_enabled=cache)


class Adam(torch.optim.Adam):
    """torch.optim.Adam, running its own code, without importing torch's compiler stack.

    torch.optim wraps these methods so that torch.compile leaves them alone, and each wrapper
    imports torch._dynamo on its first call (over a second on a 2-core CPU) although nothing is
    compiled: no option of Adam's avoids it. These call the methods the wrappers wrap; ponder
    never compiles an optimizer.
    """

    _add_param_group = inspect.unwrap(torch.optim.Optimizer.add_param_group)
    _zero_grad = inspect.unwrap(torch.optim.Optimizer.zero_grad)
    _state_dict = inspect.unwrap(torch.optim.Optimizer.state_dict)
    _load_state_dict = inspect.unwrap(torch.optim.Optimizer.load_state_dict)
    _step = inspect.unwrap(torch.optim.Adam.step)

    def add_param_group(self, param_group: dict) -> None:
        self._add_param_group(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._zero_grad(set_to_none)

    def state_dict(self) -> dict:
        return self._state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self._load_state_dict(state_dict)

    def step(self, closure=None):
        # what the step's wrapper does besides importing torch._dynamo: no autograd graph for
        # the update unless the optimizer is differentiable
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return self._step(closure)


# glibc's mallopt parameters (malloc.h) and the largest mmap threshold it takes on 64-bit Linux
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX = -1, -3, 32 * 1024 * 1024
_kept = False


def keep_freed_memory() -> bool:
    """On glibc (Linux), have the C allocator keep the memory a batch frees for the next batch
    (once a process): torch's CPU tensors come from malloc, whose defaults hand a block over 128
    KiB or so back to the system when it is freed, and the next batch's tensors of that size
    then fault their pages in afresh, zeroed by the kernel (hundreds of page faults a parity
    batch). The process keeps its peak heap instead, which every batch needs again; no value
    changes. Whether it took effect (False elsewhere)."""
    global _kept
    if _kept or not sys.platform.startswith("linux"):
        return _kept
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    _kept = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    return _kept
