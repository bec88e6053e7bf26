"""Where a training run starts from and writes to: the config-merge and resume rules, the run
folder (a fresh one under runs/ by default, never another run's or the shipped models), the lock
that keeps two runs out of one folder, the files a run keeps beside its checkpoints (config.json,
config.toml, metrics.csv); the lock, and which file a CHECKPOINT argument names, are in
folders.py."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from . import PonderError, __version__, file_problem
from .checkpoint import load_checkpoint
from .config import PonderConfig, inapplicable, render_config, spelled
from .folders import (BEST, CHECKPOINT_FILES, CONFIG_FILE, CONFIG_TOML, ENVIRONMENT_FILE, LAST,  # noqa: F401
                      METRICS_FILE, RUNS_DIR, Resolved, RunLock, accepted_forms, check_unlocked,
                      newest_run_checkpoint, resolve_checkpoint, run_files_in)
from .shipped import package_problem
from .tasks import get_task

# options that may differ from the checkpoint's config when resuming: how long to go on
RESUMABLE_CHANGES = ("epochs", "patience")


@dataclass
class TrainingPlan:
    cfg: PonderConfig
    out_dir: Path
    resume: Optional[object] = None  # checkpoint.TrainingState to continue from
    fresh_folder: bool = False  # out_dir is the default runs/ folder: take the next free name if it is taken
    sources: dict = field(default_factory=dict)  # field -> where its value came from (PonderConfig.sources)
    resumed: Optional["Resolved"] = None  # the checkpoint --resume named, and how


def resolve_config(given: dict, resume: Optional[Path] = None, origins: Optional[dict] = None):
    """The configuration of a run from the options the user gave, where each value comes from,
    and, when resuming, the checkpoint it continues (checkpoint.TrainingState) and how its name
    resolved; reads but writes nothing.

    A fresh run takes the defaults for every option not given (and what the chosen pieces imply:
    plain runs one step). A resumed run takes the checkpoint's config; options that contradict
    it are refused, except those in RESUMABLE_CHANGES. `resume` is a CHECKPOINT argument
    (resolve_checkpoint; a run folder or `latest` names its last.pt). `origins`: the file that
    gave each setting the user gave in one (--config).
    """
    origins = origins or {}
    if resume is None:
        cfg = PonderConfig.of(origins=origins, **given)
        return cfg, cfg.sources(given, origins), None, None
    resumed = resolve_checkpoint(resume, file=LAST)
    state = load_checkpoint(resumed.path)
    state.require_resumable(resumed.path)
    saved = state.config
    problems = inapplicable(given, saved.chosen(), lambda key: spelled(key, origins, "--"))
    if problems:
        raise PonderError(f"cannot resume {resumed.path} ({saved.method.name}, step {saved.step.name}): "
                          f"{'; '.join(problems)}")
    conflicts = [f"{spelled(k, origins, '--')} {v} (checkpoint: {saved.value(k)})"
                 for k, v in given.items() if k not in RESUMABLE_CHANGES and saved.value(k) != v]
    if conflicts:
        raise PonderError(f"cannot resume {resumed.path} with options that contradict its config: "
                          f"{'; '.join(conflicts)}")
    cfg = saved.replace(**{k: given[k] for k in RESUMABLE_CHANGES if k in given})
    sources = {name: source if name in given else "checkpoint" for name, source in cfg.sources(given, origins).items()}
    return cfg, sources, state, resumed


def plan_training(given: dict, *, resume: Optional[Path] = None, out: Optional[Path] = None,
                  overwrite: bool = False, origins: Optional[dict] = None) -> TrainingPlan:
    """The config (resolve_config) and output folder of a run; writes nothing.

    A fresh run writes to a new folder under runs/ unless --out names one; a resumed run to its
    own folder. A folder holding another run's checkpoints (or the shipped models) is refused
    unless overwrite is set.
    """
    if out is not None and out.exists() and not out.is_dir():
        raise PonderError(f"--out {out} {file_problem(out) or 'is a file'}; --out names the folder for best.pt and "
                          f"last.pt")
    problem = package_problem(out, f"--out {out}") if out is not None else None
    if problem:
        raise PonderError(f"{problem}; name a folder outside it, or leave out --out for a fresh folder under "
                          f"{RUNS_DIR}/")
    cfg, sources, state, resumed = resolve_config(given, resume, origins)
    if state is None:
        if out is None:
            return TrainingPlan(cfg, free_run_dir(cfg), fresh_folder=True, sources=sources)
        check_unlocked(out)
        refuse_foreign_checkpoints(out, overwrite)
        return TrainingPlan(cfg, out, sources=sources)
    resume = resumed.path
    out_dir = out if out is not None else Path(resume).parent
    check_unlocked(out_dir)
    if state.epoch >= cfg.training.epochs:
        epochs = cfg.training.epochs
        done = (f"is complete ({state.epoch} of {epochs} epochs)" if state.epoch == epochs else
                f"has trained {state.epoch} epochs, more than --epochs {epochs} asks for")
        raise PonderError(f"nothing to do: the run in {resume} {done}; to train it longer, raise --epochs: "
                          f"ponder train --resume {resume} --epochs N (N > {state.epoch})")
    if not _same_path(out_dir, Path(resume).parent):
        refuse_foreign_checkpoints(out_dir, overwrite)  # continuing in another folder: a fresh one
    elif package_problem(out_dir, str(out_dir)):
        raise PonderError(f"{package_problem(out_dir, str(out_dir))}; continue the run in another folder with "
                          f"--out DIR")
    elif not overwrite:
        _refuse_rewind(state, Path(resume), out_dir / LAST)
    return TrainingPlan(cfg, out_dir, state, sources=sources, resumed=resumed)


def _refuse_rewind(state, resume: Path, last: Path) -> None:
    """Resuming an older checkpoint (best.pt, say) of a run would overwrite its newer last.pt."""
    if _same_path(resume, last) or not last.is_file():
        return
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


def refuse_foreign_checkpoints(directory: Path, overwrite: bool) -> None:
    """A folder that already holds any file a run writes (checkpoints, config.json, metrics.csv,
    ...: another run's, or the user's own) is never written into silently: nothing of theirs is
    replaced without --overwrite."""
    found = run_files_in(directory)
    if not found or overwrite:
        return
    named = ", ".join(found[:6]) + (f" and {len(found) - 6} more" if len(found) > 6 else "")
    if any(name in CHECKPOINT_FILES for name in found):
        raise PonderError(f"{directory} already holds another run's checkpoints ({named}); leave out --out "
                          f"for a fresh folder under runs/, name another one, continue that run with "
                          f"--resume {directory / 'last.pt'}, or pass --overwrite to replace them")
    raise PonderError(f"{directory} already holds files a run writes ({named}), which training would replace; "
                      f"name another --out (or leave it out for a fresh folder under runs/), or pass --overwrite "
                      f"to replace them")


def run_dir_name(cfg: PonderConfig) -> str:
    """<task's prefix><method>-<step>-seed<seed>: mnist has none, parity parity<elems>-, another
    task its name and a dash (Task.run_name_prefix)."""
    return f"{get_task(cfg).run_name_prefix()}{cfg.method.name}-{cfg.step.name}-seed{cfg.training.seed}"


def free_run_dir(cfg: PonderConfig, root: Path = RUNS_DIR) -> Path:
    """runs/<run_dir_name>, or the first of -2, -3, ... not taken yet."""
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


def carry_best_checkpoint(plan: TrainingPlan) -> Optional[Path]:
    """Resuming into another folder: copy the run's best epoch so far there as best.pt, so that
    the new folder names a best.pt that exists even when no later epoch beats it. The copy comes
    from the resumed checkpoint itself when its epoch is the best, else from best.pt beside it
    when that holds the same run's best epoch; None when neither does (nothing is copied)."""
    if plan.resume is None or _same_path(plan.out_dir, plan.resumed.path.parent):
        return None
    state, source = plan.resume, None
    if state.epoch == state.best_epoch:
        source = plan.resumed.path
    else:
        beside = plan.resumed.path.parent / BEST
        with contextlib.suppress(PonderError, OSError):
            best = load_checkpoint(beside)
            if best.epoch == state.best_epoch and _same_run(best.config, state.config):
                source = beside
    target = plan.out_dir / BEST
    if source is None:
        target.unlink(missing_ok=True)  # another run's, replaced with --overwrite: never reported as this one's
        return None
    _replace_atomically(target, lambda f: None, binary_from=source)
    return target


def _same_run(a: PonderConfig, b: PonderConfig) -> bool:
    """The same configuration but for what a resumed run may change (RESUMABLE_CHANGES)."""
    def kept(cfg):
        return {k: v for k, v in cfg.to_dict().items() if k not in RESUMABLE_CHANGES}
    return kept(a) == kept(b)


# Beside the checkpoints: the run's configuration and one row per epoch, for any tool ------------

def _replace_atomically(path: Path, write, binary_from: Optional[Path] = None) -> None:
    """Write a text file (`write` gets the open file), or copy `binary_from`, under a temporary
    name, then rename it into place: a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if binary_from is not None:
            with os.fdopen(fd, "wb") as f, open(binary_from, "rb") as source:
                shutil.copyfileobj(source, f)
        else:
            with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
                write(f)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_run_config(out_dir: Path, cfg: PonderConfig, sources: dict, **run) -> Path:
    """config.json: the resolved configuration, where each value came from (given, implied by the
    method or step, default, checkpoint) and how the run was started; plain JSON. And config.toml:
    the settings that matter to the run, as `ponder train --config` reads them."""
    payload = {"ponder_cli": __version__, "config": cfg.to_dict(), "sources": sources, **run}
    path = out_dir / CONFIG_FILE
    _replace_atomically(path, lambda f: f.write(json.dumps(payload, indent=2) + "\n"))
    # the same settings as `ponder train --config` reads them: re-running this file trains this run again
    text = render_config(cfg, sources)
    _replace_atomically(out_dir / CONFIG_TOML, lambda f: f.write(text))
    return path


class MetricsFile:
    """metrics.csv: a header and one row per completed epoch (the epoch line's figures), written
    as each epoch ends. A resumed run starts the file again from the checkpoint's history, the
    record of exactly the epochs it holds, and appends after them: no header or row twice, and
    rows of epochs that resuming from an earlier checkpoint discards are dropped."""

    def __init__(self, out_dir: Path, columns: Iterable[str]):
        self.path = Path(out_dir) / METRICS_FILE
        self.columns = list(columns)

    def _writer(self, f) -> csv.DictWriter:
        return csv.DictWriter(f, fieldnames=self.columns, restval="", extrasaction="ignore", lineterminator="\n")

    @staticmethod
    def _cells(row: dict) -> dict:
        """A list (the halting-step histogram) as JSON text in one cell: `[12, 40, 3]`."""
        return {key: json.dumps(list(value)) if isinstance(value, (list, tuple)) else value
                for key, value in row.items()}

    def start(self, history: Iterable[dict] = ()) -> None:
        def write(f):
            writer = self._writer(f)
            writer.writeheader()
            writer.writerows(self._cells(row) for row in history)
        _replace_atomically(self.path, write)

    def append(self, row: dict) -> None:
        with open(self.path, "a", newline="", encoding="utf-8") as f:
            self._writer(f).writerow(self._cells(row))

    def close(self) -> None:
        """Nothing held open: every row is appended and closed at once."""


def remove_if_empty_run_dir(directory: Path, carried: Iterable[str] = ()) -> bool:
    """Remove a run folder that holds nothing of value (no checkpoint; only this run's own
    config.json, config.toml, metrics.csv and environment.json, and the `carried` copies it made), so
    that the next run takes its name; True if removed."""
    try:
        names = {p.name for p in directory.iterdir()}
        if names - {CONFIG_FILE, CONFIG_TOML, METRICS_FILE, ENVIRONMENT_FILE, *carried}:
            return False
        for name in names:
            (directory / name).unlink()
        directory.rmdir()
        return True
    except OSError:
        return False
