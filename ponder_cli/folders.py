"""The names a run folder's files go by, where runs go by default, and what makes a folder a run
folder: plain constants and file names, readable by the CLI before torch loads (runs.py, which
loads checkpoints, does the work)."""

import json
import os
from pathlib import Path

RUNS_DIR = Path("runs")
BEST, LAST = "best.pt", "last.pt"
CHECKPOINT_FILES = (BEST, LAST)  # what `ponder train` writes into its folder
CONFIG_FILE, METRICS_FILE = "config.json", "metrics.csv"  # beside them, readable without torch
CONFIG_TOML = "config.toml"  # the settings as `ponder train --config` reads them
ENVIRONMENT_FILE = "environment.json"  # what the run ran on (environment.py)
LATEST = "latest"  # the CHECKPOINT word for the newest run under runs/
LOCK_FILE = ".ponder.lock"
TENSORBOARD_EVENTS = "events.out.tfevents.*"  # what `train --tensorboard` writes (tensorboard_log.py)
# every file a run writes into its folder: a folder holding any of them is not a fresh one
RUN_FILES = (*CHECKPOINT_FILES, CONFIG_FILE, CONFIG_TOML, METRICS_FILE, ENVIRONMENT_FILE)


def run_files_in(directory: Path) -> list[str]:
    """The files of `directory` that a run would write (RUN_FILES, TensorBoard events)."""
    found = [name for name in RUN_FILES if os.path.lexists(directory / name)]
    return found + sorted(p.name for p in directory.glob(TENSORBOARD_EVENTS)) if directory.is_dir() else found


def is_run_folder(folder: Path) -> bool:
    """A folder `ponder train` wrote: it holds a checkpoint, the run lock, or a config.json of
    ponder's (a folder of the user's own with a config.json is not one)."""
    try:
        found = run_files_in(folder)
        if any(name in CHECKPOINT_FILES for name in found) or os.path.lexists(folder / LOCK_FILE):
            return True
        saved = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8")) if CONFIG_FILE in found else None
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and "ponder_cli" in saved
