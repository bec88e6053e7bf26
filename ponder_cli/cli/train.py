"""`ponder train`."""

from __future__ import annotations

import inspect
import json
import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer

from ..cli_options import (
    DataDirOption,
    DeviceOption,
    TimeLimitOption,
    QuietOption,
    TrainCommand,
    checkpoint_forms,
    complete_checkpoint,
    complete_resumable,
    complete_piece,
    path_option,
    piece_choice,
    piece_metavar,
)
from .. import BadValue
from ..config import PLACES, TYPES, implied_by_pieces, problems_of
from ..folders import Labels
from ..registry import PIECES
from ..render import TrainFormat, json_line, value_text
from .app import app, bars, chatter, render_and_plot

# train -----------------------------------------------------------------------------------------

def setting_parameters() -> list[inspect.Parameter]:
    """An option of `ponder train` for every setting, made from its declaration (config.setting):
    None unless given, so that a resumed run can tell what the user set; its default and what
    pieces imply instead in its help (`[default: 20; align: 12; plain: 1]`); a table's values as
    choices (the pieces: the registry's, when the command runs), a switch for a bool."""
    parameters = []
    for key, (_, field) in sorted(PLACES.items(), key=lambda item: item[0] not in PIECES):  # the pieces first
        meta, kind = field.metadata, TYPES[key]
        flag = "--" + key.replace("_", "-")
        default = value_text(field.default) if meta["default_text"] is None else meta["default_text"]
        default += "".join(f"; {piece}: {value_text(value)}" for piece, value in implied_by_pieces(key))
        options = dict(help=f"{meta['help']} [default: {default}]", show_default=False, hidden=meta["hidden"],
                       metavar=meta["metavar"])
        if key in PIECES:
            options.update(metavar=piece_metavar(key), callback=piece_choice(key),
                           autocompletion=complete_piece(key))
        elif not isinstance(meta["rule"], str):  # a table: its values, in any case
            kind = Enum(key, {value: value for value in meta["rule"]}, type=str)
            options.update(case_sensitive=False, metavar=meta["metavar"] or f"<{'|'.join(meta['rule'])}>")
        if kind is bool:
            flag = f"{flag}/--no-{flag[2:]}"
        kind = str if meta["text"] or key in PIECES else kind
        parameters.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[kind],
                                            default=typer.Option(None, flag, **options)))
    return parameters


def with_settings(command):
    """`command(**settings, ...)` taking every setting as an option (setting_parameters), its own
    options after them."""
    own = [parameter for parameter in inspect.signature(command).parameters.values()
           if parameter.kind is not inspect.Parameter.VAR_KEYWORD]
    command.__signature__ = inspect.Signature([*setting_parameters(), *own])
    return command


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
OVERWRITE_OPTION = typer.Option(False, "--overwrite", hidden=True, help="Replace the files of another run in --out "
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
                                help=f"Start a new run from the weights of {checkpoint_forms()}, with its "
                                     "settings but those given: new ones where the model keeps its shapes (--lr, "
                                     "--epochs, --beta, ...).")
INIT_WEIGHTS_OPTION = typer.Option(None, "--init-weights", metavar="EPOCH:DIGEST", hidden=True,
                                   help="With --init-from: start only from these very weights (its epoch and their "
                                        "digest, as a run's reproduce line gives them), refused if it holds others.")
TENSORBOARD_OPTION = typer.Option(False, "--tensorboard", hidden=True, help="Also write TensorBoard event files into the run "
                                  "folder: every epoch's figures and the halting-step histogram (needs "
                                  "tensorboard: pip install tensorboard); view with tensorboard --logdir runs.")
DETERMINISTIC_OPTION = typer.Option(False, "--deterministic", hidden=True, help="Only deterministic kernels "
                                    "(torch.use_deterministic_algorithms): the same seed on the same machine gives "
                                    "the same weights, on CUDA too; slower there.")
NAME_OPTION = typer.Option(None, "--name", metavar="TEXT", hidden=True, help="A name for the run, which `ponder runs` shows and "
                           "--where name=... finds (the folder keeps its own).")
TAG_OPTION = typer.Option(None, "--tag", metavar="TAG", hidden=True, help="A tag for the run (one word; repeat it for several): "
                          "`ponder runs --where tag=TAG` finds them.")
NOTE_OPTION = typer.Option(None, "--note", metavar="TEXT", hidden=True, help="A line about the run, which `ponder info` and "
                           "`ponder runs` show. None of these three changes training: resuming keeps them or takes "
                           "new ones.")
PROGRESS_OPTION = typer.Option(None, "--progress/--no-progress", hidden=True)
FORMAT_OPTION = typer.Option(TrainFormat.table, "--format", "-f", case_sensitive=False,
                             help="Output format. jsonl: one JSON object per line on stdout, each epoch's as it "
                                  "ends, then the report's (progress stays on stderr).")


@app.command(cls=TrainCommand)
@with_settings
def train(
    *,
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
    init_weights: Optional[str] = INIT_WEIGHTS_OPTION,
    tensorboard: bool = TENSORBOARD_OPTION,
    name: Optional[str] = NAME_OPTION,
    tag: Optional[List[str]] = TAG_OPTION,
    note: Optional[str] = NOTE_OPTION,
    deterministic: bool = DETERMINISTIC_OPTION,
    progress: Optional[bool] = PROGRESS_OPTION,
    quiet: bool = QuietOption,
    fmt: TrainFormat = FORMAT_OPTION,
    **settings,
) -> None:
    """Train PonderNet (or ACT, or a one-step network) on MNIST or parity; writes best.pt and last.pt under --out.

    Less common settings (--hidden, --tau, --grad-clip, --truncation, ...) and options (--overwrite,
    --name, --note, --amp, ...) are left out of this list, all in docs/configuration.md; every
    setting can be kept in a --config file.
    """
    given = {key: value.value if isinstance(value, Enum) else value for key, value in settings.items()
             if value is not None}
    _refuse_bad_values(given)  # before torch loads: a typo costs no start-up
    labels = Labels(name, tuple(tag or ()), note)
    from ..api import TrainOptions, train_run

    options = TrainOptions(resume=resume, out=out, data_dir=data_dir, download=download, device=device, amp=amp,
                           progress=bars(quiet, progress), overwrite=overwrite, tensorboard=tensorboard,
                           config_file=config, deterministic=deterministic, cuda_graphs=cuda_graphs, labels=labels,
                           init_from=init_from, init_weights=init_weights, time_limit=time_limit)
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
    from ..runs import render_run_config

    cfg, sources, record = training_config(given, options)
    if fmt == TrainFormat.jsonl:  # the same object, on one line
        json_line(json.loads(render_run_config(cfg, sources, record, "json")))
    else:
        sys.stdout.write(render_run_config(cfg, sources, record, "json" if fmt == TrainFormat.json else "toml"))
