"""`ponder train`."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from ..cli_options import (
    CnnDropoutMask,
    DataDirOption,
    DeviceOption,
    FormatOption,
    HaltingInput,
    QuietOption,
    TrainCommand,
    hyper,
    path_option,
    piece_choice,
    piece_metavar,
)
from ..config import PonderConfig
from ..config_file import render_config
from ..render import OutputFormat
from .app import app, bars, chatter, render_and_plot

# train -----------------------------------------------------------------------------------------

# Experiment and compatibility knobs: config-file settings, still accepted as hidden options
EXPERIMENT_OPTIONS = ("align_turn", "turn_gate", "cnn_dropout_mask", "halting_bias", "halting_input",
                      "gru_layer_norm", "gru_orthogonal", "gru_update_bias")


@app.command(cls=TrainCommand)
def train(
    task: Optional[str] = hyper("task", "What to learn: mnist (digits; difficulty: rotation) or parity (the "
                                        "parity of +1 entries in vectors of ±1 and 0; difficulty: the non-zero "
                                        "count; implies --step gru, see docs/parity.md).", "--task",
                                metavar=piece_metavar("task"), callback=piece_choice("task")),
    method: Optional[str] = hyper("method", "pondernet; act (Adaptive Computation Time, Graves 2016); plain "
                                            "(one step, no pondering: implies --max-steps 1).", "--method",
                                  metavar=piece_metavar("method"), callback=piece_choice("method")),
    step: Optional[str] = hyper("step", "The step function: mlp (CNN once, MLP steps: the reference); align "
                                        "(re-reads the image through a learnt rotation); parity vectors: rnn "
                                        "(the paper's tanh RNN), gru.", "--step",
                                metavar=piece_metavar("step"), callback=piece_choice("step")),
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
                                                                   "unit of validation, checkpoints and patience).",
                                             hidden=True),
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
    from ..api import TrainOptions, train_run, training_config

    given = {name: value.value if isinstance(value, Enum) else value for name, value in locals().items()
             if name in PonderConfig.field_names() and value is not None}
    notes = tuple(f"note: --{name.replace('_', '-')} is kept for existing scripts; set {name} in a --config file "
                  f"instead (docs/configuration.md)" for name in sorted(set(given) & set(EXPERIMENT_OPTIONS)))
    options = TrainOptions(resume=resume, out=out, data_dir=data_dir, download=download, device=device, amp=amp,
                           progress=bars(quiet, progress), overwrite=overwrite, tensorboard=tensorboard,
                           config_file=config, notes=notes, deterministic=deterministic)
    if print_config:
        for note in notes:
            chatter(quiet)(note)
        cfg, sources = training_config(given, options)
        fmt_name = "json" if fmt == OutputFormat.json else "toml"
        sys.stdout.write(render_config(cfg, sources, cfg.shown_fields(), fmt_name))
        return
    report = train_run(given, options, log=chatter(quiet))
    if report is not None:  # None: a torchrun process other than rank 0, which reports nothing
        render_and_plot(report, fmt, None, quiet)
