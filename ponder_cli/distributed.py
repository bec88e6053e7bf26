"""Data parallelism under torchrun: process group, ranks, collectives, batch shards.

`torchrun --nproc_per_node=N -m ponder_cli train ...` starts N copies of the command with RANK,
WORLD_SIZE and LOCAL_RANK in their environment; that environment is the only signal used here.
A plain process never initialises torch.distributed, and every helper below is then the identity
(one rank, nothing to reduce), so the single-process training loop runs exactly as before.

What each rank does (see train.py): it draws the epoch's permutation from the RNG stream all
ranks share (same seed, same draws), trains on its contiguous slice of every global batch, with
rotations, dropout and coin flips from its own stream (fork_rank_rng), and DistributedDataParallel
averages the gradients in backward. Metrics are summed over ranks; rank 0 alone validates, claims
and locks the run folder, prints and writes checkpoints (api.train_run), and broadcasts what the
others need to take the same decisions (the run folder, the validation numbers).

When a rank dies, its peers' next collective fails at once on the CPU (gloo: the connection
closes); when it stalls, after TIMEOUT. Under torchrun, the agent also sends SIGTERM to the other
ranks as soon as one exits with an error, and the CLI's signal handler treats SIGTERM like Ctrl-C,
so every rank stops. On CUDA (nccl) a dead peer goes unnoticed: the survivors' collectives wait on the GPU
and the host waits inside a CUDA call, where Python cannot run the SIGTERM handler. setup() makes
such a rank stop with the resume hint all the same (see NCCL_ERROR_HANDLING and
abort_when_signal_unanswered).
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

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

T = TypeVar("T")


@dataclass(frozen=True)
class Launch:
    """Where torchrun placed this process."""
    rank: int  # 0 .. world_size - 1, over all nodes
    local_rank: int  # 0 .. processes on this node - 1: the GPU index on CUDA
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
    """The error line this process prints for `exc` (None: it stays quiet); for the CLI's error
    boundary.

    Under torchrun every process of a node runs the same checks on the same arguments, files and
    data and meets the same error, so only each node's first process prints it, labelled with
    its rank unless it is rank 0. A run-wide message (PonderError.run_wide: an interrupt with its
    resume hint, a problem rank 0 met and told the others) is rank 0's alone; a RankError is
    printed by every process that meets it. A plain process prints every line as it is.
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
    """True once setup() has started the process group: the training loop is data-parallel."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    return torch.distributed.get_rank() if active() else 0


def world_size() -> int:
    return torch.distributed.get_world_size() if active() else 1


def is_main() -> bool:
    """Rank 0 (or a plain process): the one that prints, validates and writes checkpoints."""
    return rank() == 0


def check_batch_size(batch_size: int, where: Launch | None) -> None:
    """--batch-size is the global batch: it must split evenly over the ranks."""
    if where is not None and batch_size % where.world_size:
        raise PonderError(f"--batch-size {batch_size} is the global batch and must be divisible by the "
                          f"{where.world_size} processes torchrun started (each takes an equal share)")


def device_for(device: torch.device, where: Launch | None) -> torch.device:
    """On CUDA each rank trains on its own GPU, cuda:LOCAL_RANK; the CPU is shared."""
    if where is None or device.type != "cuda":
        return device
    if where.local_rank >= torch.cuda.device_count():
        raise RankError(f"LOCAL_RANK {where.local_rank} needs GPU cuda:{where.local_rank}, but only "
                          f"{torch.cuda.device_count()} are visible; start at most that many processes per node")
    return torch.device("cuda", where.local_rank)


def setup(device: torch.device, where: Launch | None) -> None:
    """Start the process group from torchrun's environment: gloo on the CPU, nccl on CUDA.

    Does nothing for a plain process. MASTER_ADDR and MASTER_PORT come from torchrun too. Joining
    waits for every rank (at most TIMEOUT), so no rank gets past this before all have done the
    checks that precede it.
    """
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
    """From now on, a SIGTERM or SIGINT that this process has not acted on `grace` seconds after
    it arrived aborts the process group (or calls `abort`). Call from the main thread.

    A rank whose peer died waits inside a CUDA call for a collective that never ends, and Python
    runs signal handlers only between bytecodes: torchrun's SIGTERM would go unanswered until its
    SIGKILL. Aborting the nccl communicators ends the collective, the wait returns, and the
    pending signal stops training as usual, with the resume hint. A process that acts on the
    signal in time has left (distributed.leave_now) before the grace is over.
    """
    read, write = os.pipe()
    os.set_blocking(write, False)
    # Python's own C-level handler writes each signal's number here, in whatever thread it runs
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    watched = {int(signal.SIGTERM), int(signal.SIGINT)}

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
                (abort or _abort_process_group)()
                return

    threading.Thread(target=watch, name="abort-when-signal-unanswered", daemon=True).start()


def _abort_process_group() -> None:
    if active():
        world = torch.distributed.group.WORLD
        if hasattr(world, "abort"):  # ProcessGroup.abort, in recent PyTorch
            world.abort()
        else:
            torch.distributed.distributed_c10d._abort_process_group()


def lost_peer(exc: BaseException) -> bool:
    """Whether an exception is a failed collective: a rank died, or stalled past TIMEOUT.

    nccl raises DistError; gloo raises a plain RuntimeError naming its own source file
    ("gloo/transport/tcp/pair.cc: Connection closed by peer", "... Timed out ...").
    """
    return active() and (isinstance(exc, torch.distributed.DistError) or "gloo" in str(exc).lower())


def leave_now(code: int) -> None:
    """After an interrupt or a lost peer under torchrun, exit at once with `code`, skipping the
    process group's shutdown: a collective may still be in flight with ranks that are gone, and
    gloo can then abort the process in its destructors. Nothing is lost: checkpoints are written
    atomically and the run lock is released before this is reached. Returns (does nothing) when
    no process group is active: a plain process, or one that has already torn it down."""
    if not active():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def teardown() -> None:
    """End the process group (after a run that ended normally on every rank)."""
    if active():
        torch.distributed.destroy_process_group()


def on_main(work: Callable[[], T]) -> T:
    """Run `work` on rank 0 alone and give every rank its result (a picklable value).

    A PonderError it raises is raised on every rank, marked run-wide, so that all stop together
    and rank 0 alone prints it. Without a process group, simply work().
    """
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
    """The model plus one parameter that its forward never uses (and no optimizer holds).

    With find_unused_parameters DDP searches each step's graph for parameters that got no
    gradient on this rank, and warns (once per rank, from C++, past Python's warning filters)
    the first time a step has none, which under training truncation is most steps: the spare
    parameter is always unused, so the search is never empty and stderr stays rank 0's.
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.spare = torch.nn.Parameter(torch.zeros(1, device=next(model.parameters()).device))

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def wrap(model: torch.nn.Module, device: torch.device, *, find_unused_parameters: bool = False) -> torch.nn.Module:
    """DistributedDataParallel around the model when data-parallel, else the model itself.

    DDP broadcasts rank 0's weights at construction and averages gradients in backward. Keep the
    unwrapped model for evaluation and checkpoints (its state_dict has no "module." prefix).
    The model has no buffers, and forward_sync_buffers=False says so: DDP's forward then makes no
    collective, so ranks may run different numbers of ponder steps (training truncation) and
    synchronise only in backward, once per batch on every rank. find_unused_parameters must be
    set when some parameter may get no gradient on a rank (see train.train): DDP then counts it
    as a zero gradient on that rank, so the average still equals one process's gradient on the
    global batch, and leaves a parameter no rank used without one, as one process would. It
    costs a search of every backward graph and, with the spare parameter, an extra collective
    and a host sync per batch: leave it off whenever every forward reaches every parameter.
    """
    if not active():
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(_WithSpare(model) if find_unused_parameters else model,
                                   device_ids=[device.index] if device.type == "cuda" else None,
                                   forward_sync_buffers=False, find_unused_parameters=find_unused_parameters)


def barrier() -> None:
    """Wait for every rank (after rank 0 has written a checkpoint, say)."""
    if active():
        torch.distributed.barrier()


def even_length(count: int) -> int:
    """The largest multiple of the world size <= count: the size of a global batch that splits
    evenly over the ranks, where the training set is smaller than one batch (an epoch's batches
    are whole, tasks.mnist.ImageBatches). Equal slices keep DDP's mean of the ranks' gradients
    equal to the gradient of the global batch's mean loss.
    """
    return count - count % world_size()


def shard(index: torch.Tensor) -> torch.Tensor:
    """This rank's contiguous slice of a global batch: (B,) -> (B / world_size,), rank r the r-th."""
    size = index.shape[0] // world_size()
    return index[rank() * size:(rank() + 1) * size]


def fork_rank_rng(device: torch.device) -> tuple | None:
    """Switch the global RNG to this rank's own stream; join_shared_rng switches back.

    Every rank starts from the same seed and makes the same draws on the shared stream (the
    epoch's permutation, then the seed drawn here), so that stream stays identical across ranks,
    epoch after epoch and in checkpoints, whatever each rank draws on its own. Rank r's stream is
    seeded with the shared draw plus r: it differs between ranks and epochs and follows from --seed.
    Returns the shared stream's state (None when not data-parallel: nothing is switched).
    """
    if not active():
        return None
    seed = int(torch.randint(0, 2**62, ()))  # from the shared stream, so the same on every rank
    shared = (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)
    torch.manual_seed(seed + rank())
    return shared


def join_shared_rng(shared: tuple | None, device: torch.device) -> None:
    """Back to the shared stream saved by fork_rank_rng (an interrupted epoch never needs it again:
    a resumed run takes the shared stream from the checkpoint)."""
    if shared is None:
        return
    torch.set_rng_state(shared[0])
    if device.type == "cuda":
        torch.cuda.set_rng_state(shared[1], device)


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The elementwise sum of `tensor` over all ranks (a new tensor, on every rank)."""
    if not active():
        return tensor
    total = tensor.clone()
    torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM)
    return total


def broadcast_from_main(values: list[float], device: torch.device) -> list[float]:
    """Rank 0's floats on every rank; the others pass placeholders of the same length. Sent as
    float64, so every rank gets exactly rank 0's values."""
    if not active():
        return values
    buffer = torch.tensor(values, dtype=torch.float64, device=device)
    torch.distributed.broadcast(buffer, src=0)
    return buffer.tolist()
