"""Which file a CHECKPOINT argument names: a checkpoint file, a run folder (its best.pt or
last.pt), `latest` (the newest run under runs/) or a shipped model's name."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from . import PonderError, file_problem
from .folders import BEST, LAST, LATEST, RUNS_DIR, is_run_folder
from .shipped import DEFAULT, SHIPPED, shipped_name, shipped_path, shipped_under_old_name


@dataclass(frozen=True)
class Resolved:
    path: Path  # the file to read, as the user spelled it (or found under runs/)
    why: str  # how the argument led there, for the `using PATH (WHY)` line

    @classmethod
    def shipped(cls, path: Path, why: str) -> "Resolved":
        """A shipped model, named relative to the working directory when it lies below it (a
        clone's root: ponder_cli/checkpoints/best.pt), by its full path otherwise."""
        with contextlib.suppress(ValueError):
            path = path.relative_to(Path.cwd())
        return cls(path, why)


def accepted_forms(file: str = BEST) -> str:
    return (f"a checkpoint file, a run folder (its {file}), `{LATEST}` (the newest run under {RUNS_DIR}/) or a "
            f"shipped model: {', '.join(SHIPPED)}")


def resolve_checkpoint(given: Union[str, Path, None], file: str = BEST) -> Resolved:
    """The file a CHECKPOINT argument names, tried in this order: an existing file; an existing
    run folder (its `file`: best.pt to evaluate, last.pt to resume); `latest`, the newest run
    under runs/; a shipped model's name; `checkpoints/...`, the shipped file of that name (the
    README's older spelling). None: the shipped reference model. Anything else is one error
    naming the accepted forms."""
    if given is None:
        newest = newest_run_checkpoint(name=file)
        hint = f"; `{LATEST}` reads your newest run" if newest is not None else ""
        return Resolved.shipped(shipped_path(DEFAULT), f"the shipped model '{DEFAULT}', the default{hint}")
    text, path = str(given), Path(given)
    if path.is_file():
        return Resolved(path, "as given")
    if path.is_dir() and (path / file).is_file():
        return Resolved(path / file, f"the {file} of run folder {path}")
    if text == LATEST:
        newest = newest_run_checkpoint(name=file)
        if newest is None:
            raise PonderError(f"`{LATEST}`: no run under {RUNS_DIR.resolve()}/ has a {file} yet; train one with "
                              "`ponder train`, or name another checkpoint")
        return Resolved(newest, f"{LATEST}: the newest run under {RUNS_DIR}/")
    if text in SHIPPED:
        return Resolved.shipped(shipped_path(text), f"the shipped model '{text}'")
    old = shipped_under_old_name(text, file)
    if old is not None:
        name = shipped_name(old)
        return Resolved.shipped(old, f"the shipped model '{name}'" if name else f"shipped as {text}")
    if path.is_dir():
        if is_run_folder(path):
            other = next((path / name for name in (BEST, LAST) if (path / name).is_file()), None)
            why = f" (it has {other}: name that file)" if other is not None else \
                f": its first epoch has not ended, or the run stopped before it did (`ponder runs {path}` says which)"
            raise PonderError(f"{path} is a run folder with no {file}{why}; name {accepted_forms(file)}")
        runs = [p.name for p in sorted(path.iterdir()) if p.is_dir() and any((p / n).is_file() for n in (BEST, LAST))]
        if runs:
            raise PonderError(f"{path} is a folder of runs ({', '.join(runs[:3])}{', ...' if len(runs) > 3 else ''}), "
                              f"not one run: `ponder runs {path}` lists them; name one, or {accepted_forms(file)}")
        raise PonderError(f"{path} holds no {file}; name {accepted_forms(file)}")
    raise PonderError(f"checkpoint {path} {file_problem(path) or 'cannot be read'}; name {accepted_forms(file)}")


def newest_run_checkpoint(root: Path = RUNS_DIR, name: str = BEST) -> Optional[Path]:
    """The most recently written runs/<run>/<name>, if any."""
    found = []
    for path in root.glob(f"*/{name}"):
        with contextlib.suppress(OSError):  # a run folder removed while we look
            found.append((path.stat().st_mtime, str(path), path))
    return max(found)[2] if found else None
