"""Milliseconds per training batch, eager against captured and replayed (train.BatchStep), by
precision: the figures that choose the CUDA defaults.

    python benchmarks/capture_speed.py --device cuda            # mlp, align, parity 64 (128, 2048)
    python benchmarks/capture_speed.py --device cpu --batches 3 # the plumbing, on the CPU (no capture)

Each row trains a fresh model on synthetic digits (MNIST's shapes) or parity vectors, as `ponder
train` runs a batch: warm-up batches (on CUDA the capture among them), then `--batches` timed
batches between two device synchronisations. fp16 runs with the GradScaler, bf16 without;
"eager" is --no-cuda-graphs. Beside each time, the peak GPU memory of that row (allocated by
tensors; on CUDA only): what capture costs in memory, its graph's pool included. One table on stdout.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from ponder_cli import model as runtime  # noqa: E402
from ponder_cli.checkpoint import new_model  # noqa: E402
from ponder_cli.config import PonderConfig  # noqa: E402
from ponder_cli.train import WARMUP_BATCHES, batch_step  # noqa: E402
from synthetic_data import synthetic_digits  # noqa: E402

CASES = {  # name: (settings, batch sizes)
    "mlp": (dict(), (128,)),
    "align": (dict(step="align"), (128,)),
    "parity64": (dict(task="parity", elems=64), (128, 2048)),
}
DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def ms_per_batch(cfg: PonderConfig, device: torch.device, dtype, graphs: bool, batches: int) -> tuple:
    """Milliseconds per batch, and the peak GPU memory in MiB (None on the CPU)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(0)
    model = new_model(cfg).to(device)
    data = synthetic_digits(cfg.training.batch_size * (WARMUP_BATCHES + batches + 2), 0).to(device) \
        if cfg.task.name == "mnist" else None
    amp = dtype is not None
    if amp:  # the precision asked for, whatever the device's default
        runtime.amp_dtype = lambda _device, dtype=dtype: dtype
    step = batch_step(model, cfg, data, amp=amp, graphs=graphs and device.type == "cuda")
    model.train()
    first = step.warm_up()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for index in range(first, first + batches):
        step.source.stage(index)
        step()
    float(step.totals[0])  # the epoch's one read: waits for the device
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 20 if device.type == "cuda" else None
    return 1000 * seconds / batches, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    args = parser.parse_args()
    device = runtime.resolve_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}, {args.batches} timed batches per row (ms per batch)")
    print(f"{'case':<10} {'batch':>6} {'dtype':<5} {'eager':>9} {'replayed':>9} {'speed-up':>9}  "
          f"{'vectors/s replayed':>18} {'peak MiB eager':>14} {'replayed':>9}")
    default_dtype = runtime.amp_dtype
    for case in args.cases:
        settings, sizes = CASES[case]
        for size in sizes:
            cfg = PonderConfig.of(batch_size=size, **settings)
            for dtype_name in args.dtypes:
                dtype = DTYPES[dtype_name]
                try:
                    eager, eager_peak = ms_per_batch(cfg, device, dtype, False, args.batches)
                    replayed, replayed_peak = ms_per_batch(cfg, device, dtype, True, args.batches)
                except Exception as exc:  # a row that fails says why, the others go on
                    print(f"{case:<10} {size:>6} {dtype_name:<5} FAILED: {type(exc).__name__}: {exc}"[:300])
                    continue
                finally:
                    runtime.amp_dtype = default_dtype
                peaks = "" if eager_peak is None else f" {eager_peak:14,.0f} {replayed_peak:9,.0f}"
                print(f"{case:<10} {size:>6} {dtype_name:<5} {eager:9.2f} {replayed:9.2f} {eager / replayed:8.1f}x"
                      f"  {1000 * size / replayed:18,.0f}{peaks}", flush=True)


if __name__ == "__main__":
    main()
