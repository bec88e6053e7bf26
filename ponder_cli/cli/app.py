"""The `ponder` app and its one error boundary (`PonderGroup`), and what the commands share:
chatter on stderr, progress bars, rendering a report, evaluation options."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperGroup

from .. import PonderError, __version__
from ..cli_options import Protocol
from ..render import OutputFormat
from ..streams import READER_GONE, guarded_stderr, reader_gone, require_stdout, spell_what_encodings_lack


class PonderGroup(TyperGroup):
    """The one error boundary: a PonderError (the user's to fix) or an OSError on a user's path
    becomes one line on stderr and a non-zero exit, never a traceback. The standard streams are
    handled here too (streams.py): stderr may be lost without harm; results need a stdout, and
    a reader that leaves it ends the command quietly with streams.READER_GONE."""

    def main(self, *args, **kwargs):
        spell_what_encodings_lack()
        with guarded_stderr():
            return super().main(*args, **kwargs)

    def invoke(self, ctx):
        try:
            require_stdout()
            result = super().invoke(ctx)
            if sys.stdout is not None:
                sys.stdout.flush()  # buffered results meet a closed pipe here, inside the boundary
            return result
        except BrokenPipeError:  # stdout's reader left (stderr's are dropped by streams.Chatter)
            reader_gone()
            raise typer.Exit(READER_GONE) from None
        except typer.BadParameter as exc:
            # Typer words a refused choice as pydantic does, "Value error, 'x' is not one of ..."
            exc.message = exc.message.removeprefix("Value error, ")
            raise
        except PonderError as exc:
            _fail(f"{exc.headline}: {exc}", exc.exit_code, exc)
        except KeyboardInterrupt as exc:
            # Ctrl-C before a command's own handling began (api.signals.interruptible says what
            # it kept): nothing was written yet; the shell's status for SIGINT, not click's "Aborted!"
            _fail("Interrupted: stopped before any result; nothing was written", 130, exc)
        except OSError as exc:
            _fail(f"Error: {exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}", 1, exc)


def _fail(line: str, code: int, exc: Exception) -> None:
    """Print the error line and exit with `code`. Under torchrun, the processes that print it are
    those distributed.error_line picks, and one still in a process group leaves at once."""
    if "WORLD_SIZE" in os.environ:  # under torchrun (only then is torch imported here)
        from ..distributed import error_line, leave_now
        line = error_line(line, exc)
        if line is not None:
            typer.echo(line, err=True)
        leave_now(code)
    else:
        typer.echo(line, err=True)
    raise typer.Exit(code) from None


app = typer.Typer(cls=PonderGroup, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None,  # plain click errors: one "Error: ..." line, no boxes
                  context_settings={"help_option_names": ["-h", "--help"]})


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ponder_cli {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
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
