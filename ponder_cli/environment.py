"""environment.json in a run folder: what a run ran on, beside config.json (which says what it
trained) and kept apart from it, so that config.json stays what resuming and `ponder info` read.

Training figures depend on the thread count and the CPU as well as on the seed (floating-point
sums are ordered differently), so a run records them: the command line, the package and its
git commit when run from a clone, the Python, torch and platform versions, the device, the
thread count and the processes. A resumed run in the same folder adds a session to the list.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from . import __version__
from .folders import ENVIRONMENT_FILE
from .runs import _replace_atomically
from .shipped import package_dir


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
