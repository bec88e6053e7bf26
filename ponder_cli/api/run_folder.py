"""The folder a training run writes to, from claiming it to letting it go (runs.py says where it
is and what it may be; this is the run's own handle on it), and environment.json in it: what a
run ran on, beside config.json (which says what it trained) and kept apart from it, so that
config.json stays what resuming and `ponder info` read.

Training figures depend on the thread count and the CPU as well as on the seed (floating-point
sums are ordered differently), so a run records them: the command line, the package and its
git commit when run from a clone, the Python, torch and platform versions, the device, the
thread count and the processes. A resumed run in the same folder adds a session to the list.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from .. import PonderError, __version__
from ..checkpoint import load_checkpoint
from ..config import applies
from ..folders import ENVIRONMENT_FILE, LAST, RunLock, package_dir
from ..runs import (
    MetricsFile,
    _replace_atomically,
    TrainingPlan,
    carry_best_checkpoint,
    claim_run_dir,
    remove_if_empty_run_dir,
    write_run_config,
)
from ..train import EpochStats


class RunFolder:
    """Claimed once everything else is known to be fine (nothing is written before): locked, the
    resolved configuration (config.json, config.toml) and the environment (environment.json)
    written, metrics.csv (and TensorBoard events) begun. Every finished epoch is recorded; on
    the way out the lock is released, and a folder this run made that holds no epoch is removed
    so that the next run takes its name. Under torchrun, rank 0 alone claims it."""

    def __init__(self, plan: TrainingPlan, *, device: str, amp: bool, processes: int, tensorboard: bool,
                 log: Callable[[str], None], command: str = "ponder train"):
        self.plan, self.device, self.amp, self.processes = plan, device, amp, processes
        self.tensorboard, self.log, self.command = tensorboard, log, command
        self.saved: list[int] = []  # epochs this run has written to last.pt
        self.lock: Optional[RunLock] = None
        self.made = False  # whether this run created the folder
        self.files: list = []  # metrics.csv, and the TensorBoard events when asked for
        self.copies: list[str] = []  # files copied in when resuming into another folder
        self.launched = time.time()

    def claim(self) -> Path:
        plan = self.plan
        existed = plan.out_dir.exists() and not plan.fresh_folder
        out_dir = claim_run_dir(plan)
        self.made = not existed
        self.lock = RunLock(out_dir).acquire()
        carried = carry_best_checkpoint(plan)
        if carried is not None:
            self.log(f"{carried}: the run's best epoch so far (epoch {plan.resume.best_epoch}), copied from "
                     f"{plan.resumed.path.parent}")
            self.copies.append(carried.name)
        cfg = plan.cfg
        write_run_config(out_dir, cfg, plan.sources, resumed_from=str(plan.resumed.path) if plan.resumed else None,
                         resumed_after_epoch=plan.resume.epoch if plan.resume else None, device=self.device,
                         amp=self.amp, processes=self.processes,
                         not_applicable=[name for name in cfg.field_names() if not applies(name, cfg.chosen())])
        same_folder = plan.resume is not None and out_dir.resolve() == plan.resumed.path.parent.resolve()
        write_environment(out_dir, session(self.device, self.processes), keep_earlier=same_folder)
        # a resumed run's rows so far come from its checkpoint's history
        self.files.append(MetricsFile(out_dir, [f.name for f in dataclasses.fields(EpochStats)]))
        self.files[0].start(plan.resume.history if plan.resume else [])
        if self.tensorboard:
            self.files.append(EventLog(out_dir, resumed_after=plan.resume.epoch if plan.resume else None))
        return out_dir

    def record(self, stats: EpochStats) -> None:
        """An epoch saved to last.pt: one row in every metrics file."""
        self.saved.append(stats.epoch)
        for file in self.files:
            file.append(dataclasses.asdict(stats))

    def saved_epoch(self) -> Optional[int]:
        """The epoch last.pt holds: read from disk, since an interrupt may land between saving an
        epoch and recording it, in either order of the two."""
        last = self.plan.out_dir / LAST
        if last.exists() and (self.saved or self.plan.resume is not None or last.stat().st_mtime >= self.launched):
            try:
                return load_checkpoint(last).epoch
            except PonderError:
                pass
        return self.saved[-1] if self.saved else None

    def resume_hint(self) -> str:
        epoch, last = self.saved_epoch(), self.plan.out_dir / LAST
        if epoch is None:
            return "no epoch had completed; nothing was saved"
        return f"epoch {epoch} is saved in {last}; resume with: {self.command} --resume {last}"

    def release(self, finished: bool) -> None:
        if self.lock is not None:
            self.lock.release()
        for file in self.files:
            file.close()
        if not finished and self.made:
            remove_if_empty_run_dir(self.plan.out_dir, carried=self.copies)


def git_commit(folder: Path) -> Optional[dict]:
    """The commit of the clone whose top folder holds the package `folder`, and whether its
    tracked files differ from it; None for an installed package (even in a virtual environment
    inside some clone) or without git."""
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()
        if Path(git("rev-parse", "--show-toplevel")).resolve() != Path(folder).resolve().parent:
            return None
        return {"commit": git("rev-parse", "HEAD"),
                "modified": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return None


def session(device: str, processes: int) -> dict:
    """This process's environment, as one session of environment.json."""
    import torch

    return {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": ["ponder", *sys.argv[1:]],
            "ponder_cli": __version__, "package": str(package_dir()), "git": git_commit(package_dir()),
            "python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "machine": platform.machine(), "processor": platform.processor() or None, "device": device,
            "threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "processes": processes}


def write_environment(out_dir: Path, current: dict, keep_earlier: bool) -> Path:
    """environment.json with this session after the earlier ones (keep_earlier: a run resumed in
    its own folder), written atomically."""
    path = Path(out_dir) / ENVIRONMENT_FILE
    earlier = []
    if keep_earlier:
        try:
            earlier = list(json.loads(path.read_text(encoding="utf-8")).get("sessions", []))
        except (OSError, ValueError, AttributeError, TypeError):
            earlier = []
    payload = {"sessions": [*earlier, current]}
    _replace_atomically(path, lambda f: f.write(json.dumps(payload, indent=2) + "\n"))
    return path


# TensorBoard ---------------------------------------------------------------------------------
# TensorBoard event files beside metrics.csv (`ponder train --tensorboard`; the optional
# `tensorboard` extra). What they hold comes from the same train.EpochStats row that metrics.csv
# gets: every figure of it as a scalar per epoch, and the validation halting-step histogram.

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
