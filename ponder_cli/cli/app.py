"""The `ponder` app and its one error boundary (`PonderGroup`), the standard streams at the CLI's
edge, and what the commands share: chatter on stderr, progress bars, rendering a report,
evaluation options (no torch until a command runs).

Results go to stdout: a closed one (`>&-`) is refused before any work, and a reader that leaves
(`| head`) ends the command with READER_GONE: quietly, or with one line where the command had
kept something (training's saved epoch: ponder_cli.StdoutClosed). Chatter goes to stderr:
losing it (a closed stream, a reader that left) never stops or corrupts the work, training
above all; what follows is dropped quietly.
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
from typing import Optional, TextIO

import typer
from typer.core import TyperGroup

from .. import PonderError, PonderWarning, SigTerm, StdoutClosed, __version__, hold_interrupt, interruption
from ..cli_options import (InstallCompletionOption, Protocol, ShowCompletionOption, bare_completion_options,
                           use_ponder_completion)
from ..render import ASCII_ERRORS, OutputFormat


class PonderGroup(TyperGroup):
    """The one error boundary: a PonderError (the user's to fix) or an OSError on a user's path
    becomes one line on stderr and a non-zero exit, never a traceback; so does an interrupt
    (Ctrl-C, SIGTERM: signals_interrupt), in every command alike. The standard streams are
    handled here too (below): stderr may be lost without harm; results need a stdout, and
    a reader that leaves it ends the command with READER_GONE, as an interrupt where the
    command had kept something."""

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, bare_completion_options(args))

    def _main_shell_completion(self, *args, **kwargs):
        use_ponder_completion()  # Typer's completion for each shell, which its scripts call (bash's, zsh's ours)
        return super()._main_shell_completion(*args, **kwargs)

    def main(self, *args, **kwargs):
        spell_what_encodings_lack()
        with guarded_stderr(), signals_interrupt():
            return super().main(*args, **kwargs)

    def invoke(self, ctx):
        try:
            require_stdout()
            result = super().invoke(ctx)
            if sys.stdout is not None:
                sys.stdout.flush()  # buffered results meet a closed pipe here, inside the boundary
            return result
        except BrokenPipeError as exc:  # stdout's reader left (stderr's are dropped by Chatter)
            reader_gone()
            if not hasattr(exc, "kept"):  # nothing kept to speak of (`ponder runs | head`): quietly
                raise typer.Exit(READER_GONE) from None
            _stopped(ctx, exc)
        except typer.BadParameter as exc:
            exc.message = parameter_message(exc)
            raise
        except PonderError as exc:
            _fail(f"{exc.headline}: {exc}", exc.exit_code, exc)
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (signals_interrupt), in any command
            _stopped(ctx, exc)
        except OSError as exc:
            _fail(f"Error: {exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}", 1, exc)


# What a value typed for a number is, in the words every other option uses: pydantic's error
# kinds (Typer converts through it) by what the value was meant to be.
_NOT_A = {"int_parsing": "a whole number", "int_from_float": "a whole number", "int_type": "a whole number",
          "float_parsing": "a number", "float_type": "a number", "finite_number": "a finite number"}


def parameter_message(exc: "typer.BadParameter") -> str:
    """An option's refused value as `'abc' is not a whole number`, the value echoed, where Typer
    says `Input should be a valid integer, unable to parse string as an integer`; a refused
    choice without pydantic's "Value error, "."""
    errors = getattr(exc.__cause__, "errors", None)
    first = next(iter(errors()), None) if callable(errors) else None
    if first is not None and first.get("type") in _NOT_A:
        return f"{first.get('input')!r} is not {_NOT_A[first['type']]}"
    return exc.message.removeprefix("Value error, ")


def _stopped(ctx, exc: BaseException) -> None:
    """An interrupt or a reader gone as one line, the shell's status for the signal, not click's
    "Aborted!": what was kept, where the command kept any."""
    command = " ".join(filter(None, ("ponder", ctx.invoked_subcommand)))
    stopped = interruption(exc, f"{command} stopped before its results; nothing was written")
    _fail(f"{stopped.headline}: {stopped}", stopped.exit_code, stopped)


def _fail(line: str, code: int, exc: Exception) -> None:
    """Print the error line and exit with `code`; a signal from here on is ignored (the command
    is ending), and results left unwritten for a reader that left are dropped. Under torchrun,
    the processes that print it are those distributed.error_line picks, and one still in a
    process group leaves at once."""
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
        leave_now(code)
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
         install_completion: Optional[str] = InstallCompletionOption,  # Typer's, each taking the shell
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


def evaluation_options(plot: Optional[Path], protocol: Protocol, halting: Optional[str], **options):
    """The checked --plot destination (before any work) and the EvalOptions."""
    from ..api import EvalOptions
    from ..plot import check_destination

    plot = check_destination(plot) if plot is not None else None
    return plot, EvalOptions(protocol=protocol.value if protocol is not None else None, halting=halting, **options)


def spelled_buckets(**given) -> dict[str, Optional[list[str]]]:
    """The bucket options as the user spelled them, {"--angles": [...], "--counts": None, ...}
    (None: not given), for the checkpoint's task to read (Task.parse_buckets)."""
    return {"--" + name: values for name, values in given.items()}


def run_evaluation(command: str, checkpoint: Optional[str], angles: Optional[list[str]], quiet: bool, fmt: OutputFormat,
                   counts: Optional[list[str]] = None, buckets: Optional[list[str]] = None,
                   rotation: Optional[float] = None, **options) -> None:
    from ..api import evaluate_checkpoint

    if rotation is not None and angles is not None:
        raise PonderError(f"--rotation and --angles are alternatives: give one (--rotation {rotation:g} is "
                          f"--angles {rotation:g})")
    spelled = spelled_buckets(angles=angles, counts=counts, buckets=buckets,
                              rotation=None if rotation is None else [str(rotation)])
    plot, eval_options = evaluation_options(**options)
    report = evaluate_checkpoint(command, checkpoint, spelled, eval_options, log=chatter(quiet), progress=bars(quiet))
    render_and_plot(report, fmt, plot, quiet)


# signals: the one handler ------------------------------------------------------------------------

class _Signals:
    ending = False  # a signal has interrupted the command, or it is ending anyway: ignore the rest


def _interrupt(signum, frame) -> None:
    """The process's one SIGINT and SIGTERM handler while a command runs: the first is raised
    where the program is (SIGTERM as SigTerm), or, while a checkpoint is being written, once it
    is (ponder_cli.uninterrupted). Those that follow are ignored: a second Ctrl-C while the
    first unwinds would be a traceback, and under torchrun a Ctrl-C reaches every rank, followed
    by torchrun's SIGTERM, which it also sends to the other ranks when one exits."""
    if _Signals.ending:
        return
    _Signals.ending = True
    interrupt = SigTerm() if signum == signal.SIGTERM else KeyboardInterrupt()
    if not hold_interrupt(interrupt):
        raise interrupt


@contextlib.contextmanager
def signals_interrupt():
    """While a command runs, SIGINT (Ctrl-C) and SIGTERM interrupt it (_interrupt), rather than
    end it on the spot with no word and no cleanup (SIGTERM's default). A signal the process
    started with ignored stays ignored, as Python keeps it: a non-interactive shell starts a
    background job (`ponder train … &`) with SIGINT ignored, so that a Ctrl-C meant for the
    foreground leaves it alone; SIGTERM stops it. The handlers found are put back afterwards
    (signal handlers belong to the main thread)."""
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

# 128 + SIGPIPE: the status a shell gives any tool whose reader left (`git log | head`), so a
# script with `set -o pipefail` sees ponder as it sees every other program.
READER_GONE = StdoutClosed.exit_code


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
    """Every warning as one line on stderr: a PonderWarning as `Warning: ...`, each time it is
    raised (two blank images are two lines); another library's as `Warning: ... [its category]`,
    its text on one line and without Python's source line (once per place, as Python shows it)."""
    with warnings.catch_warnings():  # puts the filters and showwarning back afterwards
        warnings.simplefilter("always", PonderWarning)

        def show(message, category, filename, lineno, file=None, line=None):
            text = " ".join(str(message).split())
            own = issubclass(category, PonderWarning)
            (file or sys.stderr).write(f"Warning: {text}\n" if own else f"Warning: {text} [{category.__name__}]\n")

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
