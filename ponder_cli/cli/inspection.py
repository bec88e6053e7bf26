"""`ponder predict`, `info` and `models`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..cli_options import (
    DeviceOption,
    FormatOption,
    HaltingOption,
    QuietOption,
    RequiredCheckpointArgument,
    path_option,
)
from ..folders import DEFAULT, LATEST, RUNS_DIR
from ..render import OutputFormat
from .app import app, chatter, render_and_plot

# predict, info -----------------------------------------------------------------------------------


@app.command()
def predict(
    checkpoint: str = RequiredCheckpointArgument,
    inputs: List[Path] = typer.Argument(..., metavar="INPUT...", show_default=False,
                                        help="MNIST models: image files (PNG, JPEG, ...: any size and mode) or .npy "
                                             "arrays of shape (N, 28, 28); parity models: .npy arrays (N, ELEMS) or "
                                             "text files of one vector per line (entries -1, 0, 1)."),
    halting: Optional[str] = HaltingOption,
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the halting coin flips (--halting sample). "
                                       "[default: the checkpoint's training seed]"),
    steps: bool = typer.Option(False, "--steps", help="Also show every step: its top class and probability, λ_n, "
                               "p_n and the step function's own figures (align: the accumulated turn)."),
    invert: Optional[bool] = typer.Option(None, "--invert/--no-invert", show_default=False,
                                          help="Images: dark digits on a light background, to be inverted. "
                                               "[default: detected per image, from its border]"),
    rotate: Optional[float] = typer.Option(None, "--rotate", metavar="DEG", help="Images: rotate every input "
                                           "counter-clockwise by DEG degrees first, as evaluation rotates."),
    plot: Optional[Path] = path_option("--plot", help="Write a strip per input: what the model sees at each "
                                        "step (align: the re-read view), the step's class and probability and "
                                        "λ_n, the halting step framed (needs matplotlib)."),
    device: str = DeviceOption,
    quiet: bool = QuietOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """A model on your own inputs: the prediction, its probability and the halting step per input."""
    from ..api import PredictOptions, predict_inputs
    from ..plot import check_destination

    plot = check_destination(plot) if plot is not None else None
    options = PredictOptions(halting=halting, seed=seed, invert=invert, rotate=rotate, steps=steps,
                             views=plot is not None, device=device)
    report = predict_inputs(checkpoint, inputs, options, log=chatter(quiet))
    render_and_plot(report, fmt, plot, quiet)


@app.command()
def info(
    checkpoint: Optional[str] = typer.Argument(
        None, metavar="CHECKPOINT|RUN_DIR", show_default=False,
        help=f"A checkpoint file, a run folder (its last.pt, else its best.pt), {LATEST} (the newest run) or a shipped "
             f"model's name. [default: {DEFAULT}]"),
    plot: Optional[Path] = path_option("--plot", help="Write the learning curves: loss, accuracy and ponder "
                                        "steps per epoch (needs matplotlib)."),
    quiet: bool = QuietOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """What a checkpoint or run holds: task, method, step, configuration, epochs, the best epoch and the history."""
    from ..api import run_info
    from ..plot import check_destination

    plot = check_destination(plot) if plot is not None else None
    render_and_plot(run_info(checkpoint, log=chatter(quiet)), fmt, plot, quiet)


@app.command()
def models(
    quiet: bool = QuietOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """The models shipped inside the package, by name: task, what each is, its validation figures."""
    from ..api.inspection import shipped_models

    render_and_plot(shipped_models(log=chatter(quiet)), fmt, None, quiet)


@app.command()
def runs(
    folders: Optional[List[Path]] = typer.Argument(None, metavar="FOLDER", show_default=False,
                                                   help=f"Folders of runs, or run folders. [default: {RUNS_DIR}]"),
    quiet: bool = QuietOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """Your training runs: each run folder's task, method, step, status (finished, stopped early, interrupted,
    running, empty), epochs, best epoch and validation accuracy, and when it last wrote."""
    from ..api import list_runs

    render_and_plot(list_runs(folders or [], log=chatter(quiet)), fmt, None, quiet)
