"""The lock that keeps two runs out of one folder: a file naming the process that holds it,
taken atomically, released on the way out, taken over from a process that is gone."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Optional

from . import PonderError
from .folders import LOCK_FILE


def lock_holder(path: Path) -> Optional[int]:
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
    pid = lock_holder(directory / LOCK_FILE)
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
                        pid = lock_holder(self.path)
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
