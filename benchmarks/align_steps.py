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
from ponder_cli.data import default_data_dir, load_mnist  # noqa: E402
from ponder_cli.methods import get_method  # noqa: E402
from ponder_cli.runtime import grad_scaler  # noqa: E402
from ponder_cli.tasks import get_task  # noqa: E402
from ponder_cli.train import _optimizer_step, make_optimizer  # noqa: E402


def batches(cfg: PonderConfig, count: int) -> list:
    """The first `count` training batches of an epoch (shuffled, rotated as in training)."""
    images = load_mnist(default_data_dir(), train=True)
    torch.manual_seed(cfg.training.seed)
    source = get_task(cfg).training_source(images, torch.device("cpu"))
    source.start_epoch()
    return [source.batch(i) for i in range(count)]


def run(model, cfg: PonderConfig, data: list, profile: bool) -> dict:
    """Train `model` on `data` (the first batch a warm-up); steps per image and ms per batch."""
    method, device = get_method(cfg), torch.device("cpu")
    optimizer, scaler = make_optimizer(model, cfg, device), grad_scaler(device, False)
    params = list(model.parameters())
    model.train()
    torch.manual_seed(cfg.training.seed)  # the same dropout and coins for every truncation
    times, steps = [], []
    for i, (x, targets) in enumerate(data):
        start = time.perf_counter()
        out, *_ = _optimizer_step(model, method, optimizer, scaler, params, x, targets, cfg, amp=False)
        if i > 0:
            times.append(time.perf_counter() - start)
            steps.append(out.computed.float().mean().item())
    result = {"steps": statistics.mean(steps), "ms": 1000 * statistics.median(times),
              "ms_mean": 1000 * statistics.mean(times)}
    if profile:
        x, targets = data[-1]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            _optimizer_step(model, method, optimizer, scaler, params, x, targets, cfg, amp=False)
        result["profile"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14)
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
        base = PonderConfig.from_options(step="align", seed=args.seed)
        torch.manual_seed(base.training.seed)
        start = new_model(base)
    data = batches(base, args.batches + 1)
    print(f"{'fresh model' if args.checkpoint is None else args.checkpoint}, {args.batches} batches of "
          f"{base.training.batch_size}, {torch.get_num_threads()} thread(s)")
    for rule in args.rule:
        for truncation in args.truncation:
            cfg = base.replace(truncation=truncation, truncation_rule=rule)
            result = run(copy.deepcopy(start), cfg, data, args.profile)
            print(f"{rule:<8} truncation {truncation:<5g} computed steps per image {result['steps']:5.2f}   "
                  f"ms per batch {result['ms']:7.1f} (median; mean {result['ms_mean']:.1f})", flush=True)
            if args.profile:
                print(result["profile"], flush=True)


if __name__ == "__main__":
    main()
