"""Where a training run starts from and writes to: the config-merge and resume rules, the run
folder (a fresh one under runs/ by default, never another run's or the shipped models), the lock
that keeps two runs out of one folder, and the checkpoint eval and extrapolate read by default."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import PonderError
from .config import PonderConfig

RUNS_DIR = Path("runs")
SHIPPED_CHECKPOINT = Path("checkpoints") / "best.pt"
# The shipped models live in checkpoints/ next to the package (an editable install or a clone)
# and, as the README's commands assume, under the working directory.
SHIPPED_DIRS = (Path("checkpoints"), Path(__file__).resolve().parent.parent / "checkpoints")
CHECKPOINT_FILES = ("best.pt", "last.pt")  # what `ponder train` writes into its folder
LOCK_FILE = ".ponder.lock"
# options that may differ from the checkpoint's config when resuming: how long to go on
RESUMABLE_CHANGES = ("epochs", "patience")


@dataclass
class TrainingPlan:
    cfg: PonderConfig
    out_dir: Path
    resume: Optional[object] = None  # checkpoint.TrainingState to continue from
    fresh_folder: bool = False  # out_dir is the default runs/ folder: take the next free name if it is taken


def plan_training(given: dict, *, resume: Optional[Path] = None, out: Optional[Path] = None,
                  overwrite: bool = False) -> TrainingPlan:
    """The config and output folder of a run from the options the user gave; writes nothing.

    A fresh run takes the defaults for every option not given (and what the method implies:
    plain runs one step) and writes to a new folder under runs/ unless --out names one. A resumed
    run takes the checkpoint's config; options that contradict it are refused, except those in
    RESUMABLE_CHANGES. A folder holding another run's checkpoints (or the shipped models) is
    refused unless overwrite is set.
    """
    if out is not None and out.exists() and not out.is_dir():
        raise PonderError(f"--out {out} is a file; --out names the folder for best.pt and last.pt")
    if resume is None:
        cfg = PonderConfig.from_options(**given)
        if out is None:
            return TrainingPlan(cfg, free_run_dir(cfg), fresh_folder=True)
        check_unlocked(out)
        refuse_foreign_checkpoints(out, overwrite)
        return TrainingPlan(cfg, out)

    from .checkpoint import LAST, load_checkpoint

    state = load_checkpoint(resume)
    state.require_resumable(resume)
    saved = state.config
    conflicts = [f"--{k.replace('_', '-')} {v} (checkpoint: {getattr(saved, k)})"
                 for k, v in given.items() if k not in RESUMABLE_CHANGES and getattr(saved, k) != v]
    if conflicts:
        raise PonderError(f"cannot resume {resume} with options that contradict its config: {'; '.join(conflicts)}")
    cfg = saved.replace(**{k: given[k] for k in RESUMABLE_CHANGES if k in given})
    out_dir = out if out is not None else Path(resume).parent
    check_unlocked(out_dir)
    if state.epoch >= cfg.epochs:
        raise PonderError(f"nothing to do: the run in {resume} is complete ({state.epoch} of {cfg.epochs} epochs); "
                          f"to train it longer, raise --epochs: ponder train --resume {resume} --epochs N "
                          f"(N > {state.epoch})")
    if not _same_path(out_dir, Path(resume).parent):
        refuse_foreign_checkpoints(out_dir, overwrite)  # continuing in another folder: a fresh one
    elif not overwrite:
        if is_shipped(out_dir):
            raise PonderError(f"{out_dir} holds the shipped models, which resuming would overwrite; continue "
                              f"in another folder with --out DIR (or pass --overwrite)")
        _refuse_rewind(state, Path(resume), out_dir / LAST)
    return TrainingPlan(cfg, out_dir, state)


def _refuse_rewind(state, resume: Path, last: Path) -> None:
    """Resuming an older checkpoint (best.pt, say) of a run would overwrite its newer last.pt."""
    if _same_path(resume, last) or not last.is_file():
        return
    from .checkpoint import load_checkpoint
    try:
        newer = load_checkpoint(last).epoch
    except PonderError:
        return  # an unreadable last.pt holds nothing to lose
    if newer > state.epoch:
        raise PonderError(f"resuming {resume} (epoch {state.epoch}) would rewind the run and overwrite the newer "
                          f"{last} (epoch {newer}); resume from {last}, continue in another folder with --out DIR, "
                          f"or pass --overwrite to go back to epoch {state.epoch}")


def _same_path(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


def is_shipped(directory: Path) -> bool:
    """Is this folder (or one inside) where the shipped models live?"""
    here = directory.resolve()
    return any(here == d.resolve() or d.resolve() in here.parents for d in SHIPPED_DIRS
               if (d / SHIPPED_CHECKPOINT.name).exists())


def refuse_foreign_checkpoints(directory: Path, overwrite: bool) -> None:
    """A folder that already holds checkpoints belongs to another run: never replace them silently."""
    found = [name for name in CHECKPOINT_FILES if (directory / name).exists()]
    if not found or overwrite:
        return
    if is_shipped(directory):
        raise PonderError(f"{directory} holds the shipped models ({', '.join(found)}), which training there would "
                          "replace; leave out --out for a fresh folder under runs/, name another one, or pass "
                          "--overwrite")
    raise PonderError(f"{directory} already holds another run's checkpoints ({', '.join(found)}); leave out --out "
                      f"for a fresh folder under runs/, name another one, continue that run with "
                      f"--resume {directory / 'last.pt'}, or pass --overwrite to replace them")


def run_dir_name(cfg: PonderConfig) -> str:
    return f"{cfg.method}-{cfg.step}-seed{cfg.seed}"


def free_run_dir(cfg: PonderConfig, root: Path = RUNS_DIR) -> Path:
    """runs/<method>-<step>-seed<seed>, or the first of -2, -3, ... not taken yet."""
    base = root / run_dir_name(cfg)
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def claim_run_dir(plan: TrainingPlan) -> Path:
    """Create the run folder. The default folder is made with an exclusive mkdir, so two runs
    started at once with the same options get -2 and -3 rather than one folder."""
    try:
        if not plan.fresh_folder:
            plan.out_dir.mkdir(parents=True, exist_ok=True)
            return plan.out_dir
        plan.out_dir.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                plan.out_dir.mkdir()
                return plan.out_dir
            except FileExistsError:
                plan.out_dir = free_run_dir(plan.cfg, plan.out_dir.parent)
    except OSError as exc:
        raise PonderError(f"cannot write checkpoints to {plan.out_dir}: {exc.strerror or exc}") from None


# The lock ---------------------------------------------------------------------------------------

def _lock_holder(path: Path) -> Optional[int]:
    """The PID in a lock file, if that process is still alive (and is not this one)."""
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None  # gone, or written by a process that died before writing its PID
    if pid == os.getpid() or pid <= 0:
        return None
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid  # alive, another user's
    return pid


def _in_use(directory: Path, pid: int) -> PonderError:
    return PonderError(f"{directory} is in use by another `ponder train` (PID {pid}); wait for it to finish, "
                       "or train into another folder")


def check_unlocked(directory: Path) -> None:
    """Fail early, before loading any data, when a live run holds the folder (RunLock decides)."""
    pid = _lock_holder(directory / LOCK_FILE)
    if pid is not None:
        raise _in_use(directory, pid)


@contextlib.contextmanager
def _serialised(directory: Path):
    """Hold an advisory lock on the folder itself while a lock file is checked and taken, so
    two processes cannot both take over the same stale lock."""
    try:
        import fcntl
    except ImportError:  # not POSIX: the O_EXCL create alone
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


class RunLock:
    """`.ponder.lock` in a run folder, holding the PID of the run that writes there.

    Created atomically (O_CREAT | O_EXCL); a lock left by a process that no longer exists (one
    killed with SIGKILL, say) is taken over, a live one is refused naming its PID. Released
    (removed) on exit, errors and interrupts included.
    """

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self.held = False

    def acquire(self) -> "RunLock":
        try:
            with _serialised(self.directory):
                while True:
                    try:
                        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    except FileExistsError:
                        pid = _lock_holder(self.path)
                        if pid is not None:
                            raise _in_use(self.directory, pid) from None
                        self.path.unlink(missing_ok=True)  # stale: its process is gone
                        continue
                    with os.fdopen(fd, "w") as f:
                        f.write(f"{os.getpid()}\n")
                    self.held = True
                    return self
        except OSError as exc:
            raise PonderError(f"cannot write checkpoints to {self.directory}: {exc.strerror or exc}") from None

    def release(self) -> None:
        if self.held:
            self.held = False
            with contextlib.suppress(OSError):
                self.path.unlink()

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# The default checkpoint -------------------------------------------------------------------------

def default_checkpoint() -> tuple[Path, str]:
    """The checkpoint eval and extrapolate read when none is named, and why: the best.pt of the
    newest run under runs/, else the shipped checkpoints/best.pt."""
    newest = newest_run_checkpoint()
    if newest is not None:
        return newest, f"the newest run under {RUNS_DIR}/"
    if SHIPPED_CHECKPOINT.exists():
        return SHIPPED_CHECKPOINT, "the shipped model"
    raise PonderError(f"no checkpoint given, no {RUNS_DIR}/*/best.pt and {SHIPPED_CHECKPOINT} does not exist; "
                      "train one with `ponder train` or name one")


def newest_run_checkpoint(root: Path = RUNS_DIR) -> Optional[Path]:
    """The most recently written runs/<name>/best.pt, if any."""
    found = []
    for path in root.glob(f"*/{SHIPPED_CHECKPOINT.name}"):
        with contextlib.suppress(OSError):  # a run folder removed while we look
            found.append((path.stat().st_mtime, str(path), path))
    return max(found)[2] if found else None
