"""Checkpoints: a named training state, written atomically as a plain dict, loaded safely.

A checkpoint holds tensors and plain Python values only (loaded with weights_only=True, so a
file carrying pickled code is refused, never run), and every key is checked on load: a missing
or malformed one is one line naming it.
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import shutil
import warnings
from pathlib import Path

import torch

from . import BadValue, PonderError, PonderWarning, brief, uninterrupted
from .folders import DAMAGE_HINT, TrainingState, checkpoint_file_problem, replace_atomically
from .config import MAX_STEPS, PonderConfig, applies
from .model import build_model
from .tasks import get_task

class CheckpointNotSaved(PonderError):
    """A checkpoint the file system would not take (full, read-only, over quota); `problem`
    without the message's word on the previous file (training says how to resume instead)."""

    def __init__(self, path: Path, cause: str):
        self.problem = f"cannot save checkpoint {path}: {cause}"
        super().__init__(self.problem + (f"; the previous {path.name} is intact" if path.exists() else ""))


def save_checkpoint(state: TrainingState, *paths: Path) -> None:
    """`state` to each of `paths`, as one (an interrupt waits until the last is written), each
    through a temp file beside it, so never a torn file; a failure to write is one
    CheckpointNotSaved, the previous checkpoint left as it was."""
    def write(f) -> None:
        torch.save(state.to_dict(), f)
        f.flush()
        os.fsync(f.fileno())  # on the disk before it replaces the previous one

    with uninterrupted():
        for path in map(Path, paths):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                replace_atomically(path, write, binary=True)
            except BaseException as exc:
                chain = list(_chain(exc))
                interrupt = next((seen for seen in chain if isinstance(seen, KeyboardInterrupt)), None)
                if interrupt is not None and interrupt is not exc:
                    # Ctrl-C as Python raises it (a library caller's) inside torch.save makes its zip
                    # writer fail to close the file ("unexpected pos"), an error that would hide it
                    raise interrupt from None
                cause = _write_failure(exc, chain, path.parent)
                if cause is None:
                    raise
                raise CheckpointNotSaved(path, cause) from None


_DISK_ERRORS = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded",
                errno.EIO: "Input/output error"}


def _chain(exc: BaseException):
    """`exc`, then what it was raised from or while handling, and so on."""
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def _write_failure(exc: BaseException, chain: list, folder: Path) -> str | None:
    """Why a save failed, when the file system is to blame; None for anything else (a bug).

    torch.save reports a failed write of its zip container as a RuntimeError ("enforce fail …
    unexpected pos"), with the OSError only as the context it was raised in.
    """
    if not isinstance(exc, Exception):
        return None  # Ctrl-C, SIGTERM: not the disk's doing
    for seen in chain:
        if isinstance(seen, OSError):
            return _DISK_ERRORS.get(seen.errno) or seen.strerror or brief(seen)
    if not isinstance(exc, RuntimeError):
        return None
    for message in _DISK_ERRORS.values():
        if message in str(exc):
            return message
    try:
        if shutil.disk_usage(folder).free < 1 << 20:  # the chain was lost, but the disk is full
            return _DISK_ERRORS[errno.ENOSPC]
    except OSError:
        pass
    return None


def load_checkpoint(path: Path | str, map_location="cpu") -> TrainingState:
    """Load with weights_only=True: a file carrying pickled code is refused, never executed."""
    path = Path(path)
    problem = checkpoint_file_problem(path)
    if problem is not None:
        raise PonderError(problem)
    try:
        with warnings.catch_warnings():  # torch warns about odd pickle protocols before failing
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        # weights_only refuses any pickled global (a class or function to call) before running it
        found = re.search(r"GLOBAL\s+([\w.]+)", str(exc), flags=re.IGNORECASE)
        if found:
            raise PonderError(f"checkpoint {path} refused: it contains pickled code ({found.group(1)}), "
                              "not just tensors and plain values") from None
        raise PonderError(f"checkpoint {path} is not a readable checkpoint (corrupt data)") from None
    except Exception as exc:  # a legacy (pickle) file cut short, or data torch cannot decode
        raise PonderError(f"checkpoint {path} is cut short or damaged ({brief(exc)}); {DAMAGE_HINT}") from None
    state = TrainingState.from_dict(payload, path, tensor=torch.Tensor)
    # weights with NaN or inf compute nothing meaningful: said, but loaded all the same (to look
    # inside, or to resume from the epoch before)
    bad = [name for name, tensor in state.model.items()
           if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
    if bad:
        warnings.warn(f"checkpoint {path} has non-finite weights (NaN or inf in {len(bad)} of its "
                      f"{len(state.model)} tensors, {bad[0]} first): what it computes means nothing",
                      PonderWarning, stacklevel=2)
    return state


def new_model(cfg: PonderConfig) -> torch.nn.Module:
    """A freshly initialised model for a config, sized by its task."""
    task = get_task(cfg)
    return build_model(cfg, classes=task.classes, input_shape=task.input_shape)


def load_model(path: Path | str, device, max_steps: int | None = None, *, every_method: bool = True
               ) -> tuple[torch.nn.Module, PonderConfig, TrainingState]:
    """The model rebuilt from the checkpoint's own config. `max_steps` (--max-steps) runs it for
    that many steps instead of those it trained with (no weight depends on it); a method that runs
    one step (plain) refuses another, or with `every_method` False (compare) keeps its one. The
    config returned is the one run; state.config is the one trained."""
    state = load_checkpoint(path)
    cfg = state.config
    if max_steps is not None and (every_method or applies("max_steps", cfg.chosen())):
        problem = steps_problem(max_steps)
        if problem is not None:
            raise BadValue(problem)
        if max_steps != cfg.method.max_steps:
            if not applies("max_steps", cfg.chosen()):
                raise BadValue(f"--max-steps applies to models that run several steps; this one is "
                               f"{cfg.method.name}, which runs {cfg.method.max_steps}")
            cfg = cfg.replace(max_steps=max_steps)
    model = new_model(cfg)
    try:
        model.load_state_dict(state.model)
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise PonderError(f"checkpoint {path}: weights do not match its config ({brief(exc)})") from None
    return model.to(device).eval(), cfg, state


def steps_problem(max_steps) -> str | None:
    """What is wrong with an evaluation's --max-steps on its own (None: nothing): the range that
    training allows (config.MAX_STEPS)."""
    if type(max_steps) is not int or not 1 <= max_steps <= MAX_STEPS:
        return f"--max-steps must be a whole number from 1 to {MAX_STEPS} (got {max_steps!r})"
    return None
