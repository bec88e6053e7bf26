"""`ponder train`."""

from __future__ import annotations

import inspect
import json
import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer

from ..cli_options import (DataDirOption, DeviceOption, QuietOption, TimeLimitOption, TrainCommand, checkpoint_forms,
                           complete_checkpoint, complete_checkpoints, complete_piece, path_option, piece_choice)
from .. import BadValue
from ..config import PLACES, TYPES, implied_by_pieces, problems_of, spelled
from ..folders import Labels
from ..registry import PIECES
from ..render import TrainFormat, json_line, value_text
from .app import app, bars, chatter, render_and_plot

def with_settings(command):
    """`command(**settings, ...)` taking, before its own options, an option for every setting, made
    from its declaration (config.setting): None unless given, so that a resumed run can tell what
    the user set; its default and what pieces imply instead in its help (`[default: 20; align: 12;
    plain: 1]`); a table's values as choices (the pieces: the registry's, when the command runs), a
    switch for a bool."""
    parameters = []
    for key, (_, field) in sorted(PLACES.items(), key=lambda item: item[0] not in PIECES):  # the pieces first
        meta, kind = field.metadata, TYPES[key]
        flag = "--" + key.replace("_", "-")
        default = value_text(field.default) if meta["default_text"] is None else meta["default_text"]
        default += "".join(f"; {piece}: {value_text(value)}" for piece, value in implied_by_pieces(key))
        options = dict(help=f"{meta['help']} [default: {default}]", show_default=False, hidden=meta["hidden"],
                       metavar=meta["metavar"])
        if key in PIECES:
            options.update(metavar=f"<{'|'.join(PIECES[key])}>", callback=piece_choice(key),
                           autocompletion=complete_piece(key))
        elif not isinstance(meta["rule"], str):  # a table: its values, in any case
            kind = Enum(key, {value: value for value in meta["rule"]}, type=str)
            options.update(case_sensitive=False, metavar=meta["metavar"] or f"<{'|'.join(meta['rule'])}>")
        if kind is bool:
            flag = f"{flag}/--no-{flag[2:]}"
        kind = str if meta["text"] or key in PIECES else kind
        parameters.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[kind],
                                            default=typer.Option(None, flag, **options)))
    own = [p for p in inspect.signature(command).parameters.values() if p.kind is not p.VAR_KEYWORD]
    command.__signature__ = inspect.Signature([*parameters, *own])
    return command


@app.command(cls=TrainCommand)
@with_settings
def train(
    *,
    data_dir: Optional[Path] = DataDirOption,
    download: bool = typer.Option(True, "--download/--no-download", hidden=True),
    config: Optional[Path] = typer.Option(None, "--config", "-c", metavar="FILE", show_default=False, help=(
        "Settings from a TOML or JSON file (a run folder's config.toml re-runs that run); options given here "
        "override it. Every setting is a key there: docs/configuration.md.")),
    print_config: bool = typer.Option(False, "--print-config", help=(
        "Print the settings this command would train with, each with where its value comes from, as a --config "
        "file (-f json: JSON), and exit.")),
    out: Optional[Path] = path_option("--out", show_default=False, help=(
        "Folder for best.pt and last.pt. [default: a new runs/METHOD-STEP-seedSEED, or the resumed run's folder]")),
    overwrite: bool = typer.Option(False, "--overwrite", hidden=True, help=(
        "Replace the files of another run in --out (checkpoints, config.json, metrics.csv, ...): without it such a "
        "folder is refused.")),
    device: str = DeviceOption,
    amp: Optional[bool] = typer.Option(None, "--amp/--no-amp", hidden=True),
    cuda_graphs: bool = typer.Option(True, "--cuda-graphs/--no-cuda-graphs", hidden=True),
    resume: Optional[str] = typer.Option(
        None, "--resume", metavar="CHECKPOINT",  # a shipped model is no run to continue
        autocompletion=lambda incomplete: complete_checkpoints(incomplete, shipped=False),
        help="Continue the run saved in this checkpoint: a file (e.g. runs/pondernet-mlp-seed1234/last.pt), a run "
             "folder (its last.pt) or latest (the newest run under runs/)."),
    time_limit: Optional[str] = TimeLimitOption,
    init_from: Optional[str] = typer.Option(
        None, "--init-from", metavar="CHECKPOINT", autocompletion=lambda incomplete: complete_checkpoint(incomplete),
        help=f"Start a new run from the weights of {checkpoint_forms()}, with its settings but those given: new ones "
             "where the model keeps its shapes (--lr, --epochs, --beta, ...)."),
    init_weights: Optional[str] = typer.Option(None, "--init-weights", metavar="EPOCH:DIGEST", hidden=True, help=(
        "With --init-from: start only from these very weights (its epoch and their digest, as a run's reproduce "
        "line gives them), refused if it holds others.")),
    tensorboard: bool = typer.Option(False, "--tensorboard", hidden=True, help=(
        "Also write TensorBoard event files into the run folder: every epoch's figures and the halting-step "
        "histogram (needs tensorboard: pip install tensorboard); view with tensorboard --logdir runs.")),
    name: Optional[str] = typer.Option(None, "--name", metavar="TEXT", hidden=True, help=(
        "A name for the run, which `ponder runs` shows and --where name=... finds (the folder keeps its own).")),
    tag: Optional[List[str]] = typer.Option(None, "--tag", metavar="TAG", hidden=True, help=(
        "A tag for the run (one word; repeat it for several): `ponder runs --where tag=TAG` finds them.")),
    note: Optional[str] = typer.Option(None, "--note", metavar="TEXT", hidden=True, help=(
        "A line about the run, which `ponder info` and `ponder runs` show. None of these three changes training: "
        "resuming keeps them or takes new ones.")),
    deterministic: bool = typer.Option(False, "--deterministic", hidden=True, help=(
        "Only deterministic kernels (torch.use_deterministic_algorithms): the same seed on the same machine gives "
        "the same weights, on CUDA too; slower there.")),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", hidden=True),
    quiet: bool = QuietOption,
    fmt: TrainFormat = typer.Option(TrainFormat.table, "--format", "-f", case_sensitive=False, help=(
        "Output format. jsonl: one JSON object per line on stdout, each epoch's as it ends, then the report's "
        "(progress stays on stderr).")),
    **settings,
) -> None:
    """Train PonderNet (or ACT, or a one-step network) on MNIST or parity; writes best.pt and last.pt under --out.

    Less common settings (--hidden, --tau, --grad-clip, --truncation, ...) and options (--overwrite,
    --name, --note, --amp, ...) are left out of this list, all in docs/configuration.md; every
    setting can be kept in a --config file.
    """
    given = {key: value.value if isinstance(value, Enum) else value for key, value in settings.items()
             if value is not None}
    # Each value given, checked alone as its setting's field checks it (--epochs 0, --lambda-p 2),
    # before torch loads: a typo costs no start-up. What the pieces make of them together is checked
    # when the configuration is built; a value spelled as text for a number (--halting-bias prior)
    # is the config's to read.
    problems = [problem for key, value in given.items() if not (isinstance(value, str) and TYPES[key] is not str)
                for problem in problems_of(key, value, spelled(key, dashes="--"))]  # named as typed
    if problems:
        raise BadValue("; ".join(problems))
    from ..api import TrainOptions, train_run

    options = TrainOptions(resume=resume, out=out, data_dir=data_dir, download=download, device=device, amp=amp,
                           progress=bars(quiet, progress), overwrite=overwrite, tensorboard=tensorboard,
                           config_file=config, deterministic=deterministic, cuda_graphs=cuda_graphs,
                           labels=Labels(name, tuple(tag or ()), note), init_from=init_from,
                           init_weights=init_weights, time_limit=time_limit)
    if print_config:  # the resolved settings as a config file, with where each value came from: TOML, or
        from ..api import training_config  # JSON with -f json (a table or CSV has no shape for a config)
        from ..runs import render_run_config

        text = render_run_config(*training_config(given, options), "toml" if fmt in (TrainFormat.table, TrainFormat.csv)
                                 else "json")
        if fmt == TrainFormat.jsonl:  # the same object, on one line
            json_line(json.loads(text))
        else:
            sys.stdout.write(text)
        return
    report = train_run(given, options, log=chatter(quiet), records=json_line if fmt == TrainFormat.jsonl else None)
    if report is not None:  # None: a torchrun process other than rank 0, which reports nothing
        render_and_plot(report, fmt, None, quiet)
