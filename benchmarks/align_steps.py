"""Where the align step's training time goes: computed steps per image and seconds per training
batch under several training truncations, on the same MNIST batches.

    OMP_NUM_THREADS=1 python benchmarks/align_steps.py --truncation 0.01 0.05 0.1 0.2
    OMP_NUM_THREADS=1 python benchmarks/align_steps.py --checkpoint ponder_cli/checkpoints/align/best.pt \\
        --truncation 0.01 0.1 --profile
    OMP_NUM_THREADS=1 python benchmarks/align_steps.py --rule cut roulette --truncation 0.1 0.5

Each truncation starts from the same weights (a fresh model of the step's defaults, or a
checkpoint's) and trains on the same `--batches` batches of the training distribution (±22.5°)
after one warm-up batch: real optimizer steps, as `ponder train` takes them. Reported per
truncation: computed steps per image (what the CNN's cost follows), milliseconds per batch, and,
with --profile, the operators that took the most CPU time in one more batch.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ponder_cli.checkpoint import load_model, new_model  # noqa: E402
from ponder_cli.config import PonderConfig  # noqa: E402
from ponder_cli.tasks.mnist import default_data_dir, load_mnist  # noqa: E402
from ponder_cli.model import PonderNet  # noqa: E402
from ponder_cli.train import batch_step  # noqa: E402


def run(model, cfg: PonderConfig, images, count: int, profile: bool) -> dict:
    """Train `model` on the first `count` training batches of an epoch (the first a warm-up) as
    `ponder train` does on the CPU (train.BatchStep, its shrinking truncated forward); steps
    computed per image and ms per batch."""
    torch.manual_seed(cfg.training.seed)  # the same permutation, dropout and coins for every truncation
    step = batch_step(model, cfg, images)
    computed, forward = [], PonderNet._forward_truncated

    def recording(self, x, stop):
        out = forward(self, x, stop)
        computed.append(out.computed.detach())  # read once timing is done
        return out

    PonderNet._forward_truncated = recording
    try:
        model.train()
        step.source.start_epoch()
        times = []
        for index in range(count):
            step.source.stage(index)
            start = time.perf_counter()
            step()
            if index > 0:
                times.append(time.perf_counter() - start)
        means = [float(c.float().mean()) for c in computed[1:count]]
        result = {"steps": statistics.mean(means) if means else float(cfg.method.max_steps),
                  "ms": 1000 * statistics.median(times), "ms_mean": 1000 * statistics.mean(times)}
        if profile:
            step.source.stage(count)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                step()
            result["profile"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14)
    finally:
        PonderNet._forward_truncated = forward
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--truncation", type=float, nargs="+", default=[0.01, 0.05, 0.1, 0.2])
    parser.add_argument("--rule", choices=("cut", "roulette"), nargs="+", default=["cut"],
                        help="truncation rules (method.truncation_rule): each with every --truncation")
    parser.add_argument("--checkpoint", type=Path, help="start from this align model (default: a fresh one)")
    parser.add_argument("--batches", type=int, default=20, help="timed batches per truncation")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--profile", action="store_true", help="profile one more batch per truncation")
    args = parser.parse_args()

    if args.checkpoint:
        start, base, _ = load_model(args.checkpoint, "cpu")
    else:
        base = PonderConfig.of(step="align", seed=args.seed)
        torch.manual_seed(base.training.seed)
        start = new_model(base)
    print(f"{'fresh model' if args.checkpoint is None else args.checkpoint}, {args.batches} batches of "
          f"{base.training.batch_size}, {torch.get_num_threads()} thread(s)")
    images = load_mnist(default_data_dir(), train=True)  # once: every row trains on the same batches
    for rule in args.rule:
        for truncation in args.truncation:
            cfg = base.replace(truncation=truncation, truncation_rule=rule)
            result = run(copy.deepcopy(start), cfg, images, args.batches + 1, args.profile)
            print(f"{rule:<8} truncation {truncation:<5g} computed steps per image {result['steps']:5.2f}   "
                  f"ms per batch {result['ms']:7.1f} (median; mean {result['ms_mean']:.1f})", flush=True)
            if args.profile:
                print(result["profile"], flush=True)


if __name__ == "__main__":
    main()
