"""The paper's parity runs carried forward one working stretch (a window) at a time, on a GPU
machine (benchmarks/gpu_parity.sh) or on this CPU, in the background.

    python benchmarks/parity_campaign.py --out OUT --budget-s 540   # one window on a GPU machine
    OMP_NUM_THREADS=1 nohup python benchmarks/parity_campaign.py --out OUT --device cpu \
        --stage parity64-prefix --budget-s 2h &                     # a long window on the CPU
    python benchmarks/parity_campaign.py --out OUT --cpu-smoke      # the plumbing, tiny, on the CPU

The campaign is a list of stages, each one run kept in benchmarks/parity_campaign/ as one
resumable checkpoint (STAGE.pt), its epochs (STAGE.metrics.csv) and one log of every window
(log.md, a Markdown table). 64 elements, trained on every count 1-64 and tested on counts 1-16,
17-32, 33-48, 49-64:

    parity64             scattered, raw: the run a GPU machine began (batch 2048)
    parity64-prefix      the ACT line's prefix layout, PonderNet, batch 128 (Fojo et al.'s)
    parity64-prefix-act  the same with ACT, tau 1e-2 (Fojo et al.'s ACT anchor)
    parity64-prefix-act-rnn  the same with the rnn step, 128 tanh units (Fojo et al.'s network)
    parity64-onehot      scattered, each entry one-hot over {-1, 0, +1}, PonderNet, batch 128
    parity64-square      scattered, each entry as x and x^2, PonderNet, batch 128

96 elements trained on counts 1-48 (the paper's extrapolation), x and x^2, batch 128; tested on
1-24, 25-48 (trained) and 49-72, 73-96 (never seen):

    parity96-pondernet   PonderNet
    parity96-act         ACT, tau 1e-2

A window works on the stage named (--stage; once done, only with --past-target), else the first
one not done: it resumes that stage's checkpoint (or starts the run, with what `--task parity`
derives above 32 elements), trains with `--time-limit` for what the budget leaves after
evaluating, evaluates the new last.pt per count range (Wilson 95% intervals, mean steps,
Spearman rho(count, steps) over every vector), replaces the stage's checkpoint with it and
appends one row to the log. A stage is done once every range it trained on reaches TARGET (64
elements: every range; 96: 1-24 and 25-48, the extrapolation being what is measured, not
demanded).

--cpu-smoke rehearses all of it in OUT on the CPU: the tracked 64-element checkpoint copied and
evaluated on a few vectors (it cannot train on a CPU in minutes), then stand-in stages of 8 and
12 elements, trained for seconds: a window that leaves its stage undone, one that resumes it,
one for each stage after, and one that finds the campaign complete. The tracked files are
never touched.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

STARTED = time.monotonic()  # the budget counts from here: importing torch is part of a window
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CAMPAIGN = ROOT / "benchmarks" / "parity_campaign"
TARGET = 0.99
MAX_BYTES = 2 * 2 ** 20  # a tracked checkpoint stays a small file
EPOCHS = 100_000  # the run's planned epochs: a window ends at its time limit, never at this
LOG_HEADER = ("| date (UTC) | stage | GPU | torch | epochs | vectors | minutes | accuracy [95%] / mean steps, "
              "by count range | ρ(count, steps) |\n|---|---|---|---|---|---|---|---|---|\n")


@dataclass(frozen=True)
class Stage:
    name: str
    settings: dict  # what `ponder train` is given when the stage starts
    ranges: tuple  # the count ranges it is tested on, "LO-HI"
    trained: tuple  # those that must reach TARGET


RANGES_64, RANGES_96 = ("1-16", "17-32", "33-48", "49-64"), ("1-24", "25-48", "49-72", "73-96")
# Fojo et al.'s recipe where the stages follow it: batches of 128, the learning rate held, no early stop
SMALL_BATCHES = dict(batch_size=128, lr_patience=1000, patience=0)
ACT = dict(method="act", tau=0.01)
STAGES = (
    Stage("parity64", dict(task="parity", elems=64, seed=1), RANGES_64, RANGES_64),
    Stage("parity64-prefix", dict(task="parity", elems=64, layout="prefix", seed=1, **SMALL_BATCHES),
          RANGES_64, RANGES_64),
    Stage("parity64-prefix-act", dict(task="parity", elems=64, layout="prefix", seed=1, **SMALL_BATCHES, **ACT),
          RANGES_64, RANGES_64),
    # Fojo et al.'s own step: 128 tanh units (the paper's rnn) where the stage above runs the gru
    Stage("parity64-prefix-act-rnn", dict(task="parity", elems=64, layout="prefix", step="rnn", seed=1,
                                          **SMALL_BATCHES, **ACT), RANGES_64, RANGES_64),
    Stage("parity64-onehot", dict(task="parity", elems=64, encoding="onehot", seed=1, **SMALL_BATCHES),
          RANGES_64, RANGES_64),
    Stage("parity64-square", dict(task="parity", elems=64, encoding="square", seed=1, **SMALL_BATCHES),
          RANGES_64, RANGES_64),
    Stage("parity96-pondernet", dict(task="parity", elems=96, train_counts="1-48", encoding="square", seed=1,
                                     **SMALL_BATCHES), RANGES_96, RANGES_96[:2]),
    Stage("parity96-act", dict(task="parity", elems=96, train_counts="1-48", encoding="square", seed=1,
                               **SMALL_BATCHES, **ACT), RANGES_96, RANGES_96[:2]),
)
# the same plumbing at sizes a CPU trains in seconds, with the recipe of the real sizes (no early
# stop, the learning rate held: what --task parity derives above 32 elements)
TINY = dict(hidden=16, max_steps=3, batch_size=32, batches_per_epoch=4, patience=0, lr_patience=1000)
SMOKE_STAGES = (
    Stage("parity64", dict(task="parity", elems=8, seed=1, **TINY), ("1-2", "3-4", "5-6", "7-8"),
          ("1-2", "3-4", "5-6", "7-8")),
    Stage("parity96-pondernet", dict(task="parity", elems=12, train_counts="1-6", seed=1, **TINY),
          ("1-3", "4-6", "7-9", "10-12"), ("1-3", "4-6")),
    Stage("parity96-act", dict(task="parity", elems=12, train_counts="1-6", method="act", seed=1, **TINY),
          ("1-3", "4-6", "7-9", "10-12"), ("1-3", "4-6")),
)


def logged_accuracies(log: Path) -> dict:
    """stage -> {range: accuracy} of its latest row in the log."""
    latest = {}
    if log.is_file():
        for line in log.read_text(encoding="utf-8").splitlines():
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if len(cells) >= 8 and re.fullmatch(r"\d{4}-\d\d-\d\d.*", cells[0]):
                latest[cells[1]] = {lo_hi: float(acc) for lo_hi, acc in re.findall(r"(\d+-\d+): ([0-9.]+)", cells[7])}
    return latest


def done(stage: Stage, latest: dict, target: float) -> bool:
    accuracies = latest.get(stage.name)
    return bool(accuracies) and all(accuracies.get(lo_hi, 0.0) >= target for lo_hi in stage.trained)


def window(campaign: Path, work: Path, stages: tuple, *, budget_s: float, eval_s: float, limit: int,
           target: float, device: str, say=print, started: float | None = None,
           only: str | None = None, past_target: bool = False) -> dict | None:
    """One window: the stage named `only`, else the first stage not done, trained for what the
    budget (seconds from `started`, default now) leaves, evaluated, its checkpoint and epochs
    replaced and one row appended to the log; None once every stage is done (or the one named,
    unless `past_target`: a 96-element stage's extrapolation is measured further)."""
    from ponder_cli import PonderError
    from ponder_cli.api import EvalOptions, TrainOptions, evaluate_checkpoint, train_run

    started, log = time.monotonic() if started is None else started, campaign / "log.md"
    candidates = [s for s in stages if only is None or s.name == only]
    if not candidates:
        raise PonderError(f"no stage {only!r}; the stages are {', '.join(s.name for s in stages)}")
    stage = next((s for s in candidates if (past_target and only) or not done(s, logged_accuracies(log), target)),
                 None)
    if stage is None:
        say(f"{'the stage' if only else 'the campaign'} is complete: "
            f"{only or 'every stage'} reached {target} on its trained counts ({log})")
        return None
    tracked, run = campaign / f"{stage.name}.pt", work / stage.name
    shutil.rmtree(run, ignore_errors=True)
    if tracked.is_file():
        from ponder_cli.checkpoint import load_checkpoint

        epoch = load_checkpoint(tracked).epoch
        given, resume = {"epochs": epoch + EPOCHS}, tracked
        say(f"{stage.name}: resuming {tracked} (epoch {epoch})")
    else:
        given, resume = {**stage.settings, "epochs": EPOCHS}, None
        say(f"{stage.name}: starting the run ({', '.join(f'{k} {v}' for k, v in stage.settings.items())})")
    seconds = budget_s - eval_s - (time.monotonic() - started)
    if seconds <= 0:
        raise PonderError(f"the budget leaves no time to train; give more than {eval_s:.0f} s")
    def said(line: str) -> None:  # as it comes: a long window on the CPU is watched by its log
        if line.startswith(("epoch", "stopped", "using", "about", "CUDA")):
            say(f"  {line}")

    trained = train_run(given, TrainOptions(resume=resume, out=run, device=device, progress=False,
                                            time_limit=seconds), log=said)
    train_minutes = (time.monotonic() - started) / 60
    report = evaluate_checkpoint("eval", run / "last.pt", list(stage.ranges),
                                 EvalOptions(limit=limit, device=device))
    _replace(run / "last.pt", tracked)
    if (run / "metrics.csv").is_file():  # every epoch of the run so far (the history rides in the checkpoint)
        _replace(run / "metrics.csv", campaign / f"{stage.name}.metrics.csv")
    row = _row(stage, trained.meta, report, train_minutes, device)
    if not log.is_file():
        log.write_text(LOG_HEADER, encoding="utf-8")
    with open(log, "a", encoding="utf-8") as f:
        f.write(row + "\n")
    say(row)
    size = tracked.stat().st_size
    if size > MAX_BYTES:
        say(f"WARNING: {tracked} is {size / 2 ** 20:.1f} MiB, over the {MAX_BYTES / 2 ** 20:.0f} MiB a tracked file keeps to")
    return {"stage": stage.name, "epochs": trained.meta["epochs"], "stop_reason": trained.meta["stop_reason"],
            "done": done(stage, logged_accuracies(log), target), "row": row}


def _replace(source: Path, target: Path) -> None:
    """The tracked checkpoint replaced whole or not at all."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def _row(stage: Stage, meta: dict, report, minutes: float, device: str) -> str:
    import torch

    cfg = meta["config"]
    gpu = (torch.cuda.get_device_name(0) if device != "cpu" and torch.cuda.is_available()
           else f"CPU, {torch.get_num_threads()} thread{'s' * (torch.get_num_threads() > 1)}")
    vectors = meta["epochs"] * cfg["batches_per_epoch"] * cfg["batch_size"]
    ranges = "; ".join(f"{b['counts']}: {b['accuracy']:.4f} [{b['accuracy_wilson'][0]:.4f}, "
                       f"{b['accuracy_wilson'][1]:.4f}] / {b['mean_steps']:.1f}" for b in report.buckets)
    rho = report.meta["spearman"]["rho"]  # None where every vector took the same steps
    return (f"| {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} | {stage.name} | {gpu} | {torch.__version__} | "
            f"{meta['epochs']} | {vectors / 1e6:.1f}M | {minutes:.1f} | {ranges} | "
            f"{'-' if rho is None else format(rho, '+.3f')} |")


# a smoke window: a second of training (a few epochs of TINY), a quarter for its evaluation; the
# windows are wall-clock budgets, so this is most of the smoke's time
SMOKE_WINDOW = dict(budget_s=1.25, eval_s=0.25, limit=4, device="cpu")


def smoke(out: Path, say=print) -> None:
    """The whole plumbing on the CPU, in OUT: see the module's docstring."""
    from ponder_cli.api import EvalOptions, evaluate_checkpoint

    campaign, work = out / "campaign", out / "work"
    shutil.rmtree(campaign, ignore_errors=True)
    campaign.mkdir(parents=True)
    real = campaign / "tracked-parity64.pt"
    shutil.copyfile(CAMPAIGN / "parity64.pt", real)
    report = evaluate_checkpoint("eval", real, list(STAGES[0].ranges), EvalOptions(limit=2, device="cpu"))
    say("the tracked 64-element checkpoint, on 2 vectors per count: " +
        "; ".join(f"{b['counts']}: {b['accuracy']:.2f}" for b in report.buckets))
    # a target no run reaches keeps the first stage going (its second window resumes it); then
    # one that every run reaches moves the campaign on, stage after stage
    windows = ((1.01, "parity64"), (1.01, "parity64"), (0.0, "parity96-pondernet"), (0.0, "parity96-act"))
    epochs = []
    for target, expected in windows:
        result = window(campaign, work, SMOKE_STAGES, target=target, say=say, **SMOKE_WINDOW)
        assert result is not None and result["stage"] == expected, result
        assert result["stop_reason"] == "time limit" and result["done"] == (target == 0.0), result
        epochs.append(result["epochs"])
    assert epochs[1] > epochs[0], epochs  # the second window went on from the first's checkpoint
    assert window(campaign, work, SMOKE_STAGES, target=0.0, say=say, **SMOKE_WINDOW) is None
    # a stage named works on that stage alone: once done, only when told to go past its target
    assert window(campaign, work, SMOKE_STAGES, target=0.0, say=say, only="parity96-act", **SMOKE_WINDOW) is None
    named = window(campaign, work, SMOKE_STAGES, target=0.0, say=say, only="parity96-act", past_target=True,
                   **SMOKE_WINDOW)
    assert named is not None and named["stage"] == "parity96-act" and named["epochs"] > epochs[3], named
    assert (campaign / "parity96-act.metrics.csv").is_file()
    rows = logged_accuracies(campaign / "log.md")
    assert sorted(rows) == sorted(stage.name for stage in SMOKE_STAGES), rows
    say(f"smoke: OK ({campaign / 'log.md'}: {len((campaign / 'log.md').read_text().splitlines()) - 2} rows)")


def _seconds(text: str) -> float:
    """--budget-s: seconds (540), or a duration as ponder train's --time-limit takes it (2h)."""
    try:
        return float(text)
    except ValueError:
        from ponder_cli.durations import parse
        try:
            return parse(text, "--budget-s")
        except Exception as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the window's run and logs go")
    parser.add_argument("--campaign", type=Path, default=CAMPAIGN, help="the tracked checkpoints and log")
    parser.add_argument("--budget-s", type=_seconds, default=480.0,
                        help="the whole window from this process's start, training and evaluating: seconds, "
                             "or a duration (90m, 2h)")
    parser.add_argument("--stage", help="the stage to work on (default: the first one not done)")
    parser.add_argument("--past-target", action="store_true",
                        help="train the stage named by --stage on after it reached the target")
    parser.add_argument("--eval-s", type=float, default=None,
                        help="seconds kept back for the evaluation [default: 60 on a GPU, 240 on the CPU]")
    parser.add_argument("--limit", type=int, default=1000, help="test vectors per non-zero count")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cpu-smoke", action="store_true")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.cpu_smoke:
        with contextlib.redirect_stderr(io.StringIO()):  # the library's progress: the smoke says what it checks
            smoke(args.out)
        return 0
    eval_s = args.eval_s if args.eval_s is not None else (240.0 if args.device == "cpu" else 60.0)
    result = window(args.campaign, args.out / "work", STAGES, budget_s=args.budget_s, eval_s=eval_s,
                    limit=args.limit, target=TARGET, device=args.device, started=STARTED, only=args.stage,
                    past_target=args.past_target)
    (args.out / "window.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
