"""The standard streams at the CLI's edge (no torch).

Results go to stdout: a closed one (`>&-`) is refused before any work, and a reader that leaves
(`| head`) ends the command quietly with READER_GONE. Chatter goes to stderr: losing it (a
closed stream, a reader that left) never stops or corrupts the work, training above all; what
follows is dropped quietly.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import sys
import warnings
from typing import Optional, TextIO

from . import PonderError, PonderWarning
from .render import ASCII_ERRORS

# 128 + SIGPIPE: the status a shell gives any tool whose reader left (`git log | head`), so a
# script with `set -o pipefail` sees ponder as it sees every other program.
READER_GONE = 141


def _fileno(stream) -> Optional[int]:
    try:
        return stream.fileno()
    except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation: a test's in-memory capture
        return None


def _writable(fd: int) -> bool:
    try:
        import fcntl
    except ImportError:  # not POSIX: trust the descriptor
        return True
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        return False  # EBADF: closed
    return flags & os.O_ACCMODE != os.O_RDONLY


def require_stdout() -> None:
    """Refuse to start when the results would have nowhere to go."""
    fd = None if sys.stdout is None else _fileno(sys.stdout)
    if sys.stdout is None or (fd is not None and not _writable(fd)):
        raise PonderError("standard output is closed, so the results would be lost; send it to a file or to "
                          "/dev/null instead of closing it")


def _to_devnull(fd: Optional[int]) -> None:
    """Point a lost descriptor at /dev/null: later writes, the interpreter's last flush and C
    code's own writes then succeed quietly, and the number is never reused for a file we open."""
    if fd is None:
        return
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)


def reader_gone() -> None:
    """stdout's reader left: what is still buffered for it goes nowhere, silently."""
    _to_devnull(_fileno(sys.stdout) if sys.stdout is not None else None)


class Chatter(io.TextIOBase):
    """sys.stderr for the CLI: writes pass through until one fails (the stream closed, its
    reader gone, the terminal hung up); then stderr is pointed at /dev/null and the program goes
    on, quietly."""

    def __init__(self, stream: Optional[TextIO]):
        super().__init__()
        self.stream = stream
        self.lost = stream is None

    def _lose(self) -> None:
        self.lost = True
        _to_devnull(_fileno(self.stream))

    def write(self, text: str) -> int:
        if not isinstance(text, str):  # as a text stream would: callers probe with b""
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if not self.lost:
            try:
                self.stream.write(text)
                if "\n" in text or "\r" in text:
                    self.stream.flush()  # fail here, where it is caught, not at exit
            except (OSError, ValueError):  # ValueError: the stream object was closed
                self._lose()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self._lose()

    def isatty(self) -> bool:
        return not self.lost and self.stream.isatty()

    def fileno(self) -> int:
        if self.lost:
            raise io.UnsupportedOperation("stderr is gone")
        return self.stream.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str:
        return getattr(self.stream, "errors", None) or "strict"


@contextlib.contextmanager
def guarded_stderr():
    """While the CLI runs, stderr is a Chatter (a closed fd 2 goes to /dev/null at once), and a
    PonderWarning is one line on it (one_line_warnings)."""
    previous = sys.stderr
    if previous is None and _fileno_in_use(2) is False:
        _to_devnull(2)
    sys.stderr = previous if isinstance(previous, Chatter) else Chatter(previous)
    try:
        with one_line_warnings():
            yield
    finally:
        sys.stderr = previous


@contextlib.contextmanager
def one_line_warnings():
    """A PonderWarning as one `Warning: ...` line on stderr, each time it is raised (two blank
    images are two lines); other warnings as Python shows them."""
    with warnings.catch_warnings():  # puts the filters and showwarning back afterwards
        warnings.simplefilter("always", PonderWarning)
        python_shows = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, PonderWarning):
                (file or sys.stderr).write(f"Warning: {message}\n")
            else:
                python_shows(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


def _fileno_in_use(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def spell_what_encodings_lack() -> None:
    """stdout and stderr in an encoding short of UTF-8 (PYTHONIOENCODING=ascii, a latin-1 locale)
    write the characters it lacks in ASCII (render.ASCII_SPELLINGS) rather than fail; results are
    spelled before they are laid out (render.spelling_for), this catches the rest: help, messages."""
    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None) or "utf-8"
        with contextlib.suppress(AttributeError, LookupError, ValueError, OSError):
            if not codecs.lookup(encoding).name.startswith("utf"):
                stream.reconfigure(errors=ASCII_ERRORS)
