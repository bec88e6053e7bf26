"""Parity speed: training vectors per second, and seconds to a validation accuracy of 0.99,
for `ponder train --task parity` as the library runs it; and the vectors per second of this tree
paired against another commit's.

Three measurements, all through the library (tasks.parity's on-device batches, train.BatchStep,
train.train with its validation), nothing re-implemented here:

1. vectors/s (and iterations/s): --iterations training batches of --batch-size on fresh vectors
   (after the warm-up batches), the optimizer step included, no validation;
2. seconds to --target: `train.train` with epochs of --batches-per-epoch batches, stopped at the
   first epoch whose validation accuracy (the fixed validation set: 64 vectors per non-zero count
   of the training range, sampled halting) reaches --target; the seconds are the sum of the
   epochs' own times (training and validation), not counting set-up;
3. --against REV: measurement 1 in fresh processes, this tree (A) and commit REV's ponder_cli (B,
   a `git archive` snapshot, as benchmarks/paired.py makes) taking turns (A B, B A, ...), each
   measuring about --vectors vectors, --pairs pairs for every --batch-size and --threads given;
   each pair's speed-up is B's time over A's (vectors/s of A over B's): the medians of the
   pairs' ratios, with their quartiles, for wall and CPU time (the CPU time moves less with the
   machine's load at one thread; at two it counts both threads' work).

The default is the 16-element interpolation with the recipe the CLI implies for parity (gru with
LayerNorm, orthogonal recurrent blocks and update-gate bias 1; hidden 128; lambda_p 0.1; Adam 1e-3;
clipping at 1; 20 steps). Absolute figures need a quiet machine; --against pairs neighbouring
runs, which share the load. One thread by default (--threads).

    python benchmarks/parity_speed.py                      # 16 elements, measurements 1 and 2
    python benchmarks/parity_speed.py --elems 32 --max-epochs 60
    python benchmarks/parity_speed.py --only speed --elems 64 --batch-size 128 2048 --threads 1 2
    python benchmarks/parity_speed.py --elems 64 --against 0bbe561 --batch-size 128 2048 --threads 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# the ponder_cli measured: this tree's, or (a child of --against) the tree given by --child
_child_root = sys.argv[sys.argv.index("--child") + 1] if "--child" in sys.argv else str(ROOT)
sys.path.insert(0, _child_root)

import torch  # noqa: E402

from ponder_cli.config import PonderConfig  # noqa: E402
from ponder_cli.checkpoint import new_model  # noqa: E402
from ponder_cli.tasks import get_task  # noqa: E402
from ponder_cli.train import batch_step, train, train_one_epoch  # noqa: E402


class Reached(Exception):
    """Raised from the epoch callback once the target accuracy is reached."""


def timed_batches(cfg: PonderConfig, iterations: int, device: torch.device) -> dict:
    """Wall and CPU seconds of `iterations` training batches as `ponder train` runs them (on CUDA:
    captured and replayed), after a first epoch whose first batches warm up (and capture:
    BatchStep.warm_up)."""
    torch.manual_seed(cfg.training.seed)
    model = new_model(cfg).to(device)
    timed = cfg.replace(batches_per_epoch=iterations)
    source = get_task(timed).training_source(None, device)
    step = batch_step(model, timed, source, graphs=device.type == "cuda")
    warm_up = time.perf_counter()
    step.warm_up()  # under --compile: the compilation
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    warm_up = wall - warm_up
    train_one_epoch(step, progress=False)  # ends with a host read
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu, "warm_up": warm_up,
            "vectors": iterations * cfg.training.batch_size,
            "package": str(Path(sys.modules["ponder_cli"].__file__).parent)}


def iterations_per_second(cfg: PonderConfig, iterations: int, device: torch.device) -> float:
    return iterations / timed_batches(cfg, iterations, device)["wall"]


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


def config(args, batch_size: int) -> PonderConfig:
    given = dict(task="parity", elems=args.elems, step=args.step, method=args.method, batch_size=batch_size,
                 batches_per_epoch=args.batches_per_epoch, epochs=args.max_epochs, seed=args.seed, patience=0)
    if args.compile:
        given["compile"] = True
    if args.train_counts:
        given["train_counts"] = args.train_counts
    return PonderConfig.of(**given)


def paired(args) -> None:
    """Measurement 3: this tree (A) against commit args.against (B), per batch size and threads."""
    sys.path.insert(0, str(HERE))
    from paired import alternate, snapshot

    def child(root: Path, batch: int, threads: int, compiled: bool = False) -> dict:
        iterations = max(5, args.vectors // batch)
        command = [sys.executable, __file__, "--child", str(root), *(["--compile"] if compiled else []),
                   "--elems", str(args.elems), "--step", args.step,
                   "--method", args.method, "--seed", str(args.seed), "--batch-size", str(batch),
                   "--threads", str(threads), "--iterations", str(iterations), "--device", args.device,
                   *(["--train-counts", args.train_counts] if args.train_counts else [])]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SystemExit(done.stderr)
        result = json.loads(done.stdout.splitlines()[-1])
        if Path(result["package"]).parent != root:
            raise SystemExit(f"measured {result['package']}, not the ponder_cli of {root}")
        return result

    def quartiles(values: list) -> tuple:
        values = sorted(values)
        return tuple(statistics.quantiles(values, n=4)) if len(values) > 1 else (values[0],) * 3

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        against = snapshot(args.against, Path(scratch))
        print(f"A: {ROOT}, B: {args.against}; load average before: {os.getloadavg()[0]:.2f}, "
              f"{os.cpu_count()} CPUs", file=sys.stderr)
        for batch in args.batch_size:
            for threads in args.threads:
                print(f"batch {batch}, {threads} thread(s):", file=sys.stderr, flush=True)
                results = alternate(lambda: child(ROOT, batch, threads, args.compile),
                                    lambda: child(against, batch, threads),
                                    args.pairs)
                row = {"batch_size": batch, "threads": threads, "pairs": len(results)}
                for side, index in (("a", 0), ("b", 1)):
                    row[f"{side}_vectors_per_second"] = round(statistics.median(
                        r[index]["vectors"] / r[index]["wall"] for r in results))
                    # the first batches (under --compile: the compilation, from the cache after the first)
                    row[f"{side}_warm_up_seconds"] = [round(r[index].get("warm_up", 0.0), 1) for r in results]
                for key in ("wall", "cpu"):
                    ratios = [b[key] / a[key] for a, b in results]  # B's time over A's: A's speed-up
                    low, median, high = quartiles(ratios)
                    row[f"speedup_{key}"] = [round(median, 3), round(low, 3), round(high, 3)]
                rows.append(row)
                print(f"  A {row['a_vectors_per_second']} vectors/s (warm-up {row['a_warm_up_seconds']} s), "
                      f"B {row['b_vectors_per_second']}; A / B "
                      f"{row['speedup_wall'][0]:.3f} wall (quartiles {row['speedup_wall'][1]:.3f}-"
                      f"{row['speedup_wall'][2]:.3f}), {row['speedup_cpu'][0]:.3f} CPU", file=sys.stderr, flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    print(json.dumps({"elems": args.elems, "step": args.step, "method": args.method, "against": args.against,
                      **({"compile": True} if args.compile else {}),
                      "rows": rows}))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--elems", type=int, default=16)
    p.add_argument("--train-counts", default=None, help="LO-HI (default 1-elems: interpolation)")
    p.add_argument("--step", default="gru", choices=("gru", "rnn"))
    p.add_argument("--method", default="pondernet", choices=("pondernet", "act", "plain"))
    p.add_argument("--batch-size", type=int, nargs="+", default=[128], help="one or more (measurements 1 and 3)")
    p.add_argument("--iterations", type=int, default=500, help="timed training batches (measurement 1)")
    p.add_argument("--batches-per-epoch", type=int, default=500, help="validation every this many batches (2)")
    p.add_argument("--max-epochs", type=int, default=40)
    p.add_argument("--target", type=float, default=0.99)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, nargs="+", default=[1], help="one or more (measurements 1 and 3)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--only", choices=("speed", "target"), default=None)
    p.add_argument("--against", metavar="REV", help="measurement 3: pair this tree against commit REV")
    p.add_argument("--pairs", type=int, default=6, help="--against: pairs per batch size and threads")
    p.add_argument("--vectors", type=int, default=65536, help="--against: vectors per measurement (about)")
    p.add_argument("--compile", action="store_true", help=(
        "train with --compile (torch.compile); with --against, this tree's side only (--against HEAD: compiled "
        "against eager); the warm-up seconds say the compilation's"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.against:
        return paired(args)
    device = torch.device(args.device)
    if args.child:  # one measurement of --against's, in this process
        torch.set_num_threads(args.threads[0])
        print(json.dumps(timed_batches(config(args, args.batch_size[0]), args.iterations, device)))
        return
    if args.only != "speed" and (len(args.batch_size) > 1 or len(args.threads) > 1):
        p.error("seconds to --target takes one --batch-size and one --threads (or --only speed)")
    results = []
    for batch in args.batch_size:
        for threads in args.threads:
            torch.set_num_threads(threads)
            cfg = config(args, batch)
            result = {"elems": cfg.task.elems, "train_counts": cfg.task.train_counts, "step": cfg.step.name,
                      "method": cfg.method.name, "batch_size": cfg.training.batch_size, "threads": threads,
                      "device": str(device)}
            if args.only in (None, "speed"):
                timed = timed_batches(cfg, args.iterations, device)
                result["iterations_per_second"] = round(args.iterations / timed["wall"], 1)
                result["vectors_per_second"] = round(timed["vectors"] / timed["wall"])
                result["warm_up_seconds"] = round(timed["warm_up"], 1)
                print(f"batch {batch}, {threads} thread(s): {result['vectors_per_second']} vectors/s "
                      f"({result['iterations_per_second']} iterations/s)", file=sys.stderr, flush=True)
            if args.only in (None, "target"):
                result["to_target"] = seconds_to_target(cfg, args.target, device)
            results.append(result)
    print(json.dumps(results[0] if len(results) == 1 else results))


if __name__ == "__main__":
    main()
