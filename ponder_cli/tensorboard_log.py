"""TensorBoard event files beside metrics.csv (`ponder train --tensorboard`; the optional
`tensorboard` extra). What they hold comes from the same train.EpochStats row that metrics.csv
gets: every figure of it as a scalar per epoch, and the validation halting-step histogram."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from . import PonderError

INSTALL_HINT = "--tensorboard needs the tensorboard package: pip install tensorboard (or pip install 'ponder_cli[tensorboard]')"
HISTOGRAM = "val_halting_histogram"  # EpochStats' field: validation images halting at step 1, 2, ...


def require_tensorboard() -> None:
    """Fail before any work when --tensorboard was asked for but cannot be written."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise PonderError(INSTALL_HINT) from None


def scalar_tag(name: str) -> str:
    """train_loss -> train/loss, val_accuracy -> val/accuracy: TensorBoard groups by the prefix."""
    for prefix in ("train_", "val_"):
        if name.startswith(prefix):
            return prefix[:-1] + "/" + name[len(prefix):]
    return name


class EventLog:
    """Event files in the run folder (`tensorboard --logdir runs/NAME`, or `--logdir runs` for
    every run). The writer starts with the first epoch written, so a run that saves nothing
    leaves no file; a resumed run hides the events of the epochs it is about to redo."""

    def __init__(self, out_dir: Path, resumed_after: Optional[int] = None):
        self.out_dir = Path(out_dir)
        self.purge_step = None if resumed_after is None else resumed_after + 1
        self.writer = None

    def append(self, row: dict) -> None:
        """One epoch's row (train.EpochStats as a dict), as metrics.csv's MetricsFile.append."""
        from torch.utils.tensorboard import SummaryWriter

        if self.writer is None:
            self.writer = SummaryWriter(log_dir=str(self.out_dir), purge_step=self.purge_step)
        epoch = row["epoch"]
        for name, value in row.items():
            if name != "epoch" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(scalar_tag(name), value, epoch)
        counts = list(row.get(HISTOGRAM) or ())
        if sum(counts) > 0:
            steps = range(1, len(counts) + 1)
            total = sum(counts)
            self.writer.add_histogram_raw(
                scalar_tag(HISTOGRAM).replace("_histogram", "_step"), min=min(n for n, c in zip(steps, counts) if c),
                max=max(n for n, c in zip(steps, counts) if c), num=total,
                sum=sum(n * c for n, c in zip(steps, counts)), sum_squares=sum(n * n * c for n, c in zip(steps, counts)),
                bucket_limits=[n + 0.5 for n in steps], bucket_counts=counts, global_step=epoch)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
