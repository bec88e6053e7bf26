"""Every choice the user can make, named in one place, without importing torch.

Tasks, step functions and halting methods are registered as "module:attribute" strings and imported
only when built, so the CLI can list choices and validate a config before torch loads.
Adding a task, a step function or a method is one module and one line here.
"""

from __future__ import annotations

import importlib

TASKS = {
    "mnist": "ponder_cli.tasks.mnist:MnistTask",  # rotated MNIST digits; difficulty: the rotation
    "parity": "ponder_cli.tasks.parity:ParityTask",  # parity of +-1 vectors; difficulty: the non-zero count
}

STEPS = {
    "mlp": "ponder_cli.steps.mlp:MLPStep",  # the reference: CNN once per image, MLP steps
    "align": "ponder_cli.steps.align:AlignStep",  # re-reads the image through a learnt rotation
    "rnn": "ponder_cli.steps.vectors:RNNStep",  # vectors: the paper's tanh RNN, the input read at every step
    "gru": "ponder_cli.steps.vectors:GRUStep",  # vectors: a GRU cell, the input read at every step
}

METHODS = {
    "pondernet": "ponder_cli.methods:PonderNetMethod",
    "act": "ponder_cli.methods:ACTMethod",
    "plain": "ponder_cli.methods:PlainMethod",
}

# what the halting head sees: the step's readout, plus any of its top class probability, the
# previous step's readout (the change between steps) and the step function's own halting
# features (align: the size of its turn), in that order
HALTING_INPUTS = ("state", "state+confidence", "state+previous", "state+turn", "state+confidence+previous",
                  "state+confidence+turn", "state+previous+turn", "state+confidence+previous+turn")
# mlp: one Dropout2d mask per image shared by every step (the CNN runs once), or a fresh mask
# at every step, as the reference gets by recomputing its CNN at every step
CNN_DROPOUT_MASKS = ("shared", "per-step")
# what PonderNet's training does with an input whose remaining halting mass is below the
# truncation: stop it, its last computed step taking that mass (cut: biased), or go on with a
# probability that falls with the mass, later steps weighted by its inverse (roulette: unbiased)
TRUNCATION_RULES = ("cut", "roulette")
# how PonderNet picks its halting step at inference; quantile, patience and confidence take a
# parameter (quantile:0.9, patience:2, confidence:0.95), parsed in halting_rules.py
HALTING_RULES = ("sample", "median", "expected", "quantile", "patience", "confidence")
PROTOCOLS = ("uniform", "band", "fixed")  # how test images are rotated per angle bucket
DEFAULT_HALTING = "sample"  # the paper's; a method with a rule of its own (ACT) halts by that instead
DEFAULT_PROTOCOL = "uniform"  # the reference notebook's: within ±angle
# MNIST's default buckets, in degrees (the task evaluates on them, --help shows them): eval's,
# the test images as they are; extrapolate's and compare's, beyond training's ±22.5
EVAL_ANGLES = (0.0,)
EXTRAPOLATION_ANGLES = (22.5, 45.0, 67.5, 90.0)
FORMATS = ("table", "json", "csv")
PIECES = {"task": TASKS, "step": STEPS, "method": METHODS}
# where installed packages register pieces of their own, each as name = "module:attribute" as in
# the tables above
ENTRY_POINTS = {"task": "ponder_cli.tasks", "step": "ponder_cli.steps", "method": "ponder_cli.methods"}


def _load(table: dict[str, str], kind: str, name: str):
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; choose from {', '.join(table)}")
    module, attribute = table[name].split(":")
    return getattr(importlib.import_module(module), attribute)


def known(kind: str, name) -> bool:
    """Whether `name` is a piece of `kind` ("task", "step", "method"): built in (or already added
    to its table), else one an installed package registers under ENTRY_POINTS[kind], which is then
    added to the table. The entry points are read only for a name not in the table, so a command
    naming built-in pieces never pays for scanning the installed packages."""
    table = PIECES[kind]
    if name in table:
        return True
    if not isinstance(name, str):
        return False
    from importlib.metadata import entry_points  # scans every installed package: only when needed

    for point in entry_points(group=ENTRY_POINTS[kind]):
        if point.name == name:
            table[name] = point.value
            return True
    return False


def task_class(name: str):
    known("task", name)
    return _load(TASKS, "task", name)


def step_class(name: str):
    known("step", name)
    return _load(STEPS, "step function", name)


def method_class(name: str):
    known("method", name)
    return _load(METHODS, "method", name)
