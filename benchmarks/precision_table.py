"""Precision under capture, trained for real: fp32, bf16 autocast and fp16 with a GradScaler, for
the mlp and align steps on MNIST and parity at 64 elements: speed, GradScaler back-offs and
accuracy, one row each (what benchmarks/gpu_check.sh prints, to choose the CUDA default from).

    python benchmarks/precision_table.py --device cuda --data-dir DIR           # 2 epochs a row
    python benchmarks/precision_table.py --device cpu --cases mlp --dtypes fp32 bf16 --epochs 1 \\
        --train-size 300 --val-size 100 --max-steps 3 --batch-size 50           # the plumbing

Each row is `ponder train`'s own loop (train.train: the captured batch on CUDA, validation,
checkpoints in a folder of its own), the run seeded alike in every row, the precision forced
as benchmarks/capture_speed.py forces it. Seconds an epoch are the last epoch's (the first pays
the warm-up and the capture), batches and validation both; back-offs are the GradScaler's over
the whole run (fp16 only); accuracy is the last epoch's validation accuracy, which two epochs
leave within a few points of seed noise: a gap of a point or two between rows means nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ponder_cli import model as runtime  # noqa: E402
from ponder_cli.config import PonderConfig  # noqa: E402
from ponder_cli.tasks import get_task  # noqa: E402
from ponder_cli.train import train  # noqa: E402

CASES = {"mlp": dict(), "align": dict(step="align"), "parity64": dict(task="parity", elems=64)}
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
MNIST_ONLY = ("train_size", "val_size")


def row(case: str, dtype_name: str, args, data_dir: Path, out: Path) -> str:
    settings = {**CASES[case], "epochs": args.epochs, "patience": 0}
    for key in ("max_steps", "batch_size", *MNIST_ONLY):
        if getattr(args, key) is not None and not (key in MNIST_ONLY and case == "parity64"):
            settings[key] = getattr(args, key)
    if case == "parity64" and args.batches_per_epoch:
        settings["batches_per_epoch"] = args.batches_per_epoch
    cfg = PonderConfig.of(**settings)
    device, dtype = runtime.resolve_device(args.device), DTYPES[dtype_name]
    task = get_task(cfg)
    train_set, val_set = task.load_training(data_dir, False)
    train_set, val_set = task.to_device(train_set, device), task.to_device(val_set, device)
    default_dtype = runtime.amp_dtype
    if dtype is not None:  # the precision asked for, whatever the device's default
        runtime.amp_dtype = lambda _device, dtype=dtype: dtype
    try:
        started = time.perf_counter()
        result = train(cfg, train_set, val_set, device=device, out_dir=out / f"{case}-{dtype_name}",
                       amp=dtype is not None, progress=False, log=lambda line: None)
        seconds = time.perf_counter() - started
    finally:
        runtime.amp_dtype = default_dtype
    last = result.history[-1]
    return (f"{case:<9} {cfg.training.batch_size:>6} {dtype_name:<5} {last.seconds:9.2f} {seconds:8.1f} "
            f"{sum(h.scaler_backoffs for h in result.history):>9} {sum(h.skipped_batches for h in result.history):>7} "
            f"{last.val_accuracy:9.4f} {last.val_steps:6.2f}  {last.training_step}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=None, help="[default: the run's own]")
    parser.add_argument("--batches-per-epoch", type=int, default=None, help="parity [default: the run's own]")
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--train-size", type=int, default=None)
    parser.add_argument("--val-size", type=int, default=None)
    args = parser.parse_args()
    device = runtime.resolve_device(args.device)
    from ponder_cli.tasks.mnist import resolve_data_dir

    data_dir = resolve_data_dir(args.data_dir)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}, {args.epochs} epochs a row (seconds: the last epoch's, and the "
          f"whole run's)")
    print(f"{'case':<9} {'batch':>6} {'dtype':<5} {'s/epoch':>9} {'run s':>8} {'back-offs':>9} {'skipped':>7} "
          f"{'val acc':>9} {'steps':>6}  training batches")
    with tempfile.TemporaryDirectory() as out:
        for case in args.cases:
            for dtype_name in args.dtypes:
                try:
                    print(row(case, dtype_name, args, data_dir, Path(out)), flush=True)
                except Exception as exc:  # a row that fails says why, the others go on
                    print(f"{case:<9} {'':>6} {dtype_name:<5} FAILED: {type(exc).__name__}: {exc}"[:300], flush=True)


if __name__ == "__main__":
    main()
