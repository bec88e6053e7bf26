"""Real processes for the tests, forked from the test's own.

A test of signals, pipes, exit statuses or the files a killed run leaves needs a process of its
own. A fresh interpreter imports torch again, about 1.9 s here: most of such a test's time. A
child forked from the test process, which imported torch and ponder_cli once, is as real a
process (its own pid, signals, file descriptors and exit status) and starts in milliseconds.

What a fresh interpreter sets up as it starts is set up here: the standard streams on file
descriptors 0-2 and no other (stdout block-buffered, line-buffered on a terminal; stderr
line-buffered, as Python's own), SIGINT raising KeyboardInterrupt and SIGTERM ending the
process, no signal blocked (whatever the suite was started with: a shell's `&` leaves SIGINT
ignored), a tqdm lock of its own (not the semaphore the fork would share), the environment and
working directory asked for; and its ending: the exit status an uncaught exception or
`SystemExit` gives, stdout flushed, non-daemon threads joined. A stream's encoding, stderr closed
or SIGINT ignored at the start, a test sets up in its child as the interpreter would; what only a
fresh interpreter shows (which modules it imports) is tested with `subprocess`.

The test process must have run torch with one thread (conftest sees to it): a child forked
after OpenMP ran a pool of threads hangs in it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Callable, Optional

import torch

CAPTURE = -1  # a stream written to a file of its own, read back by communicate()


class Process:
    """A forked child, as much like `subprocess.Popen` as the tests need: `pid`, `poll()`,
    `wait()`, `communicate()` (text), `send_signal()`, `kill()`, `returncode` (-N: killed by
    signal N). As a context manager it kills a child still running at its end."""

    def __init__(self, pid: int, captured: dict):
        self.pid, self.returncode, self._captured, self._texts = pid, None, captured, None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked pid {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode

    def communicate(self, timeout: float = 60) -> tuple:
        """(stdout, stderr) as text, each None where not captured, once the child has ended."""
        self.wait(timeout)
        if self._texts is None:
            self._texts = {}
            for name, file in self._captured.items():
                with file:
                    file.seek(0)
                    self._texts[name] = file.read().decode("utf-8", "backslashreplace")
        return self._texts.get("stdout"), self._texts.get("stderr")

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> "Process":
        return self

    def __exit__(self, *exc) -> None:
        if self.poll() is None:
            self.kill()
        self.communicate()  # and its captured files closed


def fork(target: Callable, *args, stdin: Optional[int] = None, stdout: Optional[int] = CAPTURE,
         stderr: Optional[int] = CAPTURE, env: Optional[dict] = None, cwd=None,
         new_session: bool = False) -> Process:
    """`target(*args)` in a child process, its exit status as Python's would be. Each stream is
    CAPTURE (the default for stdout and stderr), a file descriptor, or None (this process's)."""
    if torch.get_num_threads() != 1:  # conftest sees to it
        raise RuntimeError("a process forked after torch ran several OpenMP threads hangs in their pool: "
                           "torch.set_num_threads(1) first")
    captured = {}
    fds = {}
    for fd, name, source in ((0, "stdin", stdin), (1, "stdout", stdout), (2, "stderr", stderr)):
        if source == CAPTURE:
            captured[name] = tempfile.TemporaryFile()
            source = captured[name].fileno()
        if source is not None:
            fds[fd] = source
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child never returns into the test
        status = 1
        try:
            status = _child(target, args, fds, env, cwd, new_session)
        finally:
            os._exit(status)
    return Process(pid, captured)


def ponder(*args, **kwargs) -> Process:
    """`ponder ARGS` in a forked child: the command line as the console script runs it."""
    return fork(run_cli, [str(arg) for arg in args], **kwargs)


def run_cli(args: list) -> None:
    from ponder_cli.cli import app
    app(args, prog_name="ponder")


def _fresh_tqdm_lock() -> None:
    """tqdm's write lock holds a multiprocessing semaphore, which a fork shares with the parent
    and every other child. A child killed while holding it (a bar is made at each epoch, bars left
    off included, and a test kills at random moments) would leave every later child, and the test
    process, waiting on it for ever. A fresh interpreter makes a lock of its own; so does a child."""
    from tqdm.std import TqdmDefaultWriteLock, tqdm

    for owner, name in ((tqdm, "_lock"), (TqdmDefaultWriteLock, "mp_lock")):
        if name in vars(owner):
            delattr(owner, name)


def _child(target, args, fds: dict, env, cwd, new_session: bool) -> int:
    if new_session:
        os.setsid()
    for fd, source in fds.items():
        os.dup2(source, fd)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # as Popen's close_fds: no pipe end of the test's held open
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _fresh_tqdm_lock()
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    sys.stdin = sys.__stdin__ = open(0, closefd=False, encoding="utf-8")
    sys.stdout = sys.__stdout__ = open(1, "w", closefd=False, encoding="utf-8")
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False, encoding="utf-8",
                                       errors="backslashreplace")
    try:
        target(*args)
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:  # as Python ends on one: the traceback, then killed by SIGINT
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        status = 130
    except BaseException:
        traceback.print_exc()
        status = 1
    threading._shutdown()  # as the interpreter does at exit: join the threads that are not daemons
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        status = 120  # Python's status when stdout cannot be flushed at exit
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return status
