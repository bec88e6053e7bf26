"""ponder_cli: train, evaluate and extrapolate PonderNet on MNIST."""

from __future__ import annotations

import os
import re
import stat

__version__ = "0.2.0"


class PonderError(Exception):
    """A user-facing problem: the CLI prints `headline: message` as one line and exits with
    exit_code, never a traceback."""
    exit_code = 1
    headline = "Error"
    # Under torchrun: the same message on every process of the run (an interrupt, a problem rank
    # 0 met and told the others about), printed by rank 0 alone (distributed.error_line).
    run_wide = False


class PonderWarning(UserWarning):
    """Something the user should know about a result that goes ahead all the same (a blank image,
    a model whose weights are not finite); the CLI prints it as one `Warning:` line on stderr."""


def brief(exc: BaseException | str, limit: int = 160) -> str:
    """An exception's message for a one-line error: its first sentence, on one line, cut at a
    word boundary with "…" when still long (PyTorch's messages run to paragraphs of advice and
    C++ context)."""
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


def special_file_kind(path) -> str | None:
    """What a path is when it exists but is neither a regular file nor a folder ("a named pipe
    (FIFO)", "a character device": /dev/null), for messages; None for anything else."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return next((kind for test, kind in _SPECIAL_FILES if test(mode)), None)


def file_problem(path) -> str | None:
    """Why `path` cannot be read as a file, worded to follow its name: "does not exist", "is a
    directory", "is a character device, not a regular file" (/dev/null; a pipe would block the
    read until something writes to it); None for a regular file. The one check of every file the
    user names (checkpoints, --config files, predict's inputs)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "does not exist"
    except (OSError, ValueError) as exc:
        return f"cannot be read ({getattr(exc, 'strerror', None) or exc})"
    if stat.S_ISDIR(mode):
        return "is a directory"
    kind = special_file_kind(path)
    return f"is {kind}, not a regular file" if kind is not None else None
