"""Where a training run starts from and writes to: the config-merge and resume rules."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import PonderError
from .config import PonderConfig

SHIPPED_CHECKPOINT = Path("checkpoints") / "best.pt"
# options that may differ from the checkpoint's config when resuming: how long to go on
RESUMABLE_CHANGES = ("epochs", "patience")


@dataclass
class TrainingPlan:
    cfg: PonderConfig
    out_dir: Path
    resume: Optional[object] = None  # checkpoint.TrainingState to continue from


def plan_training(given: dict, *, resume: Optional[Path] = None, out: Optional[Path] = None) -> TrainingPlan:
    """The config and output folder of a run from the options the user gave.

    A fresh run takes the defaults for every option not given (and what the method implies:
    plain runs one step). A resumed run takes the checkpoint's config; options that contradict
    it are refused, except those in RESUMABLE_CHANGES.
    """
    if resume is None:
        return TrainingPlan(PonderConfig.from_options(**given), out if out is not None else Path("checkpoints"))
    from .checkpoint import load_checkpoint

    state = load_checkpoint(resume)
    state.require_resumable(resume)
    saved = state.config
    conflicts = [f"--{k.replace('_', '-')} {v} (checkpoint: {getattr(saved, k)})"
                 for k, v in given.items() if k not in RESUMABLE_CHANGES and getattr(saved, k) != v]
    if conflicts:
        raise PonderError(f"cannot resume {resume} with options that contradict its config: {'; '.join(conflicts)}")
    cfg = saved.replace(**{k: given[k] for k in RESUMABLE_CHANGES if k in given})
    return TrainingPlan(cfg, out if out is not None else Path(resume).parent, state)


def default_checkpoint() -> Path:
    """The checkpoint that eval and extrapolate read when none is named."""
    if not SHIPPED_CHECKPOINT.exists():
        raise PonderError(f"no checkpoint given and {SHIPPED_CHECKPOINT} does not exist; "
                          "train one with `ponder train` or name one")
    return SHIPPED_CHECKPOINT


def check_writable(directory: Path) -> None:
    """Fail before training when checkpoints could not be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / ".ponder-write-test", "w"):
            pass
        (directory / ".ponder-write-test").unlink()
    except OSError as exc:
        raise PonderError(f"cannot write checkpoints to {directory}: {exc.strerror or exc}") from None
