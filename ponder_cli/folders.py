"""The names a run folder's files go by, and where runs go by default: plain constants, readable
by the CLI before torch loads (runs.py, which loads checkpoints, does the work)."""

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
