"""ponder_cli: train, evaluate and extrapolate PonderNet on MNIST."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from typing import Callable

__version__ = "0.2.0"


class PonderError(Exception):
    """A user-facing problem: the CLI prints `headline: message` as one line and exits with
    exit_code, never a traceback."""
    exit_code = 1
    headline = "Error"
    # Under torchrun: the same message on every process of the run (an interrupt, a problem rank
    # 0 met and told the others about), printed by rank 0 alone (distributed.error_line).
    run_wide = False


class BadValue(PonderError):
    """A value the command does not take (out of range, unknown, not for this checkpoint): a usage
    mistake, so exit 2, as click's parser gives the mistakes it catches, whichever check finds it."""
    exit_code = 2


# interrupts ------------------------------------------------------------------------------------
# The CLI's one signal handler (cli/app.py) raises the first SIGINT or SIGTERM where the program
# is; its boundary ends the command with one Interrupted (130), Terminated (143) or, for a reader
# of stdout gone, StdoutClosed (141) line saying what the command kept (`keeping`). The library's
# one say: a checkpoint is written whole (`uninterrupted`). Without the CLI, an interrupt is as
# Python raises it.

class Interrupted(PonderError):
    """A command stopped by Ctrl-C (training: the last completed epoch is saved)."""
    exit_code = 130
    headline = "Interrupted"
    run_wide = True  # under torchrun every rank stops; rank 0 alone says where the run is saved


class Terminated(Interrupted):
    """A command stopped by SIGTERM (kill, a job scheduler): as Ctrl-C, exit 128 + 15."""
    exit_code = 143
    headline = "Terminated"


class StdoutClosed(Interrupted):
    """A command that had kept something stopped because its stdout's reader left
    (`ponder train -f jsonl | head -1`): exit 128 + SIGPIPE. One that kept nothing ends quietly."""
    exit_code = 141
    headline = "stdout closed"


class SigTerm(KeyboardInterrupt):
    """SIGTERM raised where the program is, so that it unwinds as it does for Ctrl-C."""


class _Held:  # the `uninterrupted` blocks entered and not yet left, and the interrupt they hold
    depth, interrupt = 0, None


@contextlib.contextmanager
def uninterrupted():
    """Inside, an interrupt the CLI's handler receives waits until the block is done (a checkpoint,
    or best.pt and last.pt together, is written whole); a block that fails drops it."""
    _Held.depth += 1
    held = None
    try:
        yield
    finally:
        _Held.depth -= 1
        if _Held.depth == 0:
            held, _Held.interrupt = _Held.interrupt, None
    if held is not None:
        raise held


def hold_interrupt(interrupt: KeyboardInterrupt) -> bool:
    """For the CLI's handler: inside `uninterrupted`, keep `interrupt` for the block's end (True)."""
    if _Held.depth == 0:
        return False
    _Held.interrupt = interrupt
    return True


@contextlib.contextmanager
def keeping(kept: Callable[[], str]):
    """An interrupt inside (or stdout's reader leaving) says `kept()`, asked once it has unwound
    (training's resume hint), rather than that nothing was written."""
    try:
        yield
    except (KeyboardInterrupt, BrokenPipeError) as exc:
        if not hasattr(exc, "kept"):  # the innermost says what it kept
            exc.kept = kept
        raise


class PonderWarning(UserWarning):
    """Something to know about a result that goes ahead all the same (a blank image); one
    `Warning:` line on stderr."""


def brief(exc: BaseException | str, limit: int = 160) -> str:
    """An exception's message for a one-line error: its first sentence on one line, cut at a word
    with "…" when still long (PyTorch's run to paragraphs)."""
    text = " ".join(str(exc).split()) or (type(exc).__name__ if isinstance(exc, BaseException) else "")
    text = re.split(r"(?<=\.) (?=[A-Z])", text, maxsplit=1)[0]
    if len(text) <= limit:
        return text
    head = text[:limit - 1]
    if text[limit - 1] != " " and " " in head:  # do not end inside a word
        head = head.rsplit(" ", 1)[0]
    return head.rstrip(" ,;:(") + "…"


_SPECIAL_FILES = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def name_length_problem(path) -> str | None:
    """Why `path` cannot be made for its length (a name, or the whole path, longer than the file
    system takes), worded to follow its name; None when it can."""
    text = os.path.abspath(os.fsencode(os.fspath(path)))
    here = os.path.dirname(text)
    while not os.path.isdir(here):  # the nearest folder that exists: its file system's limits
        here = os.path.dirname(here)

    def limit(name: str, default: int) -> int:  # default: what Linux and macOS take, where pathconf cannot say
        try:
            return os.pathconf(here, name)
        except (OSError, ValueError, AttributeError):  # not POSIX, or the file system does not say
            return default
    name_max, path_max = limit("PC_NAME_MAX", 255), limit("PC_PATH_MAX", 4096)
    longest = max(text.split(os.fsencode(os.sep)), key=len)
    if len(longest) > name_max:
        return f"has a name of {len(longest)} bytes; this file system takes names of at most {name_max}"
    if len(text) >= path_max:
        return f"is {len(text)} bytes long in full; this file system takes at most {path_max - 1}"
    return None


def file_problem(path) -> str | None:
    """Why `path` cannot be read as a file, worded to follow its name ("does not exist", "is a
    character device, not a regular file": /dev/null; a pipe would block the read); None for a
    regular file. The one check of every file the user names."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "does not exist"
    except (OSError, ValueError) as exc:
        return f"cannot be read ({getattr(exc, 'strerror', None) or exc})"
    if stat.S_ISDIR(mode):
        return "is a directory"
    kind = next((kind for test, kind in _SPECIAL_FILES if test(mode)), None)
    return f"is {kind}, not a regular file" if kind is not None else None
