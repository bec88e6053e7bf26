"""`ponder models`: the models shipped inside the package, one bucket each: its name (what a
CHECKPOINT argument takes), task, method, step, what it is, its file and its best epoch's
validation figures, read from the checkpoint itself."""

from __future__ import annotations

from typing import Callable

from .checkpoint import load_checkpoint
from .render import Column
from .reports import Report, make_meta
from .runs import Resolved
from .shipped import DEFAULT, SHIPPED, shipped_path

MODEL_COLUMNS = [
    Column("name", "name", "s"), Column("what", "what it is", "s", wrap=True),
    Column("val_accuracy", "val accuracy", ".4f"), Column("val_steps", "val steps", ".2f"),
]


def model_bucket(name: str) -> dict:
    """One shipped model, described from its checkpoint."""
    state = load_checkpoint(shipped_path(name))
    cfg = state.config
    best = next((h for h in state.history if h.get("epoch") == state.best_epoch), None)
    return {"name": name, "task": cfg.task.name, "method": cfg.method.name, "step": cfg.step.name,
            "what": SHIPPED[name][1],
            "file": str(Resolved.shipped(shipped_path(name), "").path), "epochs": state.epoch,
            "best_epoch": state.best_epoch or None, "val_accuracy": best["val_accuracy"] if best else None,
            "val_steps": best["val_steps"] if best else None}


def shipped_models(*, log: Callable[[str], None] = lambda line: None) -> Report:
    """Every shipped model (shipped.SHIPPED), in its order; `ponder eval NAME` reads one."""
    buckets = [model_bucket(name) for name in SHIPPED]
    distinct = sorted({b["task"] for b in buckets})
    meta = make_meta("models", [b["file"] for b in buckets], [b["method"] for b in buckets],
                     [b["step"] for b in buckets], protocol=None, halting=None, seed=None,
                     task=distinct[0] if len(distinct) == 1 else None, default=DEFAULT)
    return Report(meta=meta, buckets=buckets, columns=MODEL_COLUMNS, title="Shipped models",
                  caption=f"val: the best epoch's validation figures · default: {DEFAULT}\n"
                          "evaluate one by name: ponder eval NAME; more: ponder info NAME")
