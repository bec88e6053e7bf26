"""Paired, alternating timings: A against B on a shared, noisy machine.

    python benchmarks/paired.py epoch --b cnn_dropout_mask=shared          # one config against another
    python benchmarks/paired.py epoch --against main                       # this tree against main's
    python benchmarks/paired.py epoch --mnist --b reference_step=true      # against the notebook's step
    python benchmarks/paired.py epoch --mnist --b checkpoint=runs/X/best.pt  # against a trained model
    python benchmarks/paired.py command --against main -- train --train-size 256 --val-size 128
    python benchmarks/paired.py command --against HEAD~1 -- eval --limit 100

A single timing says little when the same command takes 12 s or 57 s within an hour. Here every
measurement runs in a fresh process, A and B take turns (A B, B A, A B, ...: neither always runs
second), and each pair gives the ratio B / A of two neighbouring runs, which shares their load.
Reported: each side's median, and the ratios' median, quartiles and range, for wall time and for
CPU time (user + system; steadier under load, with one thread per process).

`epoch` times training batches in-process (`--batches`, synthetic digits unless --mnist) after one
warm-up batch (`--b reference_step=true`: B trains with the reference notebook's step function,
which reruns the CNN at every step, as benchmarks/speed.py's reference-style figures do;
`--b checkpoint=runs/X/best.pt`: B trains on from that model with its configuration, so a step
whose cost follows the halting is timed as it halts once trained; `--a shrink=true --b
shrink=false`: a truncated forward that drops the inputs that are done against the mask over
every step, train.BatchStep's two forms); `command` times a whole
`python -m ponder_cli ...` process, start-up included, in a fresh working folder. `--against REV` runs B from a snapshot of commit REV (`git archive`, in a
temporary folder): the same measuring code, REV's ponder_cli.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# --- one measurement, in a child process whose ponder_cli comes from --root ----------------------

def measure_epoch(root: Path, changes: dict, batches: int, mnist: bool) -> dict:
    """Wall and CPU seconds of `batches` training batches of the reference configuration."""
    sys.path.insert(0, str(root))
    sys.path.insert(0, str(ROOT / "tests"))  # synthetic_data: this tree's digits, whichever ponder_cli runs
    import torch

    from ponder_cli.checkpoint import new_model
    from ponder_cli.config import PonderConfig
    try:  # the model's core in one module, MNIST's data in its task
        from ponder_cli.model import get_method, grad_scaler
        from ponder_cli.tasks.mnist import default_data_dir, load_mnist
    except ImportError:  # earlier trees: methods.py, runtime.py, data.py
        from ponder_cli.data import default_data_dir, load_mnist
        from ponder_cli.methods import get_method
        from ponder_cli.runtime import grad_scaler
    from ponder_cli.train import make_optimizer, train_one_epoch
    from synthetic_data import synthetic_digits

    reference = changes.pop("reference_step", False)
    shrink = changes.pop("shrink", None)  # the truncated forward's form: true shrinks, false masks
    checkpoint = changes.pop("checkpoint", None)
    if checkpoint is not None:  # a trained model, with its own configuration (changed by the rest)
        from ponder_cli.checkpoint import load_model

        model, cfg, _ = load_model(checkpoint, "cpu")
        cfg = cfg.replace(**changes)
    else:
        cfg = PonderConfig.of(**changes)
    count = (batches + 1) * cfg.training.batch_size
    images = load_mnist(default_data_dir(), train=True).subset(slice(0, count)) if mnist else synthetic_digits(count, 0)
    torch.manual_seed(cfg.training.seed)
    if checkpoint is None:
        model = new_model(cfg)
    device = torch.device("cpu")
    method, optimizer, scaler = get_method(cfg), make_optimizer(model, cfg, device), grad_scaler(device, False)
    if reference:  # the reference notebook's step function: its CNN runs again at every step
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from speed import reference_style_forward

        model.forward = lambda x, stop=None: reference_style_forward(model, x)

    import ponder_cli.train as training

    def epoch(data):
        if hasattr(training, "BatchStep"):  # the training batch as one object (ponder_cli 0.3 on)
            train_one_epoch(training.batch_step(model, cfg, data, optimizer=optimizer, scaler=scaler, shrink=shrink),
                            progress=False)
        else:
            train_one_epoch(model, method, optimizer, scaler, data, cfg, amp=False, progress=False)

    epoch(images.subset(slice(0, cfg.training.batch_size)))  # warm-up: first-call costs are not an epoch's
    timed = images.subset(slice(cfg.training.batch_size, count))
    wall, cpu = time.perf_counter(), time.process_time()
    epoch(timed)
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
            "package": str(Path(sys.modules["ponder_cli"].__file__).parent)}


def measure_command(root: Path, args: list[str]) -> dict:
    """Wall and CPU seconds of a whole `python -m ponder_cli ARGS` process, in a fresh folder."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as cwd:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "ponder_cli", *args], cwd=cwd, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"ponder {' '.join(args)} failed in {root}:\n{done.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu}


# --- the pairs --------------------------------------------------------------------------------

def snapshot(rev: str, into: Path) -> Path:
    """The tracked files of commit `rev` in a folder of `into`."""
    folder = into / "against"
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev],
                             capture_output=True, check=True).stdout
    folder.mkdir()
    with tempfile.TemporaryFile() as tar_file:
        tar_file.write(archive)
        tar_file.seek(0)
        with tarfile.open(fileobj=tar_file) as tar:
            tar.extractall(folder, filter="data")
    return folder


def run_child(root: Path, mode: str, changes: list[str], args) -> dict:
    command = [sys.executable, __file__, mode, "--child", str(root), "--batches", str(args.batches),
               *(["--mnist"] if args.mnist else []), *[f"--set={c}" for c in changes]]
    if args.ponder_args:
        command += ["--", *args.ponder_args]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    result = json.loads(done.stdout.splitlines()[-1])
    if "package" in result and Path(result["package"]).parent != root:
        raise SystemExit(f"measured {result['package']}, not the ponder_cli of {root}")
    return result


def alternate(measure_a, measure_b, pairs: int) -> list[tuple[dict, dict]]:
    """`pairs` pairs of measurements, the order flipped every pair (A B, B A, ...)."""
    results = []
    for i in range(pairs):
        if i % 2 == 0:
            a = measure_a()
            b = measure_b()
        else:
            b = measure_b()
            a = measure_a()
        results.append((a, b))
        print(f"  pair {i + 1:2d}: A {a['wall']:7.3f} s  B {b['wall']:7.3f} s  B/A {b['wall'] / a['wall']:.3f} (wall), "
              f"{b['cpu'] / a['cpu']:.3f} (cpu)", file=sys.stderr)
    return results


def summary(results: list[tuple[dict, dict]], key: str) -> str:
    a = [r[0][key] for r in results]
    b = [r[1][key] for r in results]
    ratios = sorted(y / x for x, y in zip(a, b))
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return (f"{key:4s}  A {statistics.median(a):7.3f} s  B {statistics.median(b):7.3f} s   "
            f"B/A median {statistics.median(ratios):.3f}, quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}, "
            f"range {ratios[0]:.3f}-{ratios[-1]:.3f} ({len(ratios)} pairs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("epoch", "command"))
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--against", metavar="REV", help="B is commit REV's ponder_cli (default: this tree's)")
    parser.add_argument("--a", action="append", default=[], metavar="FIELD=VALUE",
                        help="epoch: a config change for A; checkpoint=PATH starts from a trained model and its "
                             "configuration, reference_step=true runs the reference notebook's step function")
    parser.add_argument("--b", action="append", default=[], metavar="FIELD=VALUE", help="epoch: a config change for B")
    parser.add_argument("--batches", type=int, default=40, help="epoch: training batches timed per measurement")
    parser.add_argument("--mnist", action="store_true", help="epoch: MNIST from $PONDER_DATA_DIR, not synthetic digits")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--set", action="append", default=[], help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)  # command: the ponder arguments follow --
    args = parser.parse_args(argv[:split])
    args.ponder_args = argv[split + 1:]

    if args.child is not None:  # one measurement
        if args.mode == "epoch":
            changes = {}
            for change in args.set:
                field, value = change.split("=", 1)
                changes[field] = json.loads(value) if value[:1].isdigit() or value in ("true", "false") else value
            result = measure_epoch(args.child, changes, args.batches, args.mnist)
        else:
            result = measure_command(args.child, args.ponder_args)
        print(json.dumps(result))
        return

    if args.mode == "command" and not args.ponder_args:
        parser.error("command: give the ponder arguments after --")
    with tempfile.TemporaryDirectory() as scratch:
        root_b = snapshot(args.against, Path(scratch)) if args.against else ROOT
        what = " ".join(args.ponder_args) if args.mode == "command" else f"{args.batches} training batches"
        print(f"{args.mode}: {what}\n  A: {ROOT} {' '.join(args.a)}\n  B: {args.against or ROOT} {' '.join(args.b)}\n"
              f"  load average before: {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs", file=sys.stderr)
        results = alternate(lambda: run_child(ROOT, args.mode, args.a, args),
                            lambda: run_child(root_b, args.mode, args.b, args), args.pairs)
    print(summary(results, "wall"))
    print(summary(results, "cpu"))
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
