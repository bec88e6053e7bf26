"""The `ponder` app and its one error boundary (`PonderGroup`): signals, the standard streams,
and what the commands share (chatter on stderr, progress bars, rendering). No torch here.

Results go to stdout: a closed one (`>&-`) is refused before any work, and a reader that leaves
(`| head`) ends the command with READER_GONE, quietly, or with one line where the command had
kept something (training's saved epoch). Chatter goes to stderr: losing it never stops the work.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperGroup

from .. import (Interrupted, PonderError, PonderWarning, SigTerm, StdoutClosed, Terminated, __version__,
                hold_interrupt)
from ..cli_options import InstallCompletionOption, ShowCompletionOption, bare_completion_options, use_ponder_completion
from ..render import ASCII_ERRORS, OutputFormat

# 128 + SIGPIPE: the status a shell gives any tool whose reader left (`git log | head`)
READER_GONE = StdoutClosed.exit_code


class PonderGroup(TyperGroup):
    """The one error boundary: a PonderError, an OSError, an interrupt (Ctrl-C, SIGTERM) or a
    reader gone becomes one line on stderr and a non-zero exit, never a traceback."""

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, bare_completion_options(args))

    def _main_shell_completion(self, *args, **kwargs):
        use_ponder_completion()  # a shell's question, asked by the scripts ours are
        return super()._main_shell_completion(*args, **kwargs)

    def main(self, *args, **kwargs):
        for stream in (sys.stdout, sys.stderr):  # an encoding short of UTF-8 spells what it lacks in ASCII
            with contextlib.suppress(AttributeError, LookupError, ValueError, OSError):
                if not codecs.lookup(getattr(stream, "encoding", None) or "utf-8").name.startswith("utf"):
                    stream.reconfigure(errors=ASCII_ERRORS)
        with guarded_stderr(), signals_interrupt():
            return super().main(*args, **kwargs)

    def invoke(self, ctx):
        try:
            require_stdout()
            result = super().invoke(ctx)
            if sys.stdout is not None:
                sys.stdout.flush()  # buffered results meet a closed pipe here, inside the boundary
            return result
        except BrokenPipeError as exc:  # stdout's reader left
            reader_gone()
            if not hasattr(exc, "kept"):  # nothing kept to speak of (`ponder runs | head`): quietly
                raise typer.Exit(READER_GONE) from None
            _stopped(ctx, exc)
        except typer.BadParameter as exc:
            exc.message = parameter_message(exc)
            raise
        except PonderError as exc:
            _fail(f"{exc.headline}: {exc}", exc.exit_code, exc)
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (signals_interrupt)
            _stopped(ctx, exc)
        except OSError as exc:
            _fail(f"Error: {exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}", 1, exc)


# pydantic's error kinds (Typer converts numbers through it) in the words every other option uses
_NOT_A = {"int_parsing": "a whole number", "int_from_float": "a whole number", "int_type": "a whole number",
          "float_parsing": "a number", "float_type": "a number", "finite_number": "a finite number"}


def parameter_message(exc: "typer.BadParameter") -> str:
    """`'abc' is not a whole number` for pydantic's `Input should be a valid integer, ...`."""
    errors = getattr(exc.__cause__, "errors", None)
    first = next(iter(errors()), None) if callable(errors) else None
    if first is not None and first.get("type") in _NOT_A:
        return f"{first.get('input')!r} is not {_NOT_A[first['type']]}"
    return exc.message.removeprefix("Value error, ")


def _stopped(ctx, exc: BaseException) -> None:
    """An interrupt or a reader gone as one line (not click's "Aborted!"), saying what `keeping` kept."""
    kept = getattr(exc, "kept", None)
    kind = Terminated if isinstance(exc, SigTerm) else StdoutClosed if isinstance(exc, BrokenPipeError) else Interrupted
    command = " ".join(filter(None, ("ponder", ctx.invoked_subcommand)))
    stopped = kind(kept() if kept else f"{command} stopped before its results; nothing was written")
    _fail(f"{stopped.headline}: {stopped}", stopped.exit_code, stopped)


def _fail(line: str, code: int, exc: Exception) -> None:
    """Print the error line and exit; a signal from here on is ignored. Under torchrun the
    processes distributed.error_line picks print it, and one in a process group leaves at once."""
    _Signals.ending = True
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except (OSError, ValueError):  # else the interpreter's last flush fails at exit, with a message
        reader_gone()
    if "WORLD_SIZE" in os.environ:  # under torchrun (only then is torch imported here)
        from ..distributed import error_line, leave_now
        line = error_line(line, exc)
        if line is not None:
            typer.echo(line, err=True)
        leave_now(code)  # in a process group only
    else:
        typer.echo(line, err=True)
    raise typer.Exit(code) from None


app = typer.Typer(cls=PonderGroup, no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
                  rich_markup_mode=None,  # plain click errors: one "Error: ..." line, no boxes
                  context_settings={"help_option_names": ["-h", "--help"]})


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ponder_cli {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit."),
         install_completion: Optional[str] = InstallCompletionOption,
         show_completion: Optional[str] = ShowCompletionOption) -> None:
    """Train PonderNet on MNIST or parity and measure whether it ponders longer on harder inputs."""


def chatter(quiet: bool):
    """Where progress lines go: stderr, or nowhere with --quiet (errors and results still show)."""
    return (lambda line: None) if quiet else (lambda line: typer.echo(line, err=True))


def bars(quiet: bool, wanted: Optional[bool] = None) -> bool:
    """Progress bars only on a terminal: in a log file or a pipeline they are lines of noise."""
    return not quiet and (sys.stderr.isatty() if wanted is None else wanted)


def render_and_plot(report, fmt: OutputFormat, plot: Optional[Path], quiet: bool) -> None:
    from ..plot import plot_report
    from ..render import render_report

    render_report(report, fmt)
    if plot is not None:
        chatter(quiet)(f"plot written to {plot_report(report, plot)}")


# signals: the one handler ------------------------------------------------------------------------

class _Signals:
    ending = False  # a signal has interrupted the command, or it is ending anyway: ignore the rest


def _interrupt(signum, frame) -> None:
    """The first SIGINT or SIGTERM is raised where the program is (SIGTERM as SigTerm), or, while
    a checkpoint is written, once it is (ponder_cli.uninterrupted); the rest are ignored: a
    second Ctrl-C would be a traceback, and torchrun follows a Ctrl-C with its own SIGTERM."""
    if _Signals.ending:
        return
    _Signals.ending = True
    interrupt = SigTerm() if signum == signal.SIGTERM else KeyboardInterrupt()
    if not hold_interrupt(interrupt):
        raise interrupt


@contextlib.contextmanager
def signals_interrupt():
    """While a command runs, SIGINT and SIGTERM interrupt it (_interrupt), rather than end it with
    no word (SIGTERM's default). One the process started with ignored stays ignored, as Python
    keeps it: a script's background job (`ponder train … &`) ignores the Ctrl-C meant for the
    foreground. The handlers found are put back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _Signals.ending = False
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig, handler in previous.items():
        if handler != signal.SIG_IGN:
            signal.signal(sig, _interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler not in (None, signal.SIG_IGN):  # None: set from C, which Python cannot put back
                signal.signal(sig, handler)


# the standard streams ---------------------------------------------------------------------------

def _fileno(stream) -> Optional[int]:
    try:
        return stream.fileno()
    except (AttributeError, ValueError, OSError):  # None, closed, or a test's in-memory capture
        return None


def require_stdout() -> None:
    """Refuse to start when the results would have nowhere to go (closed, or open read-only)."""
    fd, writable = _fileno(sys.stdout), sys.stdout is not None
    if writable and fd is not None and os.name == "posix":  # elsewhere: trust the descriptor
        import fcntl
        try:
            writable = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY
        except OSError:  # EBADF: closed
            writable = False
    if not writable:
        raise PonderError("standard output is closed, so the results would be lost; send it to a file or to "
                          "/dev/null instead of closing it")


def _to_devnull(fd: Optional[int]) -> None:
    """Point a lost descriptor at /dev/null: later writes (C code's, the interpreter's last flush)
    succeed quietly, and its number is never reused for a file we open."""
    if fd is not None:
        with contextlib.suppress(OSError):
            null = os.open(os.devnull, os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def reader_gone() -> None:  # stdout's reader left: what is still buffered for it goes nowhere, silently
    _to_devnull(_fileno(sys.stdout))


class Chatter(io.TextIOBase):
    """sys.stderr for the CLI: writes pass through until one fails (closed, its reader gone, the
    terminal hung up); then it points at /dev/null and the program goes on, quietly."""

    def __init__(self, stream):
        super().__init__()
        self.stream, self.lost = stream, stream is None

    def _attempt(self, action) -> None:
        if not self.lost:
            try:
                action()
            except (OSError, ValueError):  # ValueError: the stream object was closed
                self.lost = True
                _to_devnull(_fileno(self.stream))

    def write(self, text: str) -> int:
        if not isinstance(text, str):  # as a text stream would: callers probe with b""
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")

        def write():
            self.stream.write(text)
            if "\n" in text or "\r" in text:
                self.stream.flush()  # fail here, where it is caught, not at exit
        self._attempt(write)
        return len(text)

    def flush(self) -> None:
        self._attempt(lambda: self.stream.flush())

    def isatty(self) -> bool:
        return not self.lost and self.stream.isatty()

    def fileno(self) -> int:
        if self.lost:
            raise io.UnsupportedOperation("stderr is gone")
        return self.stream.fileno()

    def writable(self) -> bool:
        return True

    encoding = property(lambda self: getattr(self.stream, "encoding", None) or "utf-8")
    errors = property(lambda self: getattr(self.stream, "errors", None) or "strict")


@contextlib.contextmanager
def guarded_stderr():
    """While the CLI runs, stderr is a Chatter (a closed fd 2 points at /dev/null at once), and
    warnings are one line on it (one_line_warnings)."""
    previous = sys.stderr
    if previous is None:
        try:
            os.fstat(2)
        except OSError:  # closed
            _to_devnull(2)
    sys.stderr = previous if isinstance(previous, Chatter) else Chatter(previous)
    try:
        with one_line_warnings():
            yield
    finally:
        sys.stderr = previous


@contextlib.contextmanager
def one_line_warnings():
    """Every warning as one line on stderr: a PonderWarning as `Warning: ...` each time it is
    raised; another library's as `Warning: ... [its category]`, once per place, as Python shows it."""
    with warnings.catch_warnings():  # puts the filters and showwarning back afterwards
        warnings.simplefilter("always", PonderWarning)

        def show(message, category, filename, lineno, file=None, line=None):
            text = " ".join(str(message).split())
            own = issubclass(category, PonderWarning)
            (file or sys.stderr).write(f"Warning: {text}\n" if own else f"Warning: {text} [{category.__name__}]\n")

        warnings.showwarning = show
        yield
