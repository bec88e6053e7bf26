"""Data parallelism under torchrun: process group, ranks, collectives, batch shards.

torchrun's RANK, WORLD_SIZE and LOCAL_RANK are the only signal used; in a plain process every
helper is the identity. Each rank draws the epoch's permutation from the shared RNG stream,
trains on its slice of every global batch with its own stream (rank_rng), and DDP averages
the gradients; rank 0 alone validates, writes and prints, and broadcasts what the others need.

A dead rank fails its peers' next collective at once on gloo, a stalled one after TIMEOUT, and
torchrun sends SIGTERM to the others. On nccl a dead peer leaves the survivors waiting inside a
CUDA call, where Python runs no signal handler: setup() makes such a rank stop with the resume
hint all the same (NCCL_ERROR_HANDLING, abort_when_signal_unanswered).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from . import PonderError, brief

# Bounds the wait for every rank to join and, on the CPU (gloo), every collective: a rank that
# stalls (rather than dies, which its peers notice at once) ends the run after this long.
# Rank 0 validating and writing a checkpoint while the others wait takes about a second.
TIMEOUT = datetime.timedelta(minutes=5)
ENVIRONMENT = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
# nccl's watchdog ends a collective that has waited TIMEOUT. Mode 2 aborts the communicator and
# leaves the process running, so the next collective raises a DistError (lost_peer: the resume
# hint); torch's default, 3, ends the process on the spot, without a word. torchrun hands every
# process its own value, 1, unless its own environment sets one: that 1 is replaced; a user's
# other setting wins.
NCCL_ERROR_HANDLING = "2"
TORCHRUN_NCCL_ERROR_HANDLING = "1"
# torchrun sends SIGKILL 30 s after its SIGTERM: a rank that has not acted on a SIGTERM (or Ctrl-C)
# this many seconds after it arrived is taken to be stuck in a wait on a peer that is gone.
ABORT_AFTER_SIGNAL_S = 5.0


@dataclass(frozen=True)
class Launch:
    """Where torchrun placed this process: rank over all nodes, local_rank (the GPU index on CUDA)."""
    rank: int
    local_rank: int
    world_size: int

    @property
    def main(self) -> bool:
        return self.rank == 0


def launch() -> Launch | None:
    """torchrun's RANK, LOCAL_RANK and WORLD_SIZE, or None for a plain process."""
    if not all(name in os.environ for name in ENVIRONMENT):
        return None
    try:
        rank, local_rank, world_size = (int(os.environ[name]) for name in ENVIRONMENT)
    except ValueError:
        raise PonderError("RANK, LOCAL_RANK and WORLD_SIZE must be integers (are you running under "
                          "torchrun?)") from None
    if not 0 <= rank < world_size:
        raise PonderError(f"RANK {rank} is not between 0 and WORLD_SIZE - 1 = {world_size - 1}")
    return Launch(rank, local_rank, world_size)


class RankError(PonderError):
    """A problem of this process alone (its GPU, say): every process that meets it says so."""


def error_line(line: str, exc: BaseException | None = None) -> Optional[str]:
    """The error line this process prints for `exc` (None: it stays quiet). Under torchrun every
    process meets the same error, so each node's first prints it, labelled with its rank unless
    rank 0; a run-wide one (PonderError.run_wide) is rank 0's alone; a RankError every process's.
    """
    try:
        where = launch()
    except PonderError:
        return line  # not a torchrun environment we understand: say everything
    if where is None or where.rank == 0:
        return line
    if getattr(exc, "run_wide", False) or (where.local_rank != 0 and not isinstance(exc, RankError)):
        return None
    headline, _, message = line.partition(": ")
    return f"{headline} (rank {where.rank}): {message}"


def active() -> bool:
    """Whether setup() has started the process group: the training loop is data-parallel."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    return torch.distributed.get_rank() if active() else 0


def world_size() -> int:
    return torch.distributed.get_world_size() if active() else 1


def is_main() -> bool:
    """Rank 0 (or a plain process): the one that prints, validates and writes checkpoints."""
    return rank() == 0


def device_for(device: torch.device, where: Launch | None) -> torch.device:
    """On CUDA each rank trains on its own GPU, cuda:LOCAL_RANK; the CPU is shared."""
    if where is None or device.type != "cuda":
        return device
    if where.local_rank >= torch.cuda.device_count():
        raise RankError(f"LOCAL_RANK {where.local_rank} needs GPU cuda:{where.local_rank}, but only "
                        f"{torch.cuda.device_count()} are visible; start at most that many processes per node")
    return torch.device("cuda", where.local_rank)


def setup(device: torch.device, where: Launch | None) -> None:
    """Start the process group from torchrun's environment (gloo on the CPU, nccl on CUDA), waiting
    for every rank (at most TIMEOUT); nothing for a plain process."""
    if where is None:
        return
    if not torch.distributed.is_available():
        raise PonderError("this PyTorch build has no torch.distributed; run without torchrun")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
        if os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", TORCHRUN_NCCL_ERROR_HANDLING) == \
                TORCHRUN_NCCL_ERROR_HANDLING:
            os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = NCCL_ERROR_HANDLING
    try:
        torch.distributed.init_process_group(backend, rank=where.rank, world_size=where.world_size,
                                             timeout=TIMEOUT, **({"device_id": device} if backend == "nccl" else {}))
        torch.distributed.barrier()  # every rank is here: all have done the checks before setup()
    except (RuntimeError, ValueError) as exc:  # DistError is a RuntimeError: timeout, refused connection
        raise PonderError(f"could not start the {backend} process group of {where.world_size} processes "
                          f"({brief(exc, 200)})") from None
    if backend == "nccl" and threading.current_thread() is threading.main_thread():
        abort_when_signal_unanswered(ABORT_AFTER_SIGNAL_S)


def abort_when_signal_unanswered(grace: float, abort: Callable[[], None] | None = None) -> None:
    """From now on, a SIGTERM or SIGINT not acted on `grace` seconds after it arrived aborts the
    process group (or calls `abort`): a rank waiting inside a CUDA call for a dead peer runs no
    signal handler, and aborting the nccl communicators ends the wait, so the pending signal
    stops training as usual. Call from the main thread."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    # Python's own C-level handler writes each signal's number here, in whatever thread it runs
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    watched = {int(signal.SIGTERM), int(signal.SIGINT)}

    def abort_process_group() -> None:
        if active():
            world = torch.distributed.group.WORLD
            if hasattr(world, "abort"):  # ProcessGroup.abort, in recent PyTorch
                world.abort()
            else:
                torch.distributed.distributed_c10d._abort_process_group()

    def watch() -> None:
        while True:
            try:
                received = os.read(read, 64)
            except OSError:
                return
            if not received:
                return
            if watched & set(received):
                time.sleep(grace)
                (abort or abort_process_group)()
                return

    threading.Thread(target=watch, name="abort-when-signal-unanswered", daemon=True).start()


def lost_peer(exc: BaseException) -> bool:
    """Whether an exception is a failed collective (a rank died or stalled): nccl's DistError, or
    gloo's RuntimeError naming its source ("gloo/transport/tcp/pair.cc: Connection closed")."""
    return active() and (isinstance(exc, torch.distributed.DistError) or "gloo" in str(exc).lower())


def leave_now(code: int) -> None:
    """Under torchrun, exit at once, skipping the process group's shutdown (after an interrupt or a
    lost peer gloo can abort in its destructors with a collective in flight)."""
    if active():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def teardown() -> None:  # after a run that ended normally on every rank
    if active():
        torch.distributed.destroy_process_group()


def barrier() -> None:
    if active():
        torch.distributed.barrier()


def on_main(work: Callable[[], object]):
    """Run `work` on rank 0 alone and give every rank its result (picklable); a PonderError it
    raises is raised on every rank, marked run-wide."""
    if not active():
        return work()
    outcome: list = [None, None]  # [result, (error class, message)]
    if is_main():
        try:
            outcome[0] = work()
        except PonderError as exc:
            outcome[1] = (type(exc), str(exc))
    torch.distributed.broadcast_object_list(outcome, src=0)
    if outcome[1] is not None:
        kind, message = outcome[1]
        error = kind(message)
        error.run_wide = True
        raise error
    return outcome[0]


class _WithSpare(torch.nn.Module):
    """The model plus one parameter its forward never uses: with find_unused_parameters DDP warns
    (from C++, once per rank) the first time a step leaves none unused; this one always is."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.spare = torch.nn.Parameter(torch.zeros(1, device=next(model.parameters()).device))

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def wrap(model: torch.nn.Module, device: torch.device, *, find_unused_parameters: bool = False) -> torch.nn.Module:
    """DistributedDataParallel around the model when data-parallel, else the model itself. With
    forward_sync_buffers=False (the model has no buffers) DDP's forward makes no collective, so
    ranks may run different numbers of steps and synchronise in backward only."""
    if not active():
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(_WithSpare(model) if find_unused_parameters else model,
                                   device_ids=[device.index] if device.type == "cuda" else None,
                                   forward_sync_buffers=False, find_unused_parameters=find_unused_parameters)


def even_length(count: int) -> int:
    """The largest multiple of the world size <= count: a global batch that splits evenly over
    the ranks (equal slices keep DDP's mean gradient the global batch's)."""
    return count - count % world_size()


def shard(index: torch.Tensor) -> torch.Tensor:
    """This rank's contiguous slice of a global batch: (B,) -> (B / world_size,), rank r the r-th."""
    size = index.shape[0] // world_size()
    return index[rank() * size:(rank() + 1) * size]


@contextlib.contextmanager
def rank_rng(device: torch.device):
    """While inside, the global RNG is this rank's own stream, seeded with a draw from the shared
    one plus the rank; the shared stream (identical across ranks and in checkpoints) is put back
    after (an interrupted epoch never needs it again: a resume takes it from the checkpoint)."""
    if not active():
        yield
        return
    seed = int(torch.randint(0, 2**62, ()))  # from the shared stream, so the same on every rank
    shared = torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    torch.manual_seed(seed + rank())
    yield
    torch.set_rng_state(shared[0])
    if device.type == "cuda":
        torch.cuda.set_rng_state(shared[1], device)


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The elementwise sum over all ranks, a new tensor on every rank."""
    if not active():
        return tensor
    total = tensor.clone()
    torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM)
    return total


def broadcast_from_main(values: list[float], device: torch.device) -> list[float]:
    """Rank 0's floats on every rank (the others pass placeholders of the same length), sent as
    float64 so that every rank gets exactly rank 0's values."""
    if not active():
        return values
    buffer = torch.tensor(values, dtype=torch.float64, device=device)
    torch.distributed.broadcast(buffer, src=0)
    return buffer.tolist()
