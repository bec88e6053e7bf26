"""`ponder train`."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer

from ..cli_options import (
    CnnDropoutMask,
    Encoding,
    Layout,
    DataDirOption,
    DeviceOption,
    HaltingInput,
    TimeLimitOption,
    HaltingTarget,
    Prior,
    QuietOption,
    TrainCommand,
    complete_checkpoint,
    complete_resumable,
    complete_piece,
    hyper,
    path_option,
    piece_choice,
    piece_metavar,
)
from .. import BadValue
from ..config import TYPES, PonderConfig, problems_of, render_config
from ..folders import Labels
from ..render import TrainFormat, json_line
from .app import app, bars, chatter, render_and_plot

# train -----------------------------------------------------------------------------------------

# The options of `ponder train`, declared apart so that the command reads as a list
TASK_OPTION = hyper("task", "What to learn: mnist (digits; difficulty: rotation) or parity (the "
                            "parity of +1 entries in vectors of ±1 and 0; difficulty: the non-zero "
                            "count; implies --step gru, see docs/parity.md).", "--task",
                    metavar=piece_metavar("task"), callback=piece_choice("task"),
                    autocompletion=complete_piece("task"))
METHOD_OPTION = hyper("method", "pondernet; act (Adaptive Computation Time, Graves 2016); plain "
                                "(one step, no pondering: implies --max-steps 1).", "--method",
                      metavar=piece_metavar("method"), callback=piece_choice("method"),
                    autocompletion=complete_piece("method"))
STEP_OPTION = hyper("step", "The step function: mlp (CNN once, MLP steps: the reference); align "
                            "(re-reads the image through a learnt rotation); parity vectors: rnn "
                            "(the paper's tanh RNN), gru.", "--step",
                    metavar=piece_metavar("step"), callback=piece_choice("step"),
                    autocompletion=complete_piece("step"))
TRUNCATION_OPTION = hyper("truncation", "Training drops an image from later steps once its "
                                         "remaining halting mass is below this (0: off).", hidden=True)
ALIGN_TURN_OPTION = hyper("align_turn", "align: the largest turn of one step, in degrees.", hidden=True)
TURN_GATE_OPTION = hyper("turn_gate", "align: holds halting back while the step turns; no halting "
                                       "once its net turn over two steps reaches 2 × this × "
                                       "--align-turn (0: off; the formula: docs/align.md).", hidden=True)
CNN_DROPOUT_MASK_OPTION = hyper("cnn_dropout_mask", "mlp: a fresh Dropout2d mask at every step (as the reference, "
                                "which reruns its CNN at every step), or one per image shared by every step "
                                "(how runs saved before per-step became mlp's default trained).",
                                "--cnn-dropout-mask", case_sensitive=False, hidden=True)
HALTING_BIAS_OPTION = hyper("halting_bias", "Initial halting-head bias: a number, or 'prior' (logit of "
                            "--lambda-p); none: the method's own. A method's value wins over a step's.", hidden=True)
EPOCHS_OPTION = hyper("epochs", "Training epochs.")
BATCH_SIZE_OPTION = hyper("batch_size", "Images per optimizer step (under torchrun: over all "
                                        "processes).")
LR_OPTION = hyper("lr", "Adam learning rate.")
MAX_STEPS_OPTION = hyper("max_steps", "Maximum ponder steps.")
HIDDEN_OPTION = hyper("hidden", "Size of the recurrent state (rnn: the paper's 128 tanh units).")
LAMBDA_P_OPTION = hyper("lambda_p", "Geometric prior parameter, in (0, 1].")
BETA_OPTION = hyper("beta", "Weight of the KL regularisation.")
PRIOR_OPTION = hyper("prior", "The prior's shape: geometric (--lambda-p, the paper's) or uniform over the steps.",
                     "--prior", case_sensitive=False, hidden=True)
HALTING_TARGET_OPTION = hyper("halting_target", "What the halting head learns: prior (the KL pull towards the "
                              "prior, the paper's), or, by binary cross-entropy, final (no later step changes the "
                              "answer) or correct (the answer is right); halt such a head by --halting "
                              "threshold:T (docs/halting.md). Needs --truncation 0.", "--halting-target",
                              case_sensitive=False, hidden=True)
HALTING_THRESHOLD_OPTION = hyper("halting_threshold", "With --halting-target final|correct: the head's own rule, "
                                 "threshold:T (halt at the first lambda >= T), by which validation chooses best.pt "
                                 "and every command halts without --halting.", hidden=True)
REFIT_HALTING_OPTION = hyper("refit_halting", "With --init-from: refit that model's halting head alone, every "
                             "other weight frozen, the head new (options given here override its settings: the "
                             "halting ones, --epochs, ...; docs/halting.md).", "--refit-halting/--no-refit-halting",
                             default_text="off")
BETA_WARMUP_OPTION = hyper("beta_warmup", "The KL weight grows from 0 to --beta over this many optimizer steps "
                                          "(0: off).", hidden=True)
DEPTH_MIN_OPTION = hyper("depth_min", "Random-depth training: each input trains at a depth drawn from this to "
                                      "--max-steps, its halting forced there (0: off).", hidden=True)
TAU_OPTION = hyper("tau", "ACT: weight of the ponder cost N + R.")
HALTING_INPUT_OPTION = hyper("halting_input", "What the halting head sees besides the state: the step's top "
                             "class probability, the previous step's state, the step's turn (align), in that "
                             "order, and the step's answer (how sure, how it changed: docs/halting.md): "
                             "state+confidence+previous+turn+answer or a part of it.", "--halting-input",
                             case_sensitive=False, metavar="<state[+confidence][+previous][+turn][+answer]>",
                             hidden=True)
GRAD_CLIP_OPTION = hyper("grad_clip", "Gradient-norm clip (0: off).", hidden=True)
PATIENCE_OPTION = hyper("patience", "Early stopping: epochs without a better validation accuracy "
                                     "(0: off).")
LR_PATIENCE_OPTION = hyper("lr_patience", "Epochs without improvement before the LR is cut.", hidden=True)
TRAIN_ROTATION_OPTION = hyper("train_rotation", "Rotate training images uniformly within "
                                                 "+-this many degrees (0: plain MNIST).")
VAL_SIZE_OPTION = hyper("val_size", "Training images held out for validation.", hidden=True)
SPLIT_SEED_OPTION = hyper("split_seed", "Seed of the held-out split (with --init-from: its source's, which keeps "
                                        "the digits that model trained on out of validation).", hidden=True,
                          default_text="--seed")
TRAIN_SIZE_OPTION = hyper("train_size", "Training images used (0: all not held out).")
ELEMS_OPTION = hyper("elems", "parity: entries per vector.")
TRAIN_COUNTS_OPTION = hyper("train_counts", "parity: non-zero counts of training vectors, LO-HI "
                                             "(e.g. 1-48).", default_text="1-ELEMS", metavar="LO-HI")
BATCHES_PER_EPOCH_OPTION = hyper("batches_per_epoch", "parity: batches of fresh vectors per epoch (the "
                                                       "unit of validation, checkpoints and patience).",
                                 hidden=True)
GRU_LAYER_NORM_OPTION = hyper("gru_layer_norm", "gru: LayerNorm on the new state.",
                              "--gru-layer-norm/--no-gru-layer-norm", hidden=True)
GRU_ORTHOGONAL_OPTION = hyper("gru_orthogonal", "gru: orthogonal recurrent weights.",
                              "--gru-orthogonal/--no-gru-orthogonal", hidden=True)
GRU_UPDATE_BIAS_OPTION = hyper("gru_update_bias", "gru: added to the update gate's bias (keeps more "
                                                   "of the previous state).", hidden=True)
# settings kept out of --help (a --config file holds them too): each has its option all the same, so
# that every setting is one, and the command `ponder info` gives for a run reproduces it
CURRICULUM_OPTION = hyper("curriculum", "parity: over the first this many batches the top training count grows from "
                                        "--curriculum-start (0: off).", hidden=True)
CURRICULUM_START_OPTION = hyper("curriculum_start", "parity: the curriculum's first top count.", hidden=True)
CURRICULUM_ADVANCE_OPTION = hyper("curriculum_advance", "parity: a curriculum by progress: the top training count, "
                                  "from --curriculum-start, is raised by an eighth of the range once validation "
                                  "accuracy on the counts up to it reaches this (0: off).", hidden=True)
CURRICULUM_MIX_OPTION = hyper("curriculum_mix", "parity: this share of every batch of a curriculum drawn from the "
                              "whole training range, the rest from its current range (0: none).", hidden=True)
LAYOUT_OPTION = hyper("layout", "parity: where a vector's non-zeros sit: at random positions (scattered, the PonderNet "
                      "line's) or in the first COUNT positions (prefix, the ACT line's).", "--layout",
                      metavar="<scattered|prefix>", case_sensitive=False, hidden=True)
ENCODING_OPTION = hyper("encoding", "rnn, gru: each entry read as its value (raw), one-hot over {-1, 0, +1} "
                        "(onehot) or as its value and its square side by side (square).", "--encoding",
                        metavar="<raw|onehot|square>", case_sensitive=False, hidden=True)
HIDDEN_CNN_OPTION = hyper("hidden_cnn", "Size of the image embedding.", hidden=True)
HIDDEN_LIN_OPTION = hyper("hidden_lin", "mlp: the step MLP's hidden layer.", hidden=True)
KERNEL_SIZE_OPTION = hyper("kernel_size", "The CNN's kernel size.", hidden=True)
CNN_DROPOUT_OPTION = hyper("cnn_dropout", "Dropout2d after the CNN's second convolution.", hidden=True)
MLP_DROPOUT_OPTION = hyper("mlp_dropout", "Dropout in the step MLP.", hidden=True)
ACT_EPSILON_OPTION = hyper("act_epsilon", "ACT: halt once the halting units sum to 1 - this.", hidden=True)
TRUNCATION_RULE_OPTION = hyper("truncation_rule", "Below --truncation: cut, or roulette (unbiased).", hidden=True)
LR_FACTOR_OPTION = hyper("lr_factor", "The LR's cut when it is reduced.", hidden=True)
SEED_OPTION = hyper("seed", "Seed of the split, initialisation and sampling.")
DOWNLOAD_OPTION = typer.Option(True, "--download/--no-download", hidden=True)
CONFIG_OPTION = typer.Option(None, "--config", "-c", metavar="FILE", show_default=False,
                             help="Settings from a TOML or JSON file (a run folder's config.toml "
                                  "re-runs that run); options given here override it. Every setting "
                                  "is a key there: docs/configuration.md.")
PRINT_CONFIG_OPTION = typer.Option(False, "--print-config", help="Print the settings this command would train "
                                   "with, each with where its value comes from, as a --config file (-f json: "
                                   "JSON), and exit.")
OUT_OPTION = path_option("--out", show_default=False, help="Folder for best.pt and last.pt. "
                          "[default: a new runs/METHOD-STEP-seedSEED, or the resumed run's folder]")
OVERWRITE_OPTION = typer.Option(False, "--overwrite", help="Replace the files of another run in --out "
                                "(checkpoints, config.json, metrics.csv, ...): without it such a folder is "
                                "refused.")
AMP_OPTION = typer.Option(None, "--amp/--no-amp", hidden=True)
CUDA_GRAPHS_OPTION = typer.Option(True, "--cuda-graphs/--no-cuda-graphs", hidden=True)
RESUME_OPTION = typer.Option(None, "--resume", metavar="CHECKPOINT",  # a shipped model is no run to continue
                             autocompletion=lambda incomplete: complete_resumable(incomplete),
                             help="Continue the run saved in this checkpoint: a file (e.g. "
                                  "runs/pondernet-mlp-seed1234/last.pt), a run folder (its last.pt) or "
                                  "latest (the newest run under runs/).")
INIT_FROM_OPTION = typer.Option(None, "--init-from", metavar="CHECKPOINT",
                                autocompletion=lambda incomplete: complete_checkpoint(incomplete),
                                help="Start a new run from this checkpoint's weights (a file, a run folder: its "
                                     "best.pt, latest, or a shipped model), its settings but those given: new ones "
                                     "where the model keeps its shapes (--lr, --epochs, --beta, ...).")
TENSORBOARD_OPTION = typer.Option(False, "--tensorboard", help="Also write TensorBoard event files into the run "
                                  "folder: every epoch's figures and the halting-step histogram (needs "
                                  "tensorboard: pip install tensorboard); view with tensorboard --logdir runs.")
DETERMINISTIC_OPTION = typer.Option(False, "--deterministic", help="Only deterministic kernels "
                                    "(torch.use_deterministic_algorithms): the same seed on the same machine gives "
                                    "the same weights, on CUDA too; slower there.")
NAME_OPTION = typer.Option(None, "--name", metavar="TEXT", help="A name for the run, which `ponder runs` shows and "
                           "--where name=... finds (the folder keeps its own).")
TAG_OPTION = typer.Option(None, "--tag", metavar="TAG", help="A tag for the run (one word; repeat it for several): "
                          "`ponder runs --where tag=TAG` finds them.")
NOTE_OPTION = typer.Option(None, "--note", metavar="TEXT", help="A line about the run, which `ponder info` and "
                           "`ponder runs` show. None of these three changes training: resuming keeps them or takes "
                           "new ones.")
PROGRESS_OPTION = typer.Option(None, "--progress/--no-progress", hidden=True)
FORMAT_OPTION = typer.Option(TrainFormat.table, "--format", "-f", case_sensitive=False,
                             help="Output format. jsonl: one JSON object per line on stdout, each epoch's as it "
                                  "ends, then the report's (progress stays on stderr).")


@app.command(cls=TrainCommand)
def train(
    task: Optional[str] = TASK_OPTION,
    method: Optional[str] = METHOD_OPTION,
    step: Optional[str] = STEP_OPTION,
    truncation: Optional[float] = TRUNCATION_OPTION,
    align_turn: Optional[float] = ALIGN_TURN_OPTION,
    turn_gate: Optional[float] = TURN_GATE_OPTION,
    cnn_dropout_mask: Optional[CnnDropoutMask] = CNN_DROPOUT_MASK_OPTION,
    halting_bias: Optional[str] = HALTING_BIAS_OPTION,
    epochs: Optional[int] = EPOCHS_OPTION,
    batch_size: Optional[int] = BATCH_SIZE_OPTION,
    lr: Optional[float] = LR_OPTION,
    max_steps: Optional[int] = MAX_STEPS_OPTION,
    hidden: Optional[int] = HIDDEN_OPTION,
    lambda_p: Optional[float] = LAMBDA_P_OPTION,
    beta: Optional[float] = BETA_OPTION,
    prior: Optional[Prior] = PRIOR_OPTION,
    halting_target: Optional[HaltingTarget] = HALTING_TARGET_OPTION,
    halting_threshold: Optional[float] = HALTING_THRESHOLD_OPTION,
    refit_halting: Optional[bool] = REFIT_HALTING_OPTION,
    beta_warmup: Optional[int] = BETA_WARMUP_OPTION,
    depth_min: Optional[int] = DEPTH_MIN_OPTION,
    tau: Optional[float] = TAU_OPTION,
    halting_input: Optional[HaltingInput] = HALTING_INPUT_OPTION,
    grad_clip: Optional[float] = GRAD_CLIP_OPTION,
    patience: Optional[int] = PATIENCE_OPTION,
    lr_patience: Optional[int] = LR_PATIENCE_OPTION,
    train_rotation: Optional[float] = TRAIN_ROTATION_OPTION,
    val_size: Optional[int] = VAL_SIZE_OPTION,
    split_seed: Optional[int] = SPLIT_SEED_OPTION,
    train_size: Optional[int] = TRAIN_SIZE_OPTION,
    elems: Optional[int] = ELEMS_OPTION,
    train_counts: Optional[str] = TRAIN_COUNTS_OPTION,
    batches_per_epoch: Optional[int] = BATCHES_PER_EPOCH_OPTION,
    gru_layer_norm: Optional[bool] = GRU_LAYER_NORM_OPTION,
    gru_orthogonal: Optional[bool] = GRU_ORTHOGONAL_OPTION,
    gru_update_bias: Optional[float] = GRU_UPDATE_BIAS_OPTION,
    seed: Optional[int] = SEED_OPTION,
    curriculum: Optional[int] = CURRICULUM_OPTION,
    curriculum_start: Optional[int] = CURRICULUM_START_OPTION,
    curriculum_advance: Optional[float] = CURRICULUM_ADVANCE_OPTION,
    curriculum_mix: Optional[float] = CURRICULUM_MIX_OPTION,
    layout: Optional[Layout] = LAYOUT_OPTION,
    encoding: Optional[Encoding] = ENCODING_OPTION,
    hidden_cnn: Optional[int] = HIDDEN_CNN_OPTION,
    hidden_lin: Optional[int] = HIDDEN_LIN_OPTION,
    kernel_size: Optional[int] = KERNEL_SIZE_OPTION,
    cnn_dropout: Optional[float] = CNN_DROPOUT_OPTION,
    mlp_dropout: Optional[float] = MLP_DROPOUT_OPTION,
    act_epsilon: Optional[float] = ACT_EPSILON_OPTION,
    truncation_rule: Optional[str] = TRUNCATION_RULE_OPTION,
    lr_factor: Optional[float] = LR_FACTOR_OPTION,
    data_dir: Optional[Path] = DataDirOption,
    download: bool = DOWNLOAD_OPTION,
    config: Optional[Path] = CONFIG_OPTION,
    print_config: bool = PRINT_CONFIG_OPTION,
    out: Optional[Path] = OUT_OPTION,
    overwrite: bool = OVERWRITE_OPTION,
    device: str = DeviceOption,
    amp: Optional[bool] = AMP_OPTION,
    cuda_graphs: bool = CUDA_GRAPHS_OPTION,
    resume: Optional[str] = RESUME_OPTION,
    time_limit: Optional[str] = TimeLimitOption,
    init_from: Optional[str] = INIT_FROM_OPTION,
    tensorboard: bool = TENSORBOARD_OPTION,
    name: Optional[str] = NAME_OPTION,
    tag: Optional[List[str]] = TAG_OPTION,
    note: Optional[str] = NOTE_OPTION,
    deterministic: bool = DETERMINISTIC_OPTION,
    progress: Optional[bool] = PROGRESS_OPTION,
    quiet: bool = QuietOption,
    fmt: TrainFormat = FORMAT_OPTION,
) -> None:
    """Train PonderNet (or ACT, or a one-step network) on MNIST or parity; writes best.pt and last.pt under --out.

    Less common settings (--grad-clip, --lr-patience, --val-size, --truncation, --amp, ...) are
    options too, left out of this list; every setting can be kept in a --config file.
    """
    given = {name: value.value if isinstance(value, Enum) else value for name, value in locals().items()
             if name in PonderConfig.field_names() and value is not None}
    _refuse_bad_values(given)  # before torch loads: a typo costs no start-up
    labels = Labels(name, tuple(tag or ()), note)
    from ..api import TrainOptions, train_run

    options = TrainOptions(resume=resume, out=out, data_dir=data_dir, download=download, device=device, amp=amp,
                           progress=bars(quiet, progress), overwrite=overwrite, tensorboard=tensorboard,
                           config_file=config, deterministic=deterministic, cuda_graphs=cuda_graphs, labels=labels,
                           init_from=init_from, time_limit=time_limit)
    if print_config:
        _print_config(given, options, fmt)
        return
    report = train_run(given, options, log=chatter(quiet), records=json_line if fmt == TrainFormat.jsonl else None)
    if report is not None:  # None: a torchrun process other than rank 0, which reports nothing
        render_and_plot(report, fmt, None, quiet)


def _refuse_bad_values(given: dict) -> None:
    """Each value given, checked alone as its setting's field checks it (--epochs 0, --lambda-p 2),
    before the library (and torch) loads; what the pieces make of them together is checked when
    the configuration is built. A value spelled as text for a number (--halting-bias prior) is
    the config's to read."""
    problems = [problem for key, value in given.items() if not (isinstance(value, str) and TYPES[key] is not str)
                for problem in problems_of(key, value)]
    if problems:
        raise BadValue("; ".join(problems))


def _print_config(given: dict, options, fmt: TrainFormat) -> None:
    """--print-config: the resolved settings as a config file (TOML; JSON with -f json: a table
    or CSV has no shape for a config), with where each value came from."""
    from ..api import training_config

    cfg, sources = training_config(given, options)
    if fmt == TrainFormat.jsonl:  # the same object, on one line
        json_line(json.loads(render_config(cfg, sources, "json")))
    else:
        sys.stdout.write(render_config(cfg, sources, "json" if fmt == TrainFormat.json else "toml"))
