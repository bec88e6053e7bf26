"""The `ponder` command: a thin Typer layer over the library. Results on stdout, chatter on stderr."""

from __future__ import annotations

import contextlib
import math
import time
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


def expand_greedy_options(args: list[str], names: tuple[str, ...]) -> list[str]:
    """`--angles 22.5 45` -> `--angles 22.5 --angles 45`, so one flag can take several values.

    Values run until the next option (a token starting with '-' that is not a number) or '--'.
    """
    expanded: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        expanded.append(token)
        i += 1
        if token in names:
            values = []
            while i < len(args) and args[i] != "--" and (not args[i].startswith("-") or _is_number(args[i])):
                values.append(args[i])
                i += 1
            if not values:
                raise typer.BadParameter("needs at least one value", param_hint=f"'{token}'")
            for j, value in enumerate(values):
                expanded.extend([value] if j == 0 else [token, value])
    return expanded


class GreedyAnglesCommand(TyperCommand):
    def parse_args(self, ctx, args):
        return super().parse_args(ctx, expand_greedy_options(list(args), ("--angles",)))


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


def _checkpoint_path(checkpoint: Optional[Path]) -> Path:
    if checkpoint is None and not DEFAULT_CHECKPOINT.exists():
        raise PonderError(f"no checkpoint given and {DEFAULT_CHECKPOINT} does not exist; "
                          "train one with `ponder train` or name one")
    return checkpoint or DEFAULT_CHECKPOINT


# train ----------------------------------------------------------------------------------------

def _help(text: str, name: str) -> str:
    return f"{text} [default: {getattr(DEFAULTS, name)}]"


@app.command()
def train(
    epochs: Optional[int] = typer.Option(None, help=_help("Training epochs.", "epochs"), show_default=False),
    batch_size: Optional[int] = typer.Option(None, help=_help("Images per batch.", "batch_size"), show_default=False),
    lr: Optional[float] = typer.Option(None, help=_help("Adam learning rate.", "lr"), show_default=False),
    max_steps: Optional[int] = typer.Option(None, help=_help("Maximum ponder steps.", "max_steps"), show_default=False),
    lambda_p: Optional[float] = typer.Option(None, help=_help("Geometric prior parameter, in (0, 1].", "lambda_p"), show_default=False),
    beta: Optional[float] = typer.Option(None, help=_help("Weight of the KL regularisation.", "beta"), show_default=False),
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
        epochs=epochs, batch_size=batch_size, lr=lr, max_steps=max_steps, lambda_p=lambda_p, beta=beta,
        grad_clip=grad_clip, patience=patience, lr_patience=lr_patience, train_rotation=train_rotation,
        val_size=val_size, train_size=train_size, seed=seed).items() if v is not None}
    with user_errors():
        import torch

        from .checkpoint import config_of, load_checkpoint
        from .data import load_mnist, train_val_split
        from .runtime import resolve_device
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
            cfg = PonderConfig(**given)
            out_dir = out if out is not None else Path("checkpoints")
        dev = resolve_device(device)
        use_amp = _amp_for(dev, amp)
        full = load_mnist(_data_dir(data_dir), train=True, download=download)
        train_set, val_set = train_val_split(full, val_size=cfg.val_size, train_size=cfg.train_size, seed=cfg.seed)
        _check_writable(out_dir)  # only once everything else is known to be fine: nothing written before
        train_set, val_set = train_set.to(dev), val_set.to(dev)
        typer.echo(f"training on {len(train_set)} images, validating on {len(val_set)}, device {dev}"
                  f"{', amp ' + str(torch.float16 if dev.type == 'cuda' else torch.bfloat16).split('.')[-1] if use_amp else ''}"
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
            last = out_dir / "last.pt"
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

RESULT_COLUMNS = [
    Column("rotation", "rotation (±deg)", "g"), Column("accuracy", "accuracy", ".4f"),
    Column("mean_steps", "mean steps", ".2f"), Column("std_steps", "std steps", ".2f"),
    Column("images", "images"),
]


def _load_for_eval(checkpoint: Optional[Path], device: str, data_dir: Optional[Path], download: bool, limit: int):
    from .checkpoint import load_model
    from .data import load_mnist
    from .runtime import resolve_device

    path = _checkpoint_path(checkpoint)
    dev = resolve_device(device)
    model, cfg, _ = load_model(path, dev)
    test = load_mnist(_data_dir(data_dir), train=False, download=download)
    if limit:
        test = test.subset(slice(0, limit))
    return path, dev, model, cfg, test.to(dev)


@app.command("eval")
def eval_command(
    checkpoint: Optional[Path] = CheckpointArgument,
    rotation: float = typer.Option(0.0, "--rotation", help="Rotate test images uniformly within +-this many degrees."),
    seed: Optional[int] = EvalSeedOption,
    limit: int = typer.Option(0, "--limit", min=0, help="Evaluate only the first N test images (0: all)."),
    batch_size: int = EvalBatchOption,
    data_dir: Optional[Path] = DataDirOption,
    download: bool = DownloadOption,
    device: str = DeviceOption,
    amp: Optional[bool] = AmpOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """Accuracy, mean ponder steps and loss on the MNIST test set."""
    with user_errors():
        from .evaluate import evaluate

        _check_angle(rotation, "--rotation")
        path, dev, model, cfg, test = _load_for_eval(checkpoint, device, data_dir, download, limit)
        result = evaluate(model, test, cfg, max_angle=rotation, seed=cfg.seed if seed is None else seed,
                          batch_size=batch_size, with_loss=True, amp=_amp_for(dev, amp))
    row = {"checkpoint": str(path), "rotation": rotation, **result.as_dict()}
    render([row], RESULT_COLUMNS + [Column("loss", "loss", ".4f")], fmt, single=True,
           title=f"PonderNet on the MNIST test set ({path})")


@app.command(cls=GreedyAnglesCommand)
def extrapolate(
    checkpoint: Optional[Path] = CheckpointArgument,
    angles: List[str] = typer.Option(["22.5", "45", "67.5", "90"], "--angles",
                                       help="Rotation buckets in degrees: test images rotated uniformly within "
                                            "+-angle. Several values after one flag: --angles 22.5 45 67.5 90."),
    seed: Optional[int] = EvalSeedOption,
    limit: int = typer.Option(0, "--limit", min=0, help="Evaluate only the first N test images (0: all)."),
    batch_size: int = EvalBatchOption,
    data_dir: Optional[Path] = DataDirOption,
    download: bool = DownloadOption,
    device: str = DeviceOption,
    amp: Optional[bool] = AmpOption,
    fmt: OutputFormat = FormatOption,
) -> None:
    """Accuracy and ponder steps on the test set rotated within +-angle, per angle bucket."""
    with user_errors():
        from .evaluate import evaluate

        if not angles:
            raise PonderError("--angles needs at least one angle")
        angles = [_parse_angle(text, "--angles") for text in angles]
        path, dev, model, cfg, test = _load_for_eval(checkpoint, device, data_dir, download, limit)
        rows = []
        for angle in angles:
            result = evaluate(model, test, cfg, max_angle=angle, seed=cfg.seed if seed is None else seed,
                              batch_size=batch_size, amp=_amp_for(dev, amp))
            rows.append({"rotation": angle, **result.as_dict()})
    render(rows, RESULT_COLUMNS, fmt, title=f"PonderNet extrapolation ({path})",
           caption=f"trained within ±{cfg.train_rotation:g}°; halting sampled from Bernoulli(λ_n)")


def run() -> None:
    app(prog_name="ponder")
