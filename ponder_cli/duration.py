"""How long a run will take: the first epoch's batches timed, one line said once."""

from __future__ import annotations

import time
from typing import Callable, Optional

import torch

from .tasks import TrainingSource

# The run's duration is estimated once from the first epoch's batches (the first left out: it
# pays start-up costs), as soon as this many are timed or this many seconds have passed; a run
# estimated to take less than ESTIMATE_FROM_SECONDS gets no estimate: its epoch lines come soon.
ESTIMATE_AFTER_BATCHES, ESTIMATE_AFTER_SECONDS, ESTIMATE_FROM_SECONDS = 20, 5.0, 60.0


def rough_duration(seconds: float) -> str:
    """45 s, 3 min, 1.5 h, 12 h: a duration as a person says it."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h" if seconds < 10 * 3600 else f"{round(seconds / 3600)} h"


def duration_estimate(epoch_seconds: float, epochs: int) -> Optional[str]:
    """The line that says how long an epoch and the `epochs` to go will take; None for a short run."""
    if epoch_seconds * epochs < ESTIMATE_FROM_SECONDS:
        return None
    if epochs == 1:
        return f"about {rough_duration(epoch_seconds)} for 1 epoch"
    total = rough_duration(epoch_seconds * epochs)
    return f"about {rough_duration(epoch_seconds)} an epoch, {total} for {epochs} epochs"


class TimedSource(TrainingSource):
    """A task's training batches, timed during the first epoch of a session until they give the
    run's duration_estimate, which goes to `log` once. The clock starts after the first `skip`
    batches (start-up costs; on CUDA the capture of the batch as well); on CUDA the device is
    waited for where the clock is read, twice a run (its work runs behind the host's).
    Everything else passes through."""

    def __init__(self, source: TrainingSource, epochs: int, log: Callable[[str], None],
                 clock: Callable[[], float] = time.perf_counter, *, device=None, skip: int = 1):
        self.source, self.epochs, self.log, self.clock = source, epochs, log, clock
        self.batches, self.started, self.epochs_started = 0, 0.0, 0
        self.skip = skip
        self.synchronize = (lambda: torch.cuda.synchronize(device)) if device is not None and \
            torch.device(device).type == "cuda" else (lambda: None)

    def start_epoch(self) -> int:
        self.epochs_started += 1
        self.batches = self.source.start_epoch()
        return self.batches

    def stage(self, index: int) -> None:
        if self.epochs_started == 1 and index >= self.skip and self.started is not None:
            self._time(index)
        self.source.stage(index)

    def batch(self):
        return self.source.batch()

    def generators(self) -> tuple:
        return self.source.generators()

    @property
    def graph_safe(self) -> bool:
        return self.source.graph_safe

    def _time(self, index: int) -> None:
        self.synchronize()
        now = self.clock()
        if index == self.skip:  # the batches before it, with their start-up costs, are done: the clock starts
            self.started = now
            return
        timed, seconds = index - self.skip, now - self.started
        if timed >= ESTIMATE_AFTER_BATCHES or seconds >= ESTIMATE_AFTER_SECONDS:
            self.started = None  # once
            line = duration_estimate(seconds / timed * self.batches, self.epochs)
            if line is not None:
                self.log(line)

    def state(self) -> Optional[dict]:
        return self.source.state()

    def load_state(self, state: Optional[dict]) -> None:
        self.source.load_state(state)
