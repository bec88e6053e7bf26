"""One library function per command: load what it needs, run it, return a reports.Report (the
CLI renders it; everything here works without the CLI, and lets Ctrl-C out as Python raises it).
Here, what every command that reads a model does first."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from .. import BadValue, Interrupted, Terminated
from ..checkpoint import load_model
from ..config import PonderConfig, default_halting
from ..folders import resolve_checkpoint
from ..model import get_method, resolve_device

def device_and_amp(device: str, amp: Optional[bool], log: Optional[Callable[[str], None]] = None):
    """The device --device names (`auto`: CUDA when there is a GPU), said through `log`, and
    whether to use mixed precision: only when asked (float32, the faster under CUDA graphs)."""
    dev = resolve_device(device)
    if log is not None:
        log(device_line(dev, device))
    return dev, bool(amp)


def device_line(dev, asked: str) -> str:
    """`device cpu (--device auto: no CUDA GPU available)`, `device cuda:0 (NVIDIA H100 80GB HBM3)`."""
    name = device_name(dev) + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else "")
    if asked.strip().lower() != "auto":
        return f"device {name}"
    return f"device {name} (--device auto: {'a CUDA GPU' if dev.type == 'cuda' else 'no CUDA GPU'} available)"


def device_name(dev) -> str:
    """"cpu", "cuda:0" (a CUDA device by its index, which --device auto leaves out)."""
    return f"cuda:{torch.cuda.current_device()}" if dev.type == "cuda" and dev.index is None else str(dev)


def on_device(report, dev):
    report.meta["device"] = device_name(dev)
    return report


def resolve_named(checkpoint, log: Callable[[str], None]):
    """The file a CHECKPOINT argument names (folders.resolve_checkpoint), said on stderr."""
    resolved = resolve_checkpoint(checkpoint)
    log(f"using {resolved.path} ({resolved.why})")
    return resolved.path


def load_one(checkpoint, options, log: Callable[[str], None]):
    """The model a CHECKPOINT names, its device, the config it runs (--max-steps applied) and trained with."""
    path = resolve_named(checkpoint, log)
    dev, amp = device_and_amp(options.device, options.amp, log)
    model, cfg, state = load_model(path, dev, options.max_steps)
    return path, dev, amp, model, cfg, state.config


def steps_run(cfg, trained) -> dict:
    return {"max_steps": cfg.method.max_steps, "trained_max_steps": trained.method.max_steps}


def check_halting(cfg, rule: Optional[str]) -> str:
    """The rule to evaluate by: `rule`, else the model's own (config.default_halting); one its
    method cannot halt by, or a fixed budget beyond the steps it runs, is refused, never replaced."""
    if rule is None:
        return default_halting(cfg)
    problem = get_method(cfg).halting_problem(rule)
    if problem is not None:
        raise BadValue(problem)
    return rule


def evaluation_seed(seed: Optional[int], *cfgs) -> int:
    """The seed of an evaluation's draws: --seed, else the checkpoints' training seed when they
    share one, else the default seed (the same draws whatever order compare names them in)."""
    if seed is not None:
        return seed
    seeds = {cfg.training.seed for cfg in cfgs}
    return seeds.pop() if len(seeds) == 1 else PonderConfig.default("seed")


# one module per group of commands: after what they share, above, which they import
from .evaluation import (EvalOptions, calibrate_checkpoint, compare_checkpoints, evaluate_checkpoint,  # noqa: E402
                         sweep_checkpoint)
from .inspection import PLOT_INPUTS, PredictOptions, predict_inputs  # noqa: E402
from ..listing import diff_runs, list_runs, remove_runs, run_info, shipped_models  # noqa: E402
from ..runs import label_runs  # noqa: E402
from .training import TrainOptions, train_run, training_config  # noqa: E402

__all__ = ["EvalOptions", "calibrate_checkpoint", "compare_checkpoints", "evaluate_checkpoint", "sweep_checkpoint",
           "PLOT_INPUTS", "PredictOptions", "diff_runs", "list_runs", "predict_inputs", "remove_runs", "run_info",
           "label_runs", "shipped_models", "Interrupted", "Terminated", "TrainOptions", "train_run", "training_config"]
