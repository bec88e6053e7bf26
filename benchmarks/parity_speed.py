"""Parity speed: training iterations per second, and seconds to a validation accuracy
of 0.99, for `ponder train --task parity` as the library runs it.

Two measurements, both through the library (tasks.parity's on-device batches, train.train_one_epoch,
train.train with its validation), nothing re-implemented here:

1. iterations/s: --iterations training batches of --batch-size on fresh vectors (after a few
   warm-up batches), the optimizer step included, no validation;
2. seconds to --target: `train.train` with epochs of --batches-per-epoch batches, stopped at the
   first epoch whose validation accuracy (the fixed validation set: 64 vectors per non-zero count
   of the training range, sampled halting) reaches --target; the seconds are the sum of the
   epochs' own times (training and validation), not counting set-up.

The default is the 16-element interpolation with the recipe the CLI implies for parity (gru with
LayerNorm, orthogonal recurrent blocks and update-gate bias 1; hidden 128; lambda_p 0.1; Adam 1e-3;
clipping at 1; 20 steps). Run it alone on a quiet machine: figures taken while other work runs
are not comparable. One thread by default (--threads).

    python benchmarks/parity_speed.py                      # 16 elements, both measurements
    python benchmarks/parity_speed.py --elems 32 --max-epochs 60
    python benchmarks/parity_speed.py --only speed --iterations 200   # a quick smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from ponder_cli.config import PonderConfig  # noqa: E402
from ponder_cli.checkpoint import new_model
from ponder_cli.tasks import get_task  # noqa: E402
from ponder_cli.train import batch_step, train, train_one_epoch  # noqa: E402


class Reached(Exception):
    """Raised from the epoch callback once the target accuracy is reached."""


def iterations_per_second(cfg: PonderConfig, iterations: int, device: torch.device) -> float:
    """Training batches per second as `ponder train` runs them (on CUDA: captured and replayed),
    after a first epoch whose first batches warm up (and capture: BatchStep.warm_up)."""
    torch.manual_seed(cfg.training.seed)
    model = new_model(cfg).to(device)
    timed = cfg.replace(batches_per_epoch=iterations)
    source = get_task(timed).training_source(None, device)
    step = batch_step(model, timed, source, graphs=device.type == "cuda")
    step.warm_up()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    train_one_epoch(step, progress=False)  # ends with a host read
    return iterations / (time.perf_counter() - started)


def seconds_to_target(cfg: PonderConfig, target: float, device: torch.device) -> dict:
    task = get_task(cfg)
    _, val = task.load_training(None, False)
    val = task.to_device(val, device)
    seconds, curve = 0.0, []

    def on_epoch(stats) -> None:
        nonlocal seconds
        seconds += stats.seconds
        curve.append((stats.epoch, round(seconds, 1), round(stats.val_accuracy, 4), round(stats.val_steps, 2)))
        print(f"epoch {stats.epoch}: {seconds:.1f}s val acc {stats.val_accuracy:.4f} steps {stats.val_steps:.2f}",
              file=sys.stderr, flush=True)
        if stats.val_accuracy >= target:
            raise Reached()

    with tempfile.TemporaryDirectory() as out:
        try:
            train(cfg, None, val, device=device, out_dir=Path(out), on_epoch=on_epoch, progress=False)
            reached = None
        except Reached:
            reached = seconds
    return {"target": target, "seconds": reached,
            "iterations": len(curve) * cfg.task.batches_per_epoch if reached else None,
            "curve": curve}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--elems", type=int, default=16)
    p.add_argument("--train-counts", default=None, help="LO-HI (default 1-elems: interpolation)")
    p.add_argument("--step", default="gru", choices=("gru", "rnn"))
    p.add_argument("--method", default="pondernet", choices=("pondernet", "act", "plain"))
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--iterations", type=int, default=500, help="timed training batches (measurement 1)")
    p.add_argument("--batches-per-epoch", type=int, default=500, help="validation every this many batches (2)")
    p.add_argument("--max-epochs", type=int, default=40)
    p.add_argument("--target", type=float, default=0.99)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--only", choices=("speed", "target"), default=None)
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    given = dict(task="parity", elems=args.elems, step=args.step, method=args.method, batch_size=args.batch_size,
                 batches_per_epoch=args.batches_per_epoch, epochs=args.max_epochs, seed=args.seed, patience=0)
    if args.train_counts:
        given["train_counts"] = args.train_counts
    cfg = PonderConfig.of(**given)
    result = {"elems": cfg.task.elems, "train_counts": cfg.task.train_counts, "step": cfg.step.name,
              "method": cfg.method.name,
              "batch_size": cfg.training.batch_size, "threads": args.threads, "device": str(device)}
    if args.only in (None, "speed"):
        result["iterations_per_second"] = round(iterations_per_second(cfg, args.iterations, device), 1)
        print(f"{result['iterations_per_second']} iterations/s", file=sys.stderr, flush=True)
    if args.only in (None, "target"):
        result["to_target"] = seconds_to_target(cfg, args.target, device)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
