"""Speed and memory of training and evaluation in the reference configuration.

    python benchmarks/speed.py --device cpu               # real MNIST from $PONDER_DATA_DIR
    python benchmarks/speed.py --device cpu --synthetic   # generated images, no data needed
    python benchmarks/speed.py --device cuda --step align --profile out/   # + a profiler trace

Prints training images/s and seconds per epoch (55,000 images at +-22.5 degrees, batch 128,
20 steps, plus the 5,000-image validation pass), peak memory, evaluation images/s with real
early exit and with all 20 steps forced (and checks they agree), a four-angle extrapolation,
and the same figures for a reference-style step function that recomputes the CNN at every step.

Training runs what `ponder train` runs: the library's epoch (train.train_one_epoch) with its
optimizer (Adam, fused on CUDA) and GradScaler (on with fp16), in float32 unless --amp, as
`ponder train` has it.

Its figures are single runs: to compare two versions or two configurations on a busy machine,
use benchmarks/paired.py (paired, alternating runs and their ratios).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synthetic_data: digits without MNIST

from ponder_cli.config import PonderConfig  # noqa: E402
from ponder_cli.tasks.mnist import (default_data_dir, evaluate, evaluation_draws, load_mnist, prepare_batch,
                                    train_val_split, uniform_angles)  # noqa: E402
from ponder_cli.checkpoint import new_model
from ponder_cli.model import PonderNet, PonderOutput, get_method, grad_scaler, resolve_device  # noqa: E402
from synthetic_data import synthetic_digits  # noqa: E402
from host_reads import DeviceSyncs, count_host_reads  # noqa: E402
from ponder_cli.train import batch_step, make_optimizer, train_one_epoch  # noqa: E402

# a Chrome trace of more batches is too large to open (and to bring back from a GPU machine)
TRACE_BATCHES = 40
# batches whose host reads are counted (host_reads.count_host_reads, the suite's one counter)
COUNTED_BATCHES = 8


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeat: int = 1):
    """Best of `repeat` wall times (seconds) and the last result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        sync(device)
        start = time.perf_counter()
        result = fn()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best, result


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def reference_style_forward(model: PonderNet, x: torch.Tensor) -> PonderOutput:
    """The reference notebook's step function: the CNN runs again at every step."""
    h, states = None, []
    for _ in range(model.max_steps):
        h = model.step.mlp(model.step.mlp.from_embedding(model.step.encoder(x)), h)
        states.append(h)
    states = torch.stack(states)
    return PonderOutput(*model.heads(states))


@torch.inference_mode()
def reference_style_infer(model: PonderNet, x: torch.Tensor, uniforms: torch.Tensor, early_exit: bool) -> torch.Tensor:
    """Reference-style evaluation (CNN every step), with or without compacting halted images."""
    steps = torch.full((x.shape[0],), model.max_steps, dtype=torch.long, device=x.device)
    halted = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    active = torch.arange(x.shape[0], device=x.device)
    h = None
    for n in range(model.max_steps - 1):
        h = model.step.mlp(model.step.mlp.from_embedding(model.step.encoder(x[active])), h)
        fires = uniforms[n, active] < torch.sigmoid(model.heads(h)[1].float())
        newly = fires & ~halted[active]
        steps[active[newly]] = n + 1
        halted[active[newly]] = True
        if early_exit:
            if bool(halted.all()):
                break
            active, h = active[~fires], h[~fires]
    return steps


def profile_training(model, optimizer, scaler, data, cfg, device, amp: bool, out: Path) -> None:
    """One pass over `data` under torch.profiler: summary tables (and for a few batches a Chrome
    trace) in `out`, the busiest ops on stdout, the kernel launches per batch that the CUDA runtime
    recorded, and the host reads per batch (tests/host_reads.py)."""
    from torch.profiler import ProfilerActivity, profile

    out.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=activities, record_shapes=False) as prof:
        train_one_epoch(batch_step(model, cfg, data, amp=amp, optimizer=optimizer, scaler=scaler,
                                   graphs=device.type == "cuda"), progress=False)
        sync(device)
    batches = -(-len(data) // cfg.training.batch_size)
    if batches <= TRACE_BATCHES:
        prof.export_chrome_trace(str(out / "train_trace.json"))
    averages = prof.key_averages()
    by_device = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    tables = {"by_device_time": averages.table(sort_by=by_device, row_limit=40),
              "by_cpu_time": averages.table(sort_by="self_cpu_time_total", row_limit=40),
              "by_calls": averages.table(sort_by="count", row_limit=40)}
    for name, table in tables.items():
        (out / f"train_profile_{name}.txt").write_text(table)
    counts = {e.key: e.count for e in averages}
    launches = counts.get("cudaLaunchKernel", 0) + counts.get("cuLaunchKernel", 0) + counts.get("cudaLaunchKernelExC", 0)
    # counted as the suite counts them, on an eager pass of its own (a dispatch mode slows what it
    # watches, and a replay issues no operator): what a captured batch would have to do without
    counted = min(batches, COUNTED_BATCHES)
    subset = data.subset(slice(0, counted * cfg.training.batch_size))
    def counted_pass():
        return count_host_reads(lambda: train_one_epoch(batch_step(model, cfg, subset, amp=amp, optimizer=optimizer,
                                                                   scaler=scaler, graphs=False), progress=False))
    if device.type == "cuda":
        with DeviceSyncs() as device_syncs:  # CUDA's own count: the reads below are among them
            syncs = counted_pass()
    else:
        syncs = counted_pass()
    trace = f"{out}/train_trace.json, " if batches <= TRACE_BATCHES else ""
    print(f"\nprofile of {batches} training batches: {trace}{out}/train_profile_*.txt")
    print(f"  kernel launches per batch  {launches / batches:8.1f}")
    print(f"  host reads per batch       {sum(syncs.values()) / counted:8.2f}   {dict(syncs)} "
          f"(over {counted} batches)")
    if device.type == "cuda":
        print(f"  device syncs per batch     {device_syncs.count / counted:8.2f}   (CUDA's sync debug mode)")
    print("\n".join(tables["by_device_time"].splitlines()[:25]))


def evaluation_figures(model, test, cfg, device, amp: bool, halting: str = "sample") -> None:
    print(f"\nevaluation (10,000 test images, +-22.5 deg, halting {halting})")
    early_s, early = timed(lambda: evaluate(model, test, cfg, max_angle=22.5, seed=1, amp=amp, halting=halting),
                           device, repeat=2)
    forced_s, forced = timed(lambda: evaluate(model, test, cfg, max_angle=22.5, seed=1, early_exit=False, amp=amp,
                                              halting=halting), device, repeat=2)
    print(f"  mean ponder steps       {early.mean_steps:10.2f} of {cfg.method.max_steps}")
    print(f"  early exit images/s     {len(test) / early_s:10.0f}   ({early_s:.3f} s)")
    print(f"  all steps forced        {len(test) / forced_s:10.0f}   ({forced_s:.3f} s)")
    print(f"  speed-up                {forced_s / early_s:10.2f}x   identical results: {early == forced}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--step", default="mlp", help="step function (its own defaults apply: see PonderConfig)")
    parser.add_argument("--amp", action=argparse.BooleanOptionalAction, default=False,
                        help="mixed precision (fp16 with the GradScaler on CUDA, bf16 on CPU); default: off, as in "
                             "ponder train")
    parser.add_argument("--checkpoint", default=None,
                        help="time evaluation on this trained model: a file, a run folder or a shipped name such as align "
                             "(its config replaces --step's)")
    parser.add_argument("--synthetic", action="store_true", help="generated images instead of MNIST")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--train-batches", type=int, default=0,
                        help="time only this many training batches and scale up (0: a whole epoch)")
    parser.add_argument("--profile", type=Path, default=None,
                        help="also profile the timed training batches into this folder: summary tables, and a "
                             f"Chrome trace when they are at most {TRACE_BATCHES} (see --train-batches)")
    parser.add_argument("--train-only", action="store_true", help="stop after the training figures")
    parser.add_argument("--halting", default="sample",
                        help="the halting rule of the evaluation figures (align step; e.g. confidence:0.999)")
    args = parser.parse_args()

    device = resolve_device(args.device)
    cfg = PonderConfig.of(step=args.step)  # the reference configuration of that step
    if args.synthetic:
        full, test = synthetic_digits(60_000, 0), synthetic_digits(10_000, 1)
        source = "synthetic"
    else:
        data_dir = args.data_dir or default_data_dir()
        full, test = load_mnist(data_dir, train=True), load_mnist(data_dir, train=False)
        source = f"MNIST from {data_dir}"
    train_set, val_set = train_val_split(full, val_size=cfg.task.val_size, train_size=cfg.task.train_size,
                                         seed=cfg.training.seed)
    train_set, val_set, test = train_set.to(device), val_set.to(device), test.to(device)
    print(f"device {device}, {torch.get_num_threads()} CPU threads, torch {torch.__version__}, data: {source}, "
          f"step {cfg.step.name} (max {cfg.method.max_steps} steps, truncation {cfg.method.truncation:g}), "
          f"amp {args.amp}")

    torch.manual_seed(cfg.training.seed)
    model = new_model(cfg).to(device)
    method = get_method(cfg, device)
    optimizer = make_optimizer(model, cfg, device)
    scaler = grad_scaler(device, args.amp)

    # --- training: one epoch of the reference configuration, then the validation pass
    epoch_set = (train_set if not args.train_batches
                 else train_set.subset(slice(0, args.train_batches * cfg.training.batch_size)))
    # as `ponder train` runs it: on CUDA captured once and replayed
    step = batch_step(model, cfg, epoch_set, amp=args.amp, optimizer=optimizer, scaler=scaler,
                      graphs=device.type == "cuda")
    if device.type == "cuda":  # CUDA context, cuDNN and cuBLAS handles, the capture: not an epoch's cost
        step.warm_up()
    train_s, stats = timed(lambda: train_one_epoch(step, progress=False), device)
    train_s *= len(train_set) / len(epoch_set)
    val_s, val = timed(lambda: evaluate(model, val_set, cfg, max_angle=cfg.task.train_rotation, seed=cfg.training.seed,
                                        amp=args.amp), device)
    print(f"\ntraining (55,000 images at +-22.5 deg, batch 128, {cfg.method.max_steps} steps)")
    print(f"  train images/s          {len(train_set) / train_s:10.0f}")
    print(f"  seconds per epoch       {train_s + val_s:10.2f}   (train {train_s:.2f} + validation {val_s:.2f})")
    print(f"  20 epochs, estimated    {20 * (train_s + val_s) / 60:10.2f} min")
    print(f"  expected steps (training){stats['steps']:10.2f}")
    print(f"  GradScaler {'on' if scaler.is_enabled() else 'off'}, back-offs {stats['scaler_backoffs']}, "
          f"skipped {stats['skipped_batches']}; Adam fused: {bool(optimizer.defaults['fused'])}")
    if args.profile is not None:
        profile_training(model, optimizer, scaler, epoch_set, cfg, device, args.amp, args.profile)
    if args.train_only:
        return
    if args.checkpoint is not None:
        from ponder_cli.checkpoint import load_model
        from ponder_cli.folders import resolve_checkpoint
        args.checkpoint = resolve_checkpoint(args.checkpoint).path  # a file, a run folder or a shipped name
        model, cfg, _ = load_model(args.checkpoint, device)
        print(f"\nevaluating {args.checkpoint} (step {cfg.step.name}, max {cfg.method.max_steps} steps)")
    if cfg.step.name != "mlp":
        evaluation_figures(model, test, cfg, device, args.amp, args.halting)
        print("\nmemory")
        print(f"  peak RSS                {peak_rss_mb():10.0f} MB")
        return

    # --- the step function: ours (CNN once per image) against the reference's (CNN every step)
    batch = cfg.training.batch_size
    x = prepare_batch(train_set.images[:batch], uniform_angles(batch, 22.5, device=device))
    y = train_set.labels[:batch]

    def train_step(forward):
        out = forward(x)
        loss = method.loss(out.logits, out.lambda_logits, y, out.computed).total  # the method's own loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return loss

    model.train()
    ours_step, _ = timed(lambda: train_step(model), device, repeat=10)
    ref_step, _ = timed(lambda: train_step(lambda t: reference_style_forward(model, t)), device, repeat=3)
    print(f"  forward+backward, one batch (float32): ours {ours_step * 1e3:.1f} ms, reference-style "
          f"{ref_step * 1e3:.1f} ms ({ref_step / ours_step:.1f}x)")

    # --- evaluation on the 10,000 test images: real early exit against all 20 steps forced
    print("\nevaluation (10,000 test images, +-22.5 deg, sampled halting)")
    early_s, early = timed(lambda: evaluate(model, test, cfg, max_angle=22.5, seed=1), device, repeat=3)
    forced_s, forced = timed(lambda: evaluate(model, test, cfg, max_angle=22.5, seed=1, early_exit=False), device, repeat=3)
    same = early == forced
    print(f"  mean ponder steps       {early.mean_steps:10.2f} of {cfg.method.max_steps}")
    print(f"  early exit images/s     {len(test) / early_s:10.0f}   ({early_s:.3f} s)")
    print(f"  all steps forced        {len(test) / forced_s:10.0f}   ({forced_s:.3f} s)")
    print(f"  speed-up                {forced_s / early_s:10.2f}x   identical results: {same}")

    model.eval()
    angles, uniforms = evaluation_draws(len(test), cfg.method.max_steps, 22.5, 1, device)
    xs = [prepare_batch(test.images[i:i + 1000], angles[i:i + 1000]) for i in range(0, len(test), 1000)]
    ref_early_s, ref_steps = timed(lambda: [reference_style_infer(model, xb, uniforms[:, i * 1000:(i + 1) * 1000], True)
                                            for i, xb in enumerate(xs)], device)
    ref_forced_s, _ = timed(lambda: [reference_style_infer(model, xb, uniforms[:, i * 1000:(i + 1) * 1000], False)
                                     for i, xb in enumerate(xs)], device)
    print(f"  reference-style step (CNN every step): early exit {ref_early_s:.3f} s, forced {ref_forced_s:.3f} s "
          f"({ref_forced_s / ref_early_s:.2f}x); ours with early exit is {ref_forced_s / early_s:.1f}x faster "
          "than the reference-style forced run")

    four_s, _ = timed(lambda: [evaluate(model, test, cfg, max_angle=a, seed=1) for a in (22.5, 45, 67.5, 90)], device)
    print(f"  extrapolate, four angles {four_s:9.2f} s")

    print("\nmemory")
    print(f"  peak RSS                {peak_rss_mb():10.0f} MB")
    if device.type == "cuda":
        print(f"  peak CUDA allocated     {torch.cuda.max_memory_allocated(device) / 2**20:10.0f} MB")


if __name__ == "__main__":
    main()
