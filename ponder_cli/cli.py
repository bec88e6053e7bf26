"""The `ponder` command: a thin Typer layer over the library. Results on stdout, chatter on stderr."""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer
from typer.core import TyperCommand

from . import PonderError, __version__
from .config import PonderConfig
from .render import Column, OutputFormat, render

DEFAULTS = PonderConfig()
DEFAULT_CHECKPOINT = Path("checkpoints") / "best.pt"

app = typer.Typer(
    help="Train PonderNet on MNIST and measure whether it ponders longer on harder inputs.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click errors: one "Error: ..." line, no boxes
)


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def expand_greedy_options(args: list[str], names: tuple[str, ...], numbers_only: bool = False) -> list[str]:
    """`--angles 22.5 45` -> `--angles 22.5 --angles 45`, so one flag can take several values.

    Values run until the next option (a token starting with '-' that is not a number) or '--';
    with numbers_only also until the first token that is not a number (a positional argument).
    """
    expanded: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        expanded.append(token)
        i += 1
        if token in names:
            values = []
            while i < len(args) and args[i] != "--" and (not args[i].startswith("-") or _is_number(args[i])) \
                    and (not numbers_only or _is_number(args[i])):
                values.append(args[i])
                i += 1
            if not values:
                raise typer.BadParameter("needs at least one value", param_hint=f"'{token}'")
            for j, value in enumerate(values):
                expanded.extend([value] if j == 0 else [token, value])
    return expanded


class GreedyAnglesCommand(TyperCommand):
    numbers_only = False

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, expand_greedy_options(list(args), ("--angles",), self.numbers_only))


class GreedyAnglesAfterCheckpointsCommand(GreedyAnglesCommand):
    numbers_only = True  # `compare --angles 45 90 a.pt b.pt`: the checkpoints end the angle list


@contextlib.contextmanager
def user_errors():
    """A PonderError is the user's to fix: one line on stderr and exit code 1, no traceback."""
    try:
        yield
    except PonderError as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from None


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ponder_cli {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """Train PonderNet on MNIST and measure whether it ponders longer on harder inputs."""


# Shared options -------------------------------------------------------------------------------

DataDirOption = typer.Option(None, "--data-dir", help="Where MNIST lives or is downloaded to "
                             "(MNIST/raw/ inside it). [default: $PONDER_DATA_DIR, else ~/.cache/ponder_cli]")
DownloadOption = typer.Option(True, "--download/--no-download",
                              help="Download MNIST into --data-dir when it is not there.")
DeviceOption = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N.")
AmpOption = typer.Option(None, "--amp/--no-amp", help="Mixed precision: fp16 on CUDA, bf16 on CPU. "
                         "[default: on for CUDA, off for CPU]")
FormatOption = typer.Option(OutputFormat.table, "--format", "-f", help="Output format.",
                            case_sensitive=False)
CheckpointArgument = typer.Argument(None, help=f"Checkpoint to load. [default: {DEFAULT_CHECKPOINT}]",
                                    show_default=False)
EvalSeedOption = typer.Option(None, "--seed", help="Seed of the test rotations and halting coin flips. "
                              "[default: the checkpoint's training seed]")
LimitOption = typer.Option(0, "--limit", min=0, help="Evaluate only the first N test images (0: all).")
EvalBatchOption = typer.Option(1000, "--batch-size", min=1, help="Images per evaluation batch.")


def _data_dir(data_dir: Optional[Path]) -> Path:
    from .data import default_data_dir
    return data_dir if data_dir is not None else default_data_dir()


def _amp_for(device, amp: Optional[bool]) -> bool:
    return device.type == "cuda" if amp is None else amp


def _check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / ".ponder-write-test", "w"):
            pass
        (directory / ".ponder-write-test").unlink()
    except OSError as exc:
        raise PonderError(f"cannot write checkpoints to {directory}: {exc.strerror or exc}") from None


def _check_angle(angle: float, what: str) -> float:
    if not math.isfinite(angle):
        raise PonderError(f"{what} must be a finite number of degrees (got {angle})")
    if not 0 <= angle <= 180:
        raise PonderError(f"{what} must be between 0 and 180 degrees: images are rotated within "
                          f"+-angle (got {angle:g})")
    return angle


def _parse_angle(text: str, what: str) -> float:
    try:
        angle = float(text)
    except ValueError:
        raise PonderError(f"{what}: {text!r} is not a number of degrees") from None
    return _check_angle(angle, what)


def _check_plot(plot: Optional[Path]) -> None:
    """Refuse --plot before any work when matplotlib is missing."""
    if plot is not None:
        from .plot import require_matplotlib
        require_matplotlib()


def _checkpoint_path(checkpoint: Optional[Path]) -> Path:
    if checkpoint is None and not DEFAULT_CHECKPOINT.exists():
        raise PonderError(f"no checkpoint given and {DEFAULT_CHECKPOINT} does not exist; "
                          "train one with `ponder train` or name one")
    return checkpoint or DEFAULT_CHECKPOINT


# train ----------------------------------------------------------------------------------------

def _help(text: str, name: str) -> str:
    return f"{text} [default: {getattr(DEFAULTS, name)}]"


class HaltingInput(str, Enum):
    state = "state"
    state_confidence = "state+confidence"


class Method(str, Enum):
    pondernet = "pondernet"
    act = "act"
    plain = "plain"


@app.command()
def train(
    method: Optional[Method] = typer.Option(None, "--method", case_sensitive=False, show_default=False,
                                            help="pondernet; act (Adaptive Computation Time, Graves 2016); plain (one "
                                                 "step, no pondering: sets --max-steps 1). [default: pondernet]"),
    epochs: Optional[int] = typer.Option(None, help=_help("Training epochs.", "epochs"), show_default=False),
    batch_size: Optional[int] = typer.Option(None, help=_help("Images per batch.", "batch_size"), show_default=False),
    lr: Optional[float] = typer.Option(None, help=_help("Adam learning rate.", "lr"), show_default=False),
    max_steps: Optional[int] = typer.Option(None, help=_help("Maximum ponder steps.", "max_steps"), show_default=False),
    lambda_p: Optional[float] = typer.Option(None, help=_help("Geometric prior parameter, in (0, 1].", "lambda_p"), show_default=False),
    beta: Optional[float] = typer.Option(None, help=_help("Weight of the KL regularisation.", "beta"), show_default=False),
    tau: Optional[float] = typer.Option(None, help=_help("ACT: weight of the ponder cost N + R.", "tau"), show_default=False),
    halting_input: Optional[HaltingInput] = typer.Option(
        None, "--halting-input", case_sensitive=False, show_default=False,
        help="What the halting head sees: the state, or the state and the step's top class probability. "
             "[default: state]"),
    grad_clip: Optional[float] = typer.Option(None, help=_help("Gradient-norm clip (0: off).", "grad_clip"), show_default=False),
    patience: Optional[int] = typer.Option(None, help=_help("Early stopping: epochs without a better validation accuracy (0: off).", "patience"), show_default=False),
    lr_patience: Optional[int] = typer.Option(None, help=_help("Epochs without improvement before the LR is cut.", "lr_patience"), show_default=False),
    train_rotation: Optional[float] = typer.Option(None, help=_help("Rotate training images uniformly within +-this many degrees (0: plain MNIST).", "train_rotation"), show_default=False),
    val_size: Optional[int] = typer.Option(None, help=_help("Training images held out for validation.", "val_size"), show_default=False),
    train_size: Optional[int] = typer.Option(None, help=_help("Training images used (0: all not held out).", "train_size"), show_default=False),
    seed: Optional[int] = typer.Option(None, help=_help("Seed of the split, initialisation and sampling.", "seed"), show_default=False),
    data_dir: Optional[Path] = DataDirOption,
    download: bool = DownloadOption,
    out: Optional[Path] = typer.Option(None, "--out", help="Directory for best.pt and last.pt. [default: checkpoints/, or the resumed checkpoint's directory]", show_default=False),
    device: str = DeviceOption,
    amp: Optional[bool] = AmpOption,
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the run saved in this checkpoint (e.g. checkpoints/last.pt)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars on stderr."),
) -> None:
    """Train PonderNet on MNIST; writes best.pt and last.pt under --out."""
    given = {k: v for k, v in dict(
        method=None if method is None else method.value, tau=tau,
        halting_input=None if halting_input is None else halting_input.value, epochs=epochs, batch_size=batch_size, lr=lr, max_steps=max_steps, lambda_p=lambda_p, beta=beta,
        grad_clip=grad_clip, patience=patience, lr_patience=lr_patience, train_rotation=train_rotation,
        val_size=val_size, train_size=train_size, seed=seed).items() if v is not None}
    with user_errors():
        from .checkpoint import LAST, config_of, load_checkpoint
        from .data import load_mnist, train_val_split
        from .runtime import amp_dtype, resolve_device
        from .train import train as run_training

        resume_ckpt = None
        if resume is not None:
            resume_ckpt = load_checkpoint(resume)
            saved = config_of(resume_ckpt, resume)
            conflicts = [f"--{k.replace('_', '-')} {v} (checkpoint: {getattr(saved, k)})"
                         for k, v in given.items() if k not in ("epochs", "patience") and getattr(saved, k) != v]
            if conflicts:
                raise PonderError(f"cannot resume {resume} with options that contradict its config: "
                                  f"{'; '.join(conflicts)}")
            cfg = saved.replace(**{k: given[k] for k in ("epochs", "patience") if k in given})
            out_dir = out if out is not None else resume.parent
        else:
            if given.get("method") == "plain":
                given.setdefault("max_steps", 1)
            cfg = PonderConfig(**given)
            out_dir = out if out is not None else Path("checkpoints")
        dev = resolve_device(device)
        use_amp = _amp_for(dev, amp)
        full = load_mnist(_data_dir(data_dir), train=True, download=download)
        train_set, val_set = train_val_split(full, val_size=cfg.val_size, train_size=cfg.train_size, seed=cfg.seed)
        _check_writable(out_dir)  # only once everything else is known to be fine: nothing written before
        train_set, val_set = train_set.to(dev), val_set.to(dev)
        typer.echo(f"training {cfg.method} on {len(train_set)} images, validating on {len(val_set)}, device {dev}"
                  f"{', amp ' + str(amp_dtype(dev)).removeprefix('torch.') if use_amp else ''}"
                  f"{', resuming after epoch ' + str(resume_ckpt['epoch']) if resume_ckpt else ''}", err=True)

        def report(stats) -> None:
            typer.echo(
                f"epoch {stats.epoch:>2}/{cfg.epochs}  loss {stats.train_loss:.4f}  "
                f"acc {stats.train_accuracy:.4f}  steps {stats.train_steps:.2f}  |  "
                f"val acc {stats.val_accuracy:.4f}  steps {stats.val_steps:.2f}  |  "
                f"lr {stats.lr:.0e}  {stats.seconds:.1f}s{'  *' if stats.improved else ''}"
                f"{f'  ({stats.skipped_batches} non-finite batches skipped)' if stats.skipped_batches else ''}",
                err=True)

        started = time.perf_counter()
        try:
            result = run_training(cfg, train_set, val_set, device=dev, out_dir=out_dir, amp=use_amp,
                                  resume=resume_ckpt, on_epoch=report, progress=progress)
        except KeyboardInterrupt:
            last = out_dir / LAST
            hint = f"resume with: ponder train --resume {last}" if last.exists() else "no epoch had completed"
            typer.echo(f"Interrupted; {hint}", err=True)
            raise typer.Exit(130) from None

    seconds = time.perf_counter() - started
    best = next((h for h in result.history if h.epoch == result.best_epoch), None)
    row = {
        "epochs": result.last_epoch, "stopped_early": result.stopped_early,
        "best_epoch": result.best_epoch, "val_accuracy": result.best_accuracy,
        "val_steps": best.val_steps if best else None, "seconds": seconds,
        "best_checkpoint": str(result.best_path),
    }
    render([row], [Column("epochs", "epochs"), Column("best_epoch", "best epoch"),
                   Column("val_accuracy", "val accuracy", ".4f"), Column("val_steps", "val steps", ".2f"),
                   Column("stopped_early", "stopped early"), Column("seconds", "seconds", ".1f")],
           OutputFormat.table, title="PonderNet training")
    typer.echo(f"best checkpoint: {result.best_path}")


# eval and extrapolate -------------------------------------------------------------------------

class Protocol(str, Enum):
    uniform = "uniform"
    band = "band"
    fixed = "fixed"


class Halting(str, Enum):
    sample = "sample"
    median = "median"
    expected = "expected"


RESULT_COLUMNS = [
    Column("rotation", "rotation (±deg)", "g"), Column("accuracy", "accuracy", ".4f"),
    Column("mean_steps", "mean steps", ".2f"), Column("std_steps", "std", ".2f"),
    Column("steps_correct", "steps ✓", ".2f"), Column("steps_wrong", "steps ✗", ".2f"),
    Column("halting_spark", "halting steps 1→max", "s"), Column("images", "images"),
]
ProtocolOption = typer.Option(Protocol.uniform, "--protocol", case_sensitive=False,
                              help="uniform: within ±angle (reference); band: |rotation| between the previous "
                                   "angle and this one; fixed: exactly ±angle.")
HaltingOption = typer.Option(Halting.sample, "--halting", case_sensitive=False,
                             help="sample: Bernoulli(λ_n) coin per step (paper); median: first step where the "
                                  "cumulative halting probability reaches 0.5; expected: p-weighted average "
                                  "of all steps' outputs, steps = Σ n·p_n.")
DetailOption = typer.Option(False, "--detail", help="Also show, per halting step, how many images halted there "
                            "and the accuracy if every image stopped there (runs all steps).")
AnglesOption = typer.Option(["22.5", "45", "67.5", "90"], "--angles",
                            help="Rotation buckets in degrees (see --protocol). Several values after one flag: "
                                 "--angles 22.5 45 67.5 90.")
PlotOption = typer.Option(None, "--plot", help="Write a PNG of accuracy and ponder steps against angle and the "
                          "halting-step distributions (needs matplotlib: pip install -e '.[plot]').")


def _load_test_set(data_dir: Optional[Path], download: bool, limit: int, dev):
    from .data import load_mnist

    test = load_mnist(_data_dir(data_dir), train=False, download=download)
    return (test.subset(slice(0, limit)) if limit else test).to(dev)


def _load_for_eval(checkpoint: Optional[Path], device: str, data_dir: Optional[Path], download: bool, limit: int):
    from .checkpoint import load_model
    from .runtime import resolve_device

    path = _checkpoint_path(checkpoint)
    dev = resolve_device(device)
    model, cfg, _ = load_model(path, dev)
    return path, dev, model, cfg, _load_test_set(data_dir, download, limit, dev)


def _evaluate_buckets(model, cfg, test, angles: list[float], *, protocol: Protocol, halting: Halting,
                      seed: int, batch_size: int, amp: bool, detail: bool, with_loss: bool):
    """Rows for the output, one per angle bucket, and Spearman's rho of |angle| and steps."""
    from .evaluate import evaluate_buckets
    from .methods import halting_name

    results, rho = evaluate_buckets(model, test, cfg, angles, protocol=protocol.value, halting=halting.value,
                                    seed=seed, batch_size=batch_size, detail=detail, with_loss=with_loss, amp=amp)
    rows = []
    for angle, result in zip(angles, results):
        row = {"rotation": angle, "protocol": protocol.value, "halting": halting_name(cfg, halting.value),
               **result.as_dict()}
        if not with_loss:
            for key in ("loss", "reconstruction", "regularisation"):
                row.pop(key)
        rows.append(row)
    return rows, rho


def _report(rows: list[dict], rho, fmt: OutputFormat, *, path: Path, cfg, protocol: Protocol, halting: Halting,
            title: str, single: bool, detail: bool, plot: Optional[Path], extra_columns=()) -> None:
    from .render import sparkline

    images = sum(row["images"] for row in rows)
    halting_used = rows[0]["halting"]
    meta = {"checkpoint": str(path), "method": cfg.method, "train_rotation": cfg.train_rotation,
            "protocol": protocol.value, "halting": halting_used,
            "spearman": {"rho": rho, "images": images, "between": "|rotation angle| and ponder steps"}}
    if fmt is OutputFormat.table:
        for row in rows:
            row["halting_spark"] = sparkline(row["histogram"])
    elif fmt is OutputFormat.csv:
        for row in rows:
            row["spearman_rho"] = rho
    rho_text = "undefined (angle or steps constant)" if rho is None else f"{rho:+.3f}"
    render(rows, RESULT_COLUMNS + list(extra_columns), fmt, single=single, title=title,
           meta=meta if fmt is OutputFormat.json else None,
           caption=f"{cfg.method} trained within ±{cfg.train_rotation:g}° · protocol {protocol.value} · "
                   f"halting {halting_used}"
                   f"\nSpearman ρ(|angle|, steps) = {rho_text} over {images} images")
    if detail and fmt is OutputFormat.table:
        columns = [Column("step", "step")]
        detail_rows = [{"step": k + 1} for k in range(len(rows[0]["histogram"]))]
        for i, row in enumerate(rows):
            for k, detail_row in enumerate(detail_rows):
                detail_row[f"n{i}"] = row["histogram"][k]
                detail_row[f"a{i}"] = row["accuracy_at_step"][k]
            spec = ".1f" if halting_used == "expected" else "d"
            columns += [Column(f"n{i}", f"±{row['rotation']:g}° halted", spec),
                        Column(f"a{i}", f"±{row['rotation']:g}° acc if stop", ".4f")]
        render(detail_rows, columns, fmt, title="Per halting step")
    if plot is not None:
        from .plot import plot_buckets

        written = plot_buckets({path.stem if path.stem != "best" else str(path): rows}, plot,
                               title=f"{path} · protocol {protocol.value} · halting {halting_used}")
        typer.echo(f"plot written to {written}", err=True)


@app.command("eval")
def eval_command(
    checkpoint: Optional[Path] = CheckpointArgument,
    rotation: float = typer.Option(0.0, "--rotation", help="Rotate test images uniformly within +-this many degrees."),
    protocol: Protocol = ProtocolOption,
    halting: Halting = HaltingOption,
    detail: bool = DetailOption,
    plot: Optional[Path] = PlotOption,
    seed: Optional[int] = EvalSeedOption,
    limit: int = LimitOption,
    batch_size: int = EvalBatchOption,
    data_dir: Optional[Path] = DataDirOption,
    download: bool = DownloadOption,
    device: str = DeviceOption,
    amp: Optional[bool] = AmpOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """Accuracy, ponder steps and loss on the MNIST test set."""
    with user_errors():
        _check_angle(rotation, "--rotation")
        _check_plot(plot)
        path, dev, model, cfg, test = _load_for_eval(checkpoint, device, data_dir, download, limit)
        rows, rho = _evaluate_buckets(model, cfg, test, [rotation], protocol=protocol, halting=halting,
                                      seed=cfg.seed if seed is None else seed, batch_size=batch_size,
                                      amp=_amp_for(dev, amp), detail=detail, with_loss=True)
        rows[0]["checkpoint"] = str(path)
        _report(rows, rho, fmt, path=path, cfg=cfg, protocol=protocol, halting=halting, single=True,
                detail=detail, plot=plot, title=f"PonderNet on the MNIST test set ({path})",
                extra_columns=[Column("loss", "loss", ".4f")])


@app.command(cls=GreedyAnglesCommand)
def extrapolate(
    checkpoint: Optional[Path] = CheckpointArgument,
    angles: List[str] = AnglesOption,
    protocol: Protocol = ProtocolOption,
    halting: Halting = HaltingOption,
    detail: bool = DetailOption,
    plot: Optional[Path] = PlotOption,
    seed: Optional[int] = EvalSeedOption,
    limit: int = LimitOption,
    batch_size: int = EvalBatchOption,
    data_dir: Optional[Path] = DataDirOption,
    download: bool = DownloadOption,
    device: str = DeviceOption,
    amp: Optional[bool] = AmpOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """Accuracy and ponder steps on the test set rotated within ±angle, per angle bucket."""
    with user_errors():
        parsed = [_parse_angle(text, "--angles") for text in angles]
        _check_plot(plot)
        path, dev, model, cfg, test = _load_for_eval(checkpoint, device, data_dir, download, limit)
        rows, rho = _evaluate_buckets(model, cfg, test, parsed, protocol=protocol, halting=halting,
                                      seed=cfg.seed if seed is None else seed, batch_size=batch_size,
                                      amp=_amp_for(dev, amp), detail=detail, with_loss=False)
        _report(rows, rho, fmt, path=path, cfg=cfg, protocol=protocol, halting=halting, single=False,
                detail=detail, plot=plot, title=f"PonderNet extrapolation ({path})")


# compare ----------------------------------------------------------------------------------------

def _group_label(cfg, others) -> str:
    """The method, plus whatever else sets this group apart from the other groups of that method."""
    differing = sorted({k for other in others for k, v in other.to_dict().items()
                        if k != "seed" and cfg.to_dict()[k] != v})
    return cfg.method + (f" ({', '.join(f'{k}={getattr(cfg, k)}' for k in differing)})" if differing else "")


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation over seeds (0 for a single seed)."""
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


@app.command(cls=GreedyAnglesAfterCheckpointsCommand)
def compare(
    checkpoints: List[Path] = typer.Argument(..., help="Checkpoints to compare: one or more per method; several "
                                                      "of one method (e.g. other seeds) give mean ± std."),
    angles: List[str] = AnglesOption,
    protocol: Protocol = ProtocolOption,
    halting: Halting = HaltingOption,
    plot: Optional[Path] = PlotOption,
    seed: int = typer.Option(1234, "--seed", help="Seed of the test rotations and halting coin flips (the same for "
                                                  "every checkpoint, so all see the same images)."),
    limit: int = LimitOption,
    batch_size: int = EvalBatchOption,
    data_dir: Optional[Path] = DataDirOption,
    download: bool = DownloadOption,
    device: str = DeviceOption,
    amp: Optional[bool] = AmpOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """Methods side by side on the same rotation buckets: accuracy and ponder steps, mean ± std over seeds."""
    with user_errors():
        from .checkpoint import load_model
        from .runtime import resolve_device

        parsed = [_parse_angle(text, "--angles") for text in angles]
        _check_plot(plot)
        dev = resolve_device(device)
        models = [(path, *load_model(path, dev)[:2]) for path in checkpoints]  # fail on any bad file first
        test = _load_test_set(data_dir, download, limit, dev)
        groups: dict[tuple, list] = {}
        for path, model, cfg in models:
            key = tuple(sorted((k, v) for k, v in cfg.to_dict().items() if k != "seed"))
            groups.setdefault(key, []).append((path, model, cfg))
        rows, series = [], {}
        configs = [members[0][2] for members in groups.values()]
        for members in groups.values():
            cfg = members[0][2]
            label = _group_label(cfg, [c for c in configs if c.method == cfg.method and c is not cfg])
            per_model = [_evaluate_buckets(model, cfg_m, test, parsed, protocol=protocol, halting=halting, seed=seed,
                                           batch_size=batch_size, amp=_amp_for(dev, amp), detail=False,
                                           with_loss=False)[0] for _, model, cfg_m in members]
            series[label] = []
            for b, angle in enumerate(parsed):
                accuracy, accuracy_std = _mean_std([r[b]["accuracy"] for r in per_model])
                steps, steps_std = _mean_std([r[b]["mean_steps"] for r in per_model])
                row = {"method": cfg.method, "label": label, "rotation": angle, "seeds": len(members),
                       "accuracy": accuracy, "accuracy_std": accuracy_std, "mean_steps": steps,
                       "mean_steps_std": steps_std, "halting": per_model[0][b]["halting"],
                       "protocol": protocol.value, "images": per_model[0][b]["images"],
                       "checkpoints": [str(p) for p, _, _ in members]}
                rows.append(row)
                series[label].append({**row, "std_steps": steps_std,
                                      "histogram": [sum(r[b]["histogram"][k] for r in per_model)
                                                    for k in range(len(per_model[0][b]["histogram"]))]})
    if fmt is OutputFormat.table:
        for row in rows:
            row["accuracy_text"] = f"{row['accuracy']:.4f} ± {row['accuracy_std']:.4f}"
            row["steps_text"] = f"{row['mean_steps']:.2f} ± {row['mean_steps_std']:.2f}"
    columns = [Column("label", "method", "s"), Column("seeds", "seeds"), Column("rotation", "rotation (±deg)", "g"),
               Column("accuracy_text", "accuracy (mean ± sd over seeds)", "s"),
               Column("steps_text", "mean steps (mean ± sd)", "s"), Column("halting", "halting", "s")]
    render(rows, columns, fmt, title="Methods compared",
           caption=f"protocol {protocol.value} · {rows[0]['images']} test images per bucket · seed {seed}")
    if plot is not None:
        from .plot import plot_buckets

        written = plot_buckets(series, plot, title=f"methods compared · protocol {protocol.value} · "
                                                   "error bars: sd of mean steps over seeds")
        typer.echo(f"plot written to {written}", err=True)


def run() -> None:
    app(prog_name="ponder")
