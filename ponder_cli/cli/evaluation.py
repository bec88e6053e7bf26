"""`ponder eval`, `extrapolate`, `sweep`, `compare` and `calibrate`, then `predict`, `info`, `models`
and `runs`: every command but `train`, in the order `ponder --help` lists them."""

from __future__ import annotations

import inspect
import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from .. import BadValue
from ..cli_options import (AmpOption, DataDirOption, DeviceOption, DownloadOption, FormatOption, ListsCommand,
                           QuietOption, checkpoint_argument, checkpoint_forms, complete_checkpoint, complete_rule,
                           complete_run, complete_run_key, path_option)
from ..folders import DEFAULT, LATEST, RUNS_DIR, names_checkpoint
from ..registry import EVAL_ANGLES, EXTRAPOLATION_ANGLES, PROTOCOLS, parse_exit_rule, parse_halting_rule, rule_choices
from ..render import OutputFormat, value_text
from .app import app, bars, chatter, render_and_plot

RUN_FILES = "last.pt, else its best.pt"  # what info and diff read of a run folder

Protocol = Enum("Protocol", {value: value for value in PROTOCOLS}, type=str)


def _rule(parse):
    """A --halting or --rules value as spelled (quantile:0.9), checked before any work."""
    def check(value):
        try:
            return None if value is None else parse(value).spelling
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    return check


HALTING_HELP = (f"{rule_choices()}. sample: Bernoulli(λ_n) coin per step (paper); median: first step where the "
                "cumulative halting probability reaches 0.5; quantile:Q: where it reaches Q (median = quantile:0.5); "
                "patience:K: first step whose predicted class is also that of the K steps before it; confidence:C: "
                "first step whose top class probability reaches C; threshold:T: first step whose λ_n reaches T (a "
                "head trained by --halting-target final or correct); fixed:N: every input stops at step N (a fixed "
                "budget, the control; any method); expected: p-weighted average of all steps' outputs, steps = "
                "Σ n·p_n. Default: sample; ACT halts by its own rule and refuses every other but fixed:N. See ponder "
                "calibrate.")

# the options the model-running commands share, each with its type: @options picks a command's
SHARED = {
    "protocol": (Optional[Protocol], typer.Option(None, "--protocol", case_sensitive=False, show_default=False, help=(
        "How MNIST test images are rotated: uniform (the default): within ±angle (reference); band: |rotation| "
        "between the previous angle and this one; fixed: exactly ±angle. Parity checkpoints refuse it."))),
    "halting": (Optional[str], typer.Option(None, "--halting", metavar="RULE", callback=_rule(parse_halting_rule),
                                            autocompletion=lambda incomplete: complete_rule()(incomplete),
                                            help=HALTING_HELP)),
    "max_steps": (Optional[int], typer.Option(None, "--max-steps", metavar="N", show_default=False, help=(
        "Run up to N steps, whatever the checkpoint trained with (1 to 100; more than it trained with too): the "
        "halting forced at step N, as at training's last step. A one-step model (plain) refuses it. [default: the "
        "checkpoint's]"))),
    "detail": (bool, typer.Option(False, "--detail", help=(
        "Also show, per halting step, how many images halted there and the accuracy if every image stopped there "
        "(runs all steps)."))),
    "plot": (Optional[Path], path_option("--plot", help=(
        "Write a figure (PNG, or another format matplotlib knows by the file's extension) of accuracy and ponder "
        "steps against angle and the halting-step distributions (needs matplotlib: pip install matplotlib)."))),
    "seed": (Optional[int], typer.Option(None, "--seed", help=(
        "Seed of the test rotations and halting coin flips, drawn per input (MNIST: --limit N evaluates the first N "
        "images exactly as the full evaluation does). [default: the checkpoint's training seed]"))),
    "repeats": (int, typer.Option(1, "--repeats", min=1, help=(
        "Independent draws of rotations and halting coins (seeds seed, seed+1, ...): means and 95% intervals per "
        "bucket."))),
    "limit": (int, typer.Option(0, "--limit", min=0, help=(
        "Evaluate only the first N test images (0: all); parity: N vectors per non-zero count (0: 256)."))),
    "batch_size": (int, typer.Option(1000, "--batch-size", min=1, help="Images per evaluation batch.")),
    "data_dir": (Optional[Path], DataDirOption),
    "download": (bool, DownloadOption),
    "device": (str, DeviceOption),
    "amp": (Optional[bool], AmpOption),
    "quiet": (bool, QuietOption),
    "fmt": (OutputFormat, FormatOption),
}
EVALUATION = tuple(SHARED)


def options(*names: str):
    """`command(own..., **shared)` taking, after its own parameters, the options `names` in that
    order: each the command's own where it declares one of that name, else SHARED's."""
    def decorate(command):
        own = {p.name: p for p in inspect.signature(command).parameters.values() if p.kind is not p.VAR_KEYWORD}
        keyword = inspect.Parameter.KEYWORD_ONLY
        command.__signature__ = inspect.Signature(
            [p for name, p in own.items() if name not in names] +
            [own[name].replace(kind=keyword) if name in own else
             inspect.Parameter(name, keyword, default=SHARED[name][1], annotation=SHARED[name][0]) for name in names])
        return command
    return decorate


def angles_option(default: list, what: str):
    return typer.Option(None, "--angles", metavar="DEG...", show_default=False, help=(
        f"{what} Several values after one flag: --angles 22.5 45; checkpoints may come before or after the list. "
        f"MNIST checkpoints only. [default: {' '.join(map(value_text, default))}]"))


def counts_option(default: str):
    return typer.Option(None, "--counts", metavar="LO-HI...", show_default=False, help=(
        f"Parity checkpoints: one bucket per range of non-zero counts, e.g. --counts 1-16 17-32 (a single count: 5). "
        f"[default: {default}]"))


def buckets_option(default: str):
    return typer.Option(None, "--buckets", metavar="SPEC...", show_default=False, help=(
        f"One bucket per spec, in the terms of the checkpoint's task (MNIST: angles, as --angles; parity: count "
        f"ranges, as --counts; another task: its own). Several values after one flag when they are numbers or "
        f"ranges LO-HI. [default: {default}]"))


def _run(call, options: dict, *args, **kwargs) -> None:
    """Check --plot's destination before any work, then render
    `call(*args, EvalOptions, **kwargs, log=, progress=)`."""
    from ..api import EvalOptions
    from ..plot import check_destination

    fmt, quiet, plot, protocol = (options.pop(key, None) for key in ("fmt", "quiet", "plot", "protocol"))
    plot = check_destination(plot) if plot is not None else None
    report = call(*args, EvalOptions(protocol=getattr(protocol, "value", protocol), **options), **kwargs,
                  log=chatter(quiet), progress=bars(quiet))
    render_and_plot(report, fmt, plot, quiet)


def _buckets(angles=None, counts=None, buckets=None, rotation=None) -> dict:
    """The bucket options as the user spelled them (None: not given), for the task to read."""
    if rotation is not None and angles is not None:
        raise BadValue(f"--rotation and --angles are alternatives: give one (--rotation {rotation:g} is "
                       f"--angles {rotation:g})")
    return {"--angles": angles, "--counts": counts, "--buckets": buckets,
            "--rotation": None if rotation is None else [str(rotation)]}


@app.command("eval", cls=ListsCommand)
@options(*EVALUATION)
def eval_command(
    checkpoint: Optional[str] = checkpoint_argument(),
    angles: Optional[List[str]] = angles_option(EVAL_ANGLES, "Rotate test images within ±angle; one bucket per angle."),
    counts: Optional[List[str]] = counts_option("the training range in four"),
    buckets: Optional[List[str]] = buckets_option("the task's: MNIST 0, parity the training range in four"),
    rotation: Optional[float] = typer.Option(None, "--rotation", metavar="DEG",
                                             help="The same as --angles with one angle (give one or the other)."),
    **options,
) -> None:
    """Accuracy, ponder steps and loss on the test set (MNIST: rotated images; parity: fixed vectors)."""
    from ..api import evaluate_checkpoint

    _run(evaluate_checkpoint, options, "eval", checkpoint, _buckets(angles, counts, buckets, rotation))


@app.command(cls=ListsCommand)
@options(*EVALUATION)
def extrapolate(
    checkpoint: Optional[str] = checkpoint_argument(),
    angles: Optional[List[str]] = angles_option(EXTRAPOLATION_ANGLES, "Rotation buckets in degrees (see --protocol)."),
    counts: Optional[List[str]] = counts_option("the counts beyond the training range in four; all counts in four "
                                                "when training saw every count"),
    buckets: Optional[List[str]] = buckets_option("the task's beyond its training: MNIST as --angles, parity as "
                                                  "--counts"),
    **options,
) -> None:
    """Accuracy and ponder steps beyond training: MNIST rotated within ±angle, parity's unseen non-zero counts."""
    from ..api import evaluate_checkpoint

    _run(evaluate_checkpoint, options, "extrapolate", checkpoint, _buckets(angles, counts, buckets))


@app.command()
@options("halting", "max_steps", "plot", "seed", "repeats", "limit", "batch_size", "data_dir", "download", "device",
         "amp", "fmt", "quiet")
def sweep(
    checkpoint: Optional[str] = checkpoint_argument(),
    start: Optional[float] = typer.Option(None, "--from", show_default=False, help=(
        "First angle, degrees (parity: first non-zero count). [default: 0; parity: 1]")),
    stop: Optional[float] = typer.Option(None, "--to", show_default=False, help=(
        "Last angle, degrees (parity: last count). [default: 180; parity: the vector's elements]")),
    every: Optional[float] = typer.Option(None, "--every", show_default=False, help=(
        "Degrees (parity: counts) between buckets. [default: 5; parity: 1]")),
    **options,
) -> None:
    """Mental rotation: steps and accuracy at exact angles --from..--to every --every degrees, and the
    least-squares slope of steps per 10°; parity: at each exact non-zero count, steps per count."""
    from ..api import sweep_checkpoint

    _run(sweep_checkpoint, {**options, "protocol": "fixed"}, checkpoint, start, stop, every)


@app.command(cls=ListsCommand)
@options(*EVALUATION)
def compare(
    checkpoints: List[str] = checkpoint_argument(
        f"Checkpoints to compare, each as eval's CHECKPOINT ({checkpoint_forms()}): one or more per method; "
        "several of one method (e.g. other seeds) give mean ± sd.", ...),
    angles: Optional[List[str]] = angles_option(EXTRAPOLATION_ANGLES, "Rotation buckets in degrees."),
    counts: Optional[List[str]] = counts_option("every count in four"),
    buckets: Optional[List[str]] = buckets_option("the task's: MNIST as --angles, parity as --counts"),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", metavar="N", show_default=False, help=(
        "Run every checkpoint that runs several steps up to N steps, whatever it trained with (1 to 100): the "
        "halting forced at step N. A one-step model (plain) keeps its one. [default: each checkpoint's]")),
    detail: bool = typer.Option(False, "--detail", help=(
        "Also show the Controls table: each row's shuffled-halting null, adapting minus it, and its premature and "
        "late halts (JSON and CSV hold them always).")),
    seed: Optional[int] = typer.Option(None, "--seed", help=(
        "Seed of the test rotations and halting coin flips, the same for every checkpoint, so all see the same "
        "images. [default: the checkpoints' training seed if they share one, else 1234]")),
    **options,
) -> None:
    """Methods side by side on the same buckets (rotations or non-zero counts): accuracy and ponder steps, mean ± sd
    over seeds."""
    from ..api import compare_checkpoints

    def call(eval_options, **how):
        report = compare_checkpoints(checkpoints, _buckets(angles, counts, buckets), eval_options, **how)
        if not detail:
            report.controls = None
        return report
    _run(call, {**options, "max_steps": max_steps, "seed": seed})


@app.command(cls=ListsCommand)
@options("protocol", "max_steps", "seed", "repeats", "limit", "batch_size", "data_dir", "download", "device", "amp",
         "quiet", "fmt")
def calibrate(
    checkpoint: Optional[str] = checkpoint_argument(),
    tolerance: Optional[float] = typer.Option(None, "--tolerance", show_default=False, help=(
        "Choose the cheapest rule whose predicted class agrees with the last step's on at least 1 - this share of "
        "the validation inputs (a one-sided 95% bound). [default: 0.005]")),
    angles: Optional[List[str]] = angles_option(["the training rotation"], "Rotate the validation images within "
                                                "±angle (see --protocol); one bucket per angle, pooled."),
    counts: Optional[List[str]] = counts_option("the training range"),
    buckets: Optional[List[str]] = buckets_option("the task's training inputs"),
    max_loss: Optional[float] = typer.Option(None, "--max-loss", metavar="E", show_default=False, help=(
        "With --risk: choose the cheapest rule whose loss (the share of inputs whose class differs from the last "
        "step's) has an exact upper 1 - D confidence bound of at most E, by fixed-sequence testing from the most "
        "steps down (instead of --tolerance).")),
    risk: Optional[float] = typer.Option(None, "--risk", metavar="D", show_default=False, help=(
        "With --max-loss: the chance D (e.g. 0.1) that the chosen rule's loss on inputs drawn as the calibration "
        "inputs were exceeds E.")),
    save: bool = typer.Option(False, "--save", help=(
        "Write the chosen rule into the run folder (halting.json): eval, extrapolate and sweep then halt by it "
        "unless --halting says otherwise.")),
    rules: Optional[List[str]] = typer.Option(
        None, "--rules", metavar="RULE...", show_default=False, autocompletion=complete_rule(True),
        # each checked as one that halts at one step, before any work
        callback=lambda values: None if values is None else [_rule(parse_exit_rule)(value) for value in values],
        help="The candidate exit rules, spelled as --halting takes them (fixed budgets fixed:N too). Several values "
             "after one flag: --rules quantile:0.9 confidence:0.995. [default: quantile:0.5 to 0.99, patience:1 to "
             "4, confidence:0.5 to 0.999; a head trained with --halting-target final|correct: threshold:0.5 to "
             "0.9999 in place of the quantiles]"),
    limit: int = typer.Option(0, "--limit", min=0, help=(
        "Only the first N validation images (0: all); parity: N vectors per non-zero count (0: 256).")),
    **options,
) -> None:
    """Choose an exit rule on held-out data: quantile:Q, patience:K and confidence:C rules on the validation set
    (not the test set), and the cheapest that agrees with the last step; paste it into --halting, or --save it."""
    from ..api import calibrate_checkpoint

    if tolerance is not None and (risk is not None or max_loss is not None):
        raise BadValue("--tolerance and --max-loss with --risk choose a rule each their own way: give one")
    _run(calibrate_checkpoint, {**options, "limit": limit}, checkpoint, _buckets(angles, counts, buckets),
         tolerance=0.005 if tolerance is None else tolerance, rules=rules, max_loss=max_loss, risk=risk, save=save)


# predict, info, models, runs ---------------------------------------------------------------------


@app.command()
@options("halting", "max_steps", "seed", "steps", "invert", "rotate", "plot", "device", "quiet", "fmt")
def predict(
    checkpoint: str = checkpoint_argument(f"{checkpoint_forms().capitalize()}.", ...),
    inputs: Optional[List[Path]] = typer.Argument(None, metavar="INPUT...", show_default=False, help=(
        "MNIST models: image files (PNG, JPEG, ...: any size and mode) or .npy arrays of shape (N, 28, 28); parity "
        "models: .npy arrays (N, ELEMS) or text files of one vector per line (entries -1, 0, 1); - reads such lines "
        "from standard input.")),
    seed: Optional[int] = typer.Option(None, "--seed", help=(
        "Seed of the halting coin flips (--halting sample). [default: the checkpoint's training seed]")),
    steps: bool = typer.Option(False, "--steps", help=(
        "Also show every step: its top class and probability, λ_n, p_n and the step function's own figures (align: "
        "the accumulated turn).")),
    invert: Optional[bool] = typer.Option(None, "--invert/--no-invert", show_default=False, help=(
        "Images: dark digits on a light background, to be inverted. [default: detected per image, from its "
        "border]")),
    rotate: Optional[float] = typer.Option(None, "--rotate", metavar="DEG", help=(
        "Images: rotate every input counter-clockwise by DEG degrees first, as evaluation rotates.")),
    plot: Optional[Path] = path_option("--plot", help=(
        "Write a strip per input: what the model sees at each step (align: the re-read view), the step's class and "
        "probability and λ_n, the halting step framed (needs matplotlib).")),
    **options,
) -> None:
    """A model on your own inputs: the prediction, its probability and the halting step per input."""
    if not inputs:  # one argument: a checkpoint without its inputs, or an input taken for the checkpoint
        if names_checkpoint(checkpoint):
            raise BadValue(f"predict takes a CHECKPOINT first, then the INPUT files: no input followed {checkpoint}; "
                           f"e.g. `ponder predict {checkpoint} INPUT...` (image files, .npy arrays or text files of "
                           f"vectors; - reads standard input)")
        raise BadValue(f"predict takes a CHECKPOINT first, then the INPUT files: {checkpoint} was read as the "
                       f"checkpoint and no input followed; e.g. `ponder predict {DEFAULT} {checkpoint}` (the "
                       f"shipped model; `ponder models` lists them)")
    from ..api import PredictOptions, predict_inputs
    from ..plot import check_destination

    fmt, quiet = options.pop("fmt"), options.pop("quiet")
    plot = check_destination(plot) if plot is not None else None
    predict_options = PredictOptions(seed=seed, invert=invert, rotate=rotate, steps=steps, views=plot is not None,
                                     **options)
    render_and_plot(predict_inputs(checkpoint, inputs, predict_options, log=chatter(quiet)), fmt, plot, quiet)


@app.command()
def info(
    checkpoint: Optional[str] = typer.Argument(
        None, metavar="CHECKPOINT|RUN_DIR", show_default=False, autocompletion=complete_checkpoint,
        help=f"{checkpoint_forms(RUN_FILES).capitalize()}. [default: {DEFAULT}]"),
    plot: Optional[Path] = path_option("--plot", help=(
        "Write the learning curves: loss, accuracy and ponder steps per epoch (needs matplotlib).")),
    quiet: bool = QuietOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """What a checkpoint or run holds: task, method, step, configuration, epochs, the best epoch and the history."""
    from ..listing import run_info  # read without torch, as the other listings
    from ..plot import check_destination

    plot = check_destination(plot) if plot is not None else None
    render_and_plot(run_info(checkpoint, log=chatter(quiet)), fmt, plot, quiet)


@app.command()
def models(quiet: bool = QuietOption, fmt: OutputFormat = FormatOption) -> None:
    """The models shipped inside the package, by name: task, what each is, its validation figures."""
    from ..listing import shipped_models

    render_and_plot(shipped_models(log=chatter(quiet)), fmt, None, quiet)


class RunsGroup(TyperGroup):
    """`ponder runs [FOLDER...]` lists runs and `ponder runs rm RUN...` removes them: a word after
    `runs` that is no subcommand of it begins the listing's arguments."""

    def parse_args(self, ctx, args):
        if not args or args[0] not in self.commands:
            args = [LIST, *args]
        return super().parse_args(ctx, args)


class ListingCommand(TyperCommand):
    def format_usage(self, ctx, formatter):  # the listing is `ponder runs`, its hidden name unsaid
        formatter.write_usage("ponder runs", "[OPTIONS] [FOLDER]...")


LIST = "list"
runs_app = typer.Typer(cls=RunsGroup, add_completion=False, rich_markup_mode=None)
app.add_typer(runs_app, name="runs", help="Your training runs, listed (ponder runs [FOLDER]...), labelled (ponder runs "
              "label), removed to the trash and restored (ponder runs rm).")


@runs_app.command(LIST, cls=ListingCommand, hidden=True)
def runs(
    folders: Optional[List[Path]] = typer.Argument(None, metavar="FOLDER", show_default=False, help=(
        f"Folders of runs (every run folder below, at any depth), or run folders. [default: the current folder: "
        f"{RUNS_DIR}/ and any --out folder here]")),
    where: Optional[List[str]] = typer.Option(None, "--where", metavar="EXPR", show_default=False,
                                              autocompletion=complete_run_key, help=(
        "Only the runs that meet it: KEY=VALUE, KEY!=VALUE, KEY>V, KEY<V, KEY>=V or KEY<=V, KEY a JSON key of the "
        "listing (best_val_accuracy, status, name, when), a setting (lambda_p, seed), started (when) or tag (one of "
        "the run's tags). Numbers compare as numbers, times as times (ISO, UTC unless zoned), text and tags only "
        "with = and !=; KEY=none: no value. Repeat it: all must hold.")),
    sort: Optional[str] = typer.Option(None, "--sort", metavar="KEY", show_default=False,
                                       autocompletion=complete_run_key, help=(
        "Order by KEY (as --where's): figures and times from the highest and newest, text from a to z; runs "
        "without it last. [default: oldest first, by when each started]")),
    reverse: bool = typer.Option(False, "--reverse", help="Turn --sort's order round."),
    quiet: bool = QuietOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """Your training runs: each run folder's name, task, method, step, status (finished, stopped early,
    time limit, interrupted, running, empty, damaged, unreadable), epochs, best epoch and validation
    accuracy, when it started, its tags and note, and the settings that differ between the runs listed;
    filtered with --where, ordered with --sort. `ponder runs rm RUN...` moves runs to the trash."""
    if reverse and sort is None:
        raise BadValue("--reverse turns --sort's order: give --sort KEY too")
    from ..listing import list_runs

    render_and_plot(list_runs(folders or [], where=where or [], sort=sort, reverse=reverse, log=chatter(quiet)), fmt,
                    None, quiet)


@runs_app.command("rm")
def runs_rm(
    runs: Optional[List[Path]] = typer.Argument(None, metavar="RUN", show_default=False, autocompletion=complete_run,
                                                help="Run folders (with --empty: folders whose trash to empty; "
                                                     f"default: {RUNS_DIR}/ and the current folder)."),
    restore: bool = typer.Option(False, "--restore", help=(
        "Bring the runs named (by the path each had) back from the trash, as they were.")),
    empty: bool = typer.Option(False, "--empty", help=(
        "Delete the runs in the trash of the folders named (their own .trash, not one below; no link followed): "
        "the one command that deletes a run. Lists them with their sizes and asks first.")),
    yes: bool = typer.Option(False, "--yes", "-y", help=(
        "With --empty: delete without asking (needed where no terminal can be asked: a script, a pipe).")),
    quiet: bool = QuietOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """Move runs to the trash (a .trash folder beside each), bring them back with --restore, delete them for good
    with --empty. A run being trained is refused, and so are links and what is in a trash already."""
    if restore and empty:
        raise BadValue("--restore brings runs back, --empty deletes them: give one")
    if yes and not empty:
        raise BadValue("--yes answers --empty's question: give it with --empty")
    from ..listing import remove_runs

    confirm = None if yes else ask_to_delete
    render_and_plot(remove_runs(runs or [], restore=restore, empty=empty, confirm=confirm, log=chatter(quiet)), fmt,
                    None, quiet)


@runs_app.command("label")
def runs_label(
    runs: Optional[List[Path]] = typer.Argument(None, metavar="RUN", show_default=False, autocompletion=complete_run,
                                                help=f"Run folders ({LATEST}: the newest run under {RUNS_DIR}/)."),
    name: Optional[str] = typer.Option(None, "--name", metavar="TEXT", help="A new name for the run."),
    tag: Optional[List[str]] = typer.Option(None, "--tag", metavar="TAG", show_default=False,
                                            help="A tag to add (one word; repeat it for several)."),
    untag: Optional[List[str]] = typer.Option(None, "--untag", metavar="TAG", show_default=False,
                                              help="A tag to take away (repeat it for several)."),
    note: Optional[str] = typer.Option(None, "--note", metavar="TEXT", help="A new note for the run."),
    quiet: bool = QuietOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """Change runs' labels after training: a new name or note, tags added (--tag) or taken away (--untag), kept in
    each run's config.json and checkpoints. A run being trained is refused."""
    from ..folders import Labels
    from ..runs import label_runs

    render_and_plot(label_runs(runs or [], Labels(name, tuple(tag or ()), note), tuple(untag or ()),
                               log=chatter(quiet)), fmt, None, quiet)


def on_a_terminal() -> bool:
    """Can the user be asked: stdin and stderr (where the question goes) both a terminal."""
    return sys.stdin is not None and sys.stdin.isatty() and sys.stderr.isatty()


def ask_to_delete(rows: list[dict]) -> bool:
    """`runs rm --empty`: what would be deleted, each with its size, on stderr, and the user's yes
    or no; refused in one line where nobody can be asked (no terminal) and --yes was not given."""
    from ..reports.runs import size_text

    what = f"{len(rows)} trashed run{'s' if len(rows) != 1 else ''} ({size_text(sum(row['bytes'] for row in rows))})"
    if not on_a_terminal():
        raise BadValue(f"--empty would delete {what} for good, and there is no terminal to ask: give --yes to "
                       f"delete them (`ponder runs rm --empty -f json --yes` lists what went)")
    for row in rows:
        typer.echo(f"  {row['run']}  {size_text(row['bytes'])}  (removed {row['removed'] or '?'}; {row['trash']})",
                   err=True)
    try:
        return typer.confirm(f"Delete these {what} for good?", default=False, err=True)
    except typer.Abort as exc:  # Ctrl-C, SIGTERM or the end of input at the question: an interrupt
        raise exc.__context__ if isinstance(exc.__context__, KeyboardInterrupt) else KeyboardInterrupt() from None


@app.command()
def diff(
    targets: List[str] = typer.Argument(..., metavar="RUN...", show_default=False, autocompletion=complete_checkpoint,
                                        help=f"Two or more runs, each as info's CHECKPOINT "
                                             f"({checkpoint_forms(RUN_FILES)})."),
    quiet: bool = QuietOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """Runs side by side, a column each (under its --name), only what differs: tags, note and --init-from's
    checkpoint, the settings each reads ('-' where a run does not read one), then how each went (status, epochs
    trained, best epoch, its validation accuracy and steps)."""
    from ..listing import diff_runs

    render_and_plot(diff_runs(targets, log=chatter(quiet)), fmt, None, quiet)
