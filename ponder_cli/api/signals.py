"""Commands stop cleanly on a signal, one mechanism for all (`interruptible`): Ctrl-C, and
SIGTERM like it, end in one `Interrupted:` (exit 130) or `Terminated:` (143) line saying what was
kept: training's last completed epoch and how to resume, an evaluation's nothing. Under torchrun
only the first signal counts."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from typing import Callable

from .. import PonderError


class Interrupted(PonderError):
    """A command stopped by Ctrl-C (training: the last completed epoch is saved)."""
    exit_code = 130
    headline = "Interrupted"
    run_wide = True  # under torchrun every rank stops; rank 0 alone says where the run is saved


class Terminated(Interrupted):
    """A command stopped by SIGTERM (kill, a job scheduler, a container stopping): as Ctrl-C,
    with the shell's exit status for that signal, 128 + 15."""
    exit_code = 143
    headline = "Terminated"


class _SigTerm(KeyboardInterrupt):
    """SIGTERM raised where the training loop is, so that it unwinds as it does for Ctrl-C."""


def _raise_sigterm(signum, frame) -> None:
    raise _SigTerm()


def _ignore(signum, frame) -> None:
    pass


def ignore_signals() -> None:
    # A Python handler that does nothing, not SIG_IGN: a signal that arrived while this runs
    # would otherwise surface later as "OSError: Signal 15 ignored due to race condition".
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _ignore)
        signal.signal(signal.SIGTERM, _ignore)


def _interrupt_once(signum, frame) -> None:
    # Under torchrun a Ctrl-C reaches every rank and torchrun follows it with SIGTERM, and it
    # sends SIGTERM to the remaining ranks as soon as one exits with an error: the first signal
    # interrupts, later ones are ignored (a second interrupt while unwinding would be a
    # traceback). torchrun sends SIGKILL 30 s later to anything still running.
    ignore_signals()
    raise _SigTerm() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def sigterm_as_interrupt(torchrun: bool = False):
    """While training, SIGTERM interrupts like Ctrl-C instead of ending the process on the spot
    with no message (signal handlers can only be set from the main thread).

    Under torchrun (see _interrupt_once) only the first SIGINT or SIGTERM counts, and once
    training has failed this process is on its way out: signals stay ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGTERM, signal.SIGINT) if torchrun else (signal.SIGTERM,)
    previous = {sig: signal.signal(sig, _interrupt_once if torchrun else _raise_sigterm) for sig in signals}
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        if failed and torchrun:
            ignore_signals()
        else:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


@contextlib.contextmanager
def interruptible(kept: Callable[[], str], torchrun: bool = False):
    """Ctrl-C or SIGTERM inside becomes Interrupted or Terminated, whose message is `kept()`
    (what was saved, asked once the signal came: training's resume hint); SIGTERM interrupts
    like Ctrl-C (sigterm_as_interrupt). Cleanup inside (a `finally`) runs before `kept` is asked."""
    with sigterm_as_interrupt(torchrun):
        try:
            yield
        except KeyboardInterrupt as exc:
            raise (Terminated if isinstance(exc, _SigTerm) else Interrupted)(kept()) from None


def stops_cleanly(what: str):
    """A command's api function, interruptible: `Interrupted: evaluation stopped before its
    results; nothing was written` rather than a silent exit 130 or a traceback."""
    def decorate(function):
        @functools.wraps(function)
        def run(*args, **kwargs):
            with interruptible(lambda: f"{what} stopped before its results; nothing was written"):
                return function(*args, **kwargs)
        return run
    return decorate
