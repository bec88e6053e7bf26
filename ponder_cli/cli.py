"""The `ponder` command: parse, call one library function (api.py), render. Results on stdout,
chatter on stderr; every command runs behind one error boundary (`PonderGroup`)."""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer
from typer.core import TyperGroup

from . import PonderError, __version__
from .cli_options import (AmpOption, AnglesCommand, CheckpointArgument, CnnDropoutMask, DataDirOption, DetailOption,
                          DeviceOption, DownloadOption, EvalBatchOption, EvalSeedOption, FormatOption,
                          HaltingInput, HaltingOption, LimitOption, Method, PlotOption, Protocol, ProtocolOption,
                          QuietOption, RepeatsOption, RequiredCheckpointArgument, Step, Task, TrainCommand,
                          angles_option, counts_option, expand_angles, halting_rules, hyper, path_option)
from .config import PonderConfig
from .config_file import render_config
from .render import OutputFormat
from .folders import LATEST
from .shipped import DEFAULT
from .streams import READER_GONE, guarded_stderr, reader_gone, require_stdout, spell_what_encodings_lack

__all__ = ["app", "expand_angles", "run"]


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
        except OSError as exc:
            _fail(f"Error: {exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}", 1, exc)


def _fail(line: str, code: int, exc: Exception) -> None:
    """Print the error line and exit with `code`. Under torchrun, the processes that print it are
    those distributed.error_line picks, and one still in a process group leaves at once."""
    if "WORLD_SIZE" in os.environ:  # under torchrun (only then is torch imported here)
        from .distributed import error_line, leave_now
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


def _chatter(quiet: bool):
    """Where progress lines go: stderr, or nowhere with --quiet (errors and results still show)."""
    return (lambda line: None) if quiet else (lambda line: typer.echo(line, err=True))


def _bars(quiet: bool, wanted: Optional[bool] = None) -> bool:
    """Progress bars only on a terminal: in a log file or a pipeline they are lines of noise."""
    return not quiet and (sys.stderr.isatty() if wanted is None else wanted)


def _render(report, fmt: OutputFormat, plot: Optional[Path], quiet: bool) -> None:
    from .plot import plot_report
    from .render import render_report

    render_report(report, fmt)
    if plot is not None:
        _chatter(quiet)(f"plot written to {plot_report(report, plot)}")


def _prepare(angles: Optional[list[str]], plot: Optional[Path], protocol: Protocol, halting: Optional[str],
             what: str = "--angles", **options):
    """The angles (None when not given: the checkpoint's task picks its buckets), the checked
    --plot destination (before any work) and the EvalOptions."""
    from .api import EvalOptions
    from .plot import check_destination
    from .tasks.mnist import parse_angles

    parsed = parse_angles(angles, what) if angles is not None else None
    plot = check_destination(plot) if plot is not None else None
    return parsed, plot, EvalOptions(protocol=protocol.value if protocol is not None else None, halting=halting,
                                     **options)


EVAL_ANGLES, EXTRAPOLATION_ANGLES = ["0"], ["22.5", "45", "67.5", "90"]


def _evaluate(command: str, checkpoint: Optional[str], angles: Optional[list[str]], quiet: bool, fmt: OutputFormat,
              counts: Optional[list[str]] = None, rotation: Optional[float] = None, **options) -> None:
    from .api import evaluate_checkpoint

    if rotation is not None:
        if angles is not None:
            raise PonderError(f"--rotation and --angles are alternatives: give one (--rotation {rotation:g} is "
                              f"--angles {rotation:g})")
        angles, options["what"] = [str(rotation)], "--rotation"
    parsed, plot, eval_options = _prepare(angles, **options)
    report = evaluate_checkpoint(command, checkpoint, parsed, eval_options, counts=counts, log=_chatter(quiet),
                                 progress=_bars(quiet))
    _render(report, fmt, plot, quiet)


# train -----------------------------------------------------------------------------------------

# Experiment and compatibility knobs: config-file settings, still accepted as hidden options
EXPERIMENT_OPTIONS = ("align_turn", "turn_gate", "cnn_dropout_mask", "halting_bias", "halting_input",
                      "gru_layer_norm", "gru_orthogonal", "gru_update_bias")

@app.command(cls=TrainCommand)
def train(
    task: Optional[Task] = hyper("task", "What to learn: mnist (digits; difficulty: rotation) or parity (the "
                                         "parity of +1 entries in vectors of ±1 and 0; difficulty: the non-zero "
                                         "count; implies --step gru, see docs/parity.md).", "--task",
                                 case_sensitive=False),
    method: Optional[Method] = hyper("method", "pondernet; act (Adaptive Computation Time, Graves 2016); plain "
                                                "(one step, no pondering: implies --max-steps 1).", "--method",
                                      case_sensitive=False),
    step: Optional[Step] = hyper("step", "The step function: mlp (CNN once, MLP steps: the reference); align "
                                          "(re-reads the image through a learnt rotation); parity vectors: rnn "
                                          "(the paper's tanh RNN), gru.", "--step",
                                  case_sensitive=False),
    truncation: Optional[float] = hyper("truncation", "Training drops an image from later steps once its "
                                                       "remaining halting mass is below this (0: off).", hidden=True),
    align_turn: Optional[float] = hyper("align_turn", "align: the largest turn of one step, in degrees.", hidden=True),
    turn_gate: Optional[float] = hyper("turn_gate", "align: holds halting back while the step turns; no halting "
                                                     "once its net turn over two steps reaches 2 × this × "
                                                     "--align-turn (0: off; the formula: docs/align.md).", hidden=True),
    cnn_dropout_mask: Optional[CnnDropoutMask] = hyper("cnn_dropout_mask", "mlp: a fresh Dropout2d mask at every "
                                                         "step (as the reference, which reruns its CNN at every "
                                                         "step), or one per image shared by every step (how runs "
                                                         "saved before per-step became mlp's default trained).",
                                                         "--cnn-dropout-mask", case_sensitive=False, hidden=True),
    halting_bias: Optional[str] = hyper("halting_bias", "Initial halting-head bias: a number, or 'prior' "
                                                         "(logit of --lambda-p); none: the method's own. A method's "
                                                         "value wins over a step's.", hidden=True),
    epochs: Optional[int] = hyper("epochs", "Training epochs."),
    batch_size: Optional[int] = hyper("batch_size", "Images per optimizer step (under torchrun: over all "
                                                    "processes)."),
    lr: Optional[float] = hyper("lr", "Adam learning rate."),
    max_steps: Optional[int] = hyper("max_steps", "Maximum ponder steps."),
    hidden: Optional[int] = hyper("hidden", "Size of the recurrent state (rnn: the paper's 128 tanh units)."),
    lambda_p: Optional[float] = hyper("lambda_p", "Geometric prior parameter, in (0, 1]."),
    beta: Optional[float] = hyper("beta", "Weight of the KL regularisation."),
    tau: Optional[float] = hyper("tau", "ACT: weight of the ponder cost N + R."),
    halting_input: Optional[HaltingInput] = hyper("halting_input", "What the halting head sees besides the "
                                                   "state: the step's top class probability, the previous step's "
                                                   "state, the step's turn (align), in that order: "
                                                   "state+confidence+previous+turn or a part of it.",
                                                   "--halting-input", case_sensitive=False,
                                                   metavar="<state[+confidence][+previous][+turn]>", hidden=True),
    grad_clip: Optional[float] = hyper("grad_clip", "Gradient-norm clip (0: off).", hidden=True),
    patience: Optional[int] = hyper("patience", "Early stopping: epochs without a better validation accuracy "
                                                 "(0: off)."),
    lr_patience: Optional[int] = hyper("lr_patience", "Epochs without improvement before the LR is cut.", hidden=True),
    train_rotation: Optional[float] = hyper("train_rotation", "Rotate training images uniformly within "
                                                               "+-this many degrees (0: plain MNIST)."),
    val_size: Optional[int] = hyper("val_size", "Training images held out for validation.", hidden=True),
    train_size: Optional[int] = hyper("train_size", "Training images used (0: all not held out)."),
    elems: Optional[int] = hyper("elems", "parity: entries per vector."),
    train_counts: Optional[str] = hyper("train_counts", "parity: non-zero counts of training vectors, LO-HI "
                                                         "(e.g. 1-48).", default_text="1-ELEMS", metavar="LO-HI"),
    batches_per_epoch: Optional[int] = hyper("batches_per_epoch", "parity: batches of fresh vectors per epoch (the "
                                                                   "unit of validation, checkpoints and patience).", hidden=True),
    gru_layer_norm: Optional[bool] = hyper("gru_layer_norm", "gru: LayerNorm on the new state.",
                                           "--gru-layer-norm/--no-gru-layer-norm", hidden=True),
    gru_orthogonal: Optional[bool] = hyper("gru_orthogonal", "gru: orthogonal recurrent weights.",
                                           "--gru-orthogonal/--no-gru-orthogonal", hidden=True),
    gru_update_bias: Optional[float] = hyper("gru_update_bias", "gru: added to the update gate's bias (keeps more "
                                                                 "of the previous state).", hidden=True),
    seed: Optional[int] = hyper("seed", "Seed of the split, initialisation and sampling."),
    data_dir: Optional[Path] = DataDirOption,
    download: bool = typer.Option(True, "--download/--no-download", hidden=True),
    config: Optional[Path] = typer.Option(None, "--config", "-c", metavar="FILE", show_default=False,
                                          help="Settings from a TOML or JSON file (a run folder's config.toml "
                                               "re-runs that run); options given here override it. Every setting "
                                               "is a key there: docs/configuration.md."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the settings this command would train "
                                      "with, each with where its value comes from, as a --config file (-f json: "
                                      "JSON), and exit."),
    out: Optional[Path] = path_option("--out", show_default=False, help="Folder for best.pt and last.pt. "
                                       "[default: a new runs/METHOD-STEP-seedSEED, or the resumed run's folder]"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the checkpoints of another run in "
                                   "--out."),
    device: str = DeviceOption,
    amp: Optional[bool] = typer.Option(None, "--amp/--no-amp", hidden=True),
    resume: Optional[str] = typer.Option(None, "--resume", metavar="CHECKPOINT",
                                         help="Continue the run saved in this checkpoint: a file (e.g. "
                                              "runs/pondernet-mlp-seed1234/last.pt), a run folder (its last.pt) or "
                                              "latest (the newest run under runs/)."),
    tensorboard: bool = typer.Option(False, "--tensorboard", help="Also write TensorBoard event files into the run "
                                     "folder: every epoch's figures and the halting-step histogram (needs "
                                     "tensorboard: pip install tensorboard); view with tensorboard --logdir runs."),
    deterministic: bool = typer.Option(False, "--deterministic", help="Only deterministic kernels "
                                       "(torch.use_deterministic_algorithms): the same seed on the same machine gives "
                                       "the same weights, on CUDA too; slower there."),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", hidden=True),
    quiet: bool = QuietOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """Train PonderNet (or ACT, or a one-step network) on MNIST or parity; writes best.pt and last.pt under --out.

    Less common settings (--grad-clip, --lr-patience, --val-size, --truncation, --amp, ...) are
    options too, left out of this list; every setting can be kept in a --config file.
    """
    from .api import TrainOptions, train_run, training_config

    given = {name: value.value if isinstance(value, Enum) else value for name, value in locals().items()
             if name in PonderConfig.field_names() and value is not None}
    notes = tuple(f"note: --{name.replace('_', '-')} is kept for existing scripts; set {name} in a --config file "
                  f"instead (docs/configuration.md)" for name in sorted(set(given) & set(EXPERIMENT_OPTIONS)))
    options = TrainOptions(resume=resume, out=out, data_dir=data_dir, download=download, device=device, amp=amp,
                           progress=_bars(quiet, progress), overwrite=overwrite, tensorboard=tensorboard,
                           config_file=config, notes=notes, deterministic=deterministic)
    if print_config:
        for note in notes:
            _chatter(quiet)(note)
        cfg, sources = training_config(given, options)
        sys.stdout.write(render_config(cfg, sources, cfg.shown_fields(), "json" if fmt == OutputFormat.json else "toml"))
        return
    report = train_run(given, options, log=_chatter(quiet))
    if report is not None:  # None: a torchrun process other than rank 0, which reports nothing
        _render(report, fmt, None, quiet)


# eval, extrapolate, compare --------------------------------------------------------------------

@app.command("eval", cls=AnglesCommand)
def eval_command(
    checkpoint: Optional[str] = CheckpointArgument,
    angles: Optional[List[str]] = angles_option(EVAL_ANGLES, "Rotate test images within ±angle; one bucket per angle."),
    counts: Optional[List[str]] = counts_option("the training range in four"),
    rotation: Optional[float] = typer.Option(None, "--rotation", metavar="DEG",
                                             help="The same as --angles with one angle (give one or the other)."),
    protocol: Optional[Protocol] = ProtocolOption,
    halting: Optional[str] = HaltingOption,
    detail: bool = DetailOption,
    plot: Optional[Path] = PlotOption,
    seed: Optional[int] = EvalSeedOption,
    repeats: int = RepeatsOption,
    limit: int = LimitOption,
    batch_size: int = EvalBatchOption,
    data_dir: Optional[Path] = DataDirOption,
    download: bool = DownloadOption,
    device: str = DeviceOption,
    amp: Optional[bool] = AmpOption,
    quiet: bool = QuietOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """Accuracy, ponder steps and loss on the test set (MNIST: rotated images; parity: fixed vectors)."""
    _evaluate("eval", **locals())


@app.command(cls=AnglesCommand)
def extrapolate(
    checkpoint: Optional[str] = CheckpointArgument,
    angles: Optional[List[str]] = angles_option(EXTRAPOLATION_ANGLES, "Rotation buckets in degrees (see --protocol)."),
    counts: Optional[List[str]] = counts_option("the counts beyond the training range in four; all counts "
                                                "in four when training saw every count"),
    protocol: Optional[Protocol] = ProtocolOption,
    halting: Optional[str] = HaltingOption,
    detail: bool = DetailOption,
    plot: Optional[Path] = PlotOption,
    seed: Optional[int] = EvalSeedOption,
    repeats: int = RepeatsOption,
    limit: int = LimitOption,
    batch_size: int = EvalBatchOption,
    data_dir: Optional[Path] = DataDirOption,
    download: bool = DownloadOption,
    device: str = DeviceOption,
    amp: Optional[bool] = AmpOption,
    quiet: bool = QuietOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """Accuracy and ponder steps beyond training: MNIST rotated within ±angle, parity's unseen non-zero counts."""
    _evaluate("extrapolate", **locals())


@app.command()
def sweep(
    checkpoint: Optional[str] = CheckpointArgument,
    start: Optional[float] = typer.Option(None, "--from", show_default=False,
                                          help="First angle, degrees (parity: first non-zero count). [default: 0; "
                                               "parity: 1]"),
    stop: Optional[float] = typer.Option(None, "--to", show_default=False,
                                         help="Last angle, degrees (parity: last count). [default: 180; parity: "
                                              "the vector's elements]"),
    every: Optional[float] = typer.Option(None, "--every", show_default=False,
                                          help="Degrees (parity: counts) between buckets. [default: 5; parity: 1]"),
    halting: Optional[str] = HaltingOption,
    plot: Optional[Path] = PlotOption,
    seed: Optional[int] = EvalSeedOption,
    repeats: int = RepeatsOption,
    limit: int = LimitOption,
    batch_size: int = EvalBatchOption,
    data_dir: Optional[Path] = DataDirOption,
    download: bool = DownloadOption,
    device: str = DeviceOption,
    amp: Optional[bool] = AmpOption,
    fmt: OutputFormat = FormatOption,
    quiet: bool = QuietOption,
) -> None:
    """Mental rotation: steps and accuracy at exact angles --from..--to every --every degrees, and the
    least-squares slope of steps per 10°; parity: at each exact non-zero count, steps per count."""
    from .api import sweep_checkpoint

    _, plot, options = _prepare(None, plot, Protocol("fixed"), halting, seed=seed, repeats=repeats, limit=limit,
                                batch_size=batch_size, data_dir=data_dir, download=download, device=device, amp=amp)
    report = sweep_checkpoint(checkpoint, start, stop, every, options, log=_chatter(quiet), progress=_bars(quiet))
    _render(report, fmt, plot, quiet)


@app.command(cls=AnglesCommand)
def compare(
    checkpoints: List[str] = typer.Argument(..., metavar="CHECKPOINT", show_default=False,
                                            help="Checkpoints to compare (each as eval's CHECKPOINT: a file, a run "
                                                 "folder, latest or a shipped model's name): one or more per method; "
                                                 "several of one method (e.g. other seeds) give mean ± sd."),
    angles: Optional[List[str]] = angles_option(EXTRAPOLATION_ANGLES, "Rotation buckets in degrees."),
    counts: Optional[List[str]] = counts_option("every count in four"),
    protocol: Optional[Protocol] = ProtocolOption,
    halting: Optional[str] = HaltingOption,
    plot: Optional[Path] = PlotOption,
    seed: int = typer.Option(PonderConfig.default("seed"), "--seed", help="Seed of the test rotations and halting "
                             "coin flips (the same for every checkpoint, so all see the same images)."),
    repeats: int = RepeatsOption,
    limit: int = LimitOption,
    batch_size: int = EvalBatchOption,
    data_dir: Optional[Path] = DataDirOption,
    download: bool = DownloadOption,
    device: str = DeviceOption,
    amp: Optional[bool] = AmpOption,
    quiet: bool = QuietOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """Methods side by side on the same buckets (rotations or non-zero counts): accuracy and ponder steps, mean ± sd
    over seeds."""
    from .api import compare_checkpoints

    parsed, plot, options = _prepare(angles, plot, protocol, halting, seed=seed,
                                     repeats=repeats, limit=limit, batch_size=batch_size, data_dir=data_dir,
                                     download=download, device=device, amp=amp)
    report = compare_checkpoints(checkpoints, parsed, options, counts=counts, log=_chatter(quiet),
                                 progress=_bars(quiet))
    _render(report, fmt, plot, quiet)


@app.command(cls=AnglesCommand)
def calibrate(
    checkpoint: Optional[str] = CheckpointArgument,
    tolerance: float = typer.Option(0.005, "--tolerance", help="Choose the cheapest rule whose predicted class "
                                    "agrees with the last step's on at least 1 - this share of the validation "
                                    "inputs."),
    angles: Optional[List[str]] = angles_option(["the training rotation"], "Rotate the validation images within "
                                                "±angle (see --protocol); one bucket per angle, pooled."),
    counts: Optional[List[str]] = counts_option("the training range"),
    rules: Optional[List[str]] = typer.Option(None, "--rules", metavar="RULE...", show_default=False,
                                              callback=halting_rules,
                                              help="The candidate exit rules, spelled as --halting takes them. "
                                              "Several values after one flag: --rules quantile:0.9 "
                                              "confidence:0.995. [default: quantile:0.5 to 0.99, patience:1 "
                                              "to 4, confidence:0.5 to 0.999]"),
    protocol: Optional[Protocol] = ProtocolOption,
    seed: Optional[int] = EvalSeedOption,
    repeats: int = RepeatsOption,
    limit: int = typer.Option(0, "--limit", min=0, help="Only the first N validation images (0: all); parity: N "
                              "vectors per non-zero count (0: 64)."),
    batch_size: int = EvalBatchOption,
    data_dir: Optional[Path] = DataDirOption,
    download: bool = DownloadOption,
    device: str = DeviceOption,
    amp: Optional[bool] = AmpOption,
    quiet: bool = QuietOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """Choose an exit rule on held-out data: quantile:Q, patience:K and confidence:C rules on the validation set
    (not the test set), and the cheapest that agrees with the last step; paste it into --halting."""
    from .api import calibrate_checkpoint

    parsed, _, options = _prepare(angles, None, protocol, None, seed=seed, repeats=repeats, limit=limit,
                                  batch_size=batch_size, data_dir=data_dir, download=download, device=device, amp=amp)
    report = calibrate_checkpoint(checkpoint, parsed, options, counts=counts, tolerance=tolerance, rules=rules,
                                  log=_chatter(quiet), progress=_bars(quiet))
    _render(report, fmt, None, quiet)


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
    from .api import PredictOptions, predict_inputs
    from .plot import check_destination

    plot = check_destination(plot) if plot is not None else None
    options = PredictOptions(halting=halting, seed=seed, invert=invert, rotate=rotate, steps=steps,
                             views=plot is not None, device=device)
    report = predict_inputs(checkpoint, inputs, options, log=_chatter(quiet))
    _render(report, fmt, plot, quiet)


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
    from .api import run_info
    from .plot import check_destination

    plot = check_destination(plot) if plot is not None else None
    _render(run_info(checkpoint, log=_chatter(quiet)), fmt, plot, quiet)


@app.command()
def models(
    quiet: bool = QuietOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """The models shipped inside the package, by name: task, what each is, its validation figures."""
    from .catalogue import shipped_models

    _render(shipped_models(log=_chatter(quiet)), fmt, None, quiet)


def run() -> None:
    app(prog_name="ponder")
