"""Every choice the user can make, named in one place, without importing torch: tasks, steps and
methods as "module:attribute" strings imported only when built (so the CLI lists choices and
checks a config before torch loads), and the spellings of --halting (`quantile:0.9`).
"""

from __future__ import annotations

import functools
import importlib
import math
from dataclasses import dataclass
from typing import Optional, Union

# A built-in piece is named by its declaration (tasks/declared.py, pieces.py: what the settings, `info`
# and the reports read of it, without torch), whose `implementation` names the class that builds it
# and subclasses it; a piece named by its class itself (an installed package's) is both.
TASKS = {
    "mnist": "ponder_cli.tasks.declared:Mnist",  # rotated MNIST digits; difficulty: the rotation
    "parity": "ponder_cli.tasks.declared:Parity",  # parity of +-1 vectors; difficulty: the non-zero count
}
STEPS = {
    "mlp": "ponder_cli.pieces:MLP",  # the reference: CNN once per image, MLP steps
    "align": "ponder_cli.pieces:Align",  # re-reads the image through a learnt rotation
    "rnn": "ponder_cli.pieces:RNN",  # vectors: the paper's tanh RNN, the input read at every step
    "gru": "ponder_cli.pieces:GRU",  # vectors: a GRU cell, the input read at every step
}
METHODS = {"pondernet": "ponder_cli.pieces:PonderNet", "act": "ponder_cli.pieces:ACT",
           "plain": "ponder_cli.pieces:Plain"}
# the kinds of piece, in order: a later kind's implied values win (plain's one step over align's
# twelve), an earlier kind may imply a later kind's piece (parity: --step gru)
PIECES = {"task": TASKS, "step": STEPS, "method": METHODS}
# the entry-point groups where installed packages register pieces, as name = "module:attribute"
ENTRY_POINTS = {"task": "ponder_cli.tasks", "step": "ponder_cli.steps", "method": "ponder_cli.methods"}

PROTOCOLS = ("uniform", "band", "fixed")  # how test images are rotated per angle bucket
DEFAULT_PROTOCOL = "uniform"  # the reference notebook's: within ±angle
DEFAULT_HALTING = "sample"  # the paper's; a method with a rule of its own (ACT) halts by that instead
# MNIST's default buckets in degrees: eval's, the images as they are; extrapolate's, beyond training's ±22.5
EVAL_ANGLES = (0.0,)
EXTRAPOLATION_ANGLES = (22.5, 45.0, 67.5, 90.0)
FORMATS = ("table", "json", "csv")
TRAIN_FORMATS = (*FORMATS, "jsonl")  # `ponder train` streams too: an epoch's JSON object as it ends
# every JSON document's version: raised when a key is removed, renamed or changes meaning, not when one is added
FORMAT_VERSION = 1
# Why a run's training ended: every planned epoch; early stopping; its time limit (resumable); or
# a run that never left chance with its learning rate cut to the floor.
FINISHED, EARLY_STOP, TIME_LIMIT, AT_CHANCE = "finished", "early stop", "time limit", "at chance"

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
# devices torch would accept by name, none of them one this program runs on
OTHER_TORCH_DEVICES = ("meta", "mps", "xpu", "hip", "xla", "mtia", "hpu", "ipu", "maia", "ve", "lazy", "vulkan",
                       "fpga", "opengl", "opencl", "ideep", "mkldnn", "ort", "privateuseone")


def device_problem(name: str) -> Optional[str]:
    """Why --device NAME names no device this program runs on, from its spelling alone (before
    torch loads); None for auto, cpu, cuda and cuda:N (whether that GPU is there is torch's to say)."""
    name = name.strip().lower()
    kind, colon, index = name.partition(":")
    if name in ("auto", "cpu") or (kind == "cuda" and (not colon or index.isdigit())):
        return None
    if kind == "cpu" and index.isdigit():  # torch accepts cpu:1 and quietly uses the one CPU device
        return f"--device {name}: there is one CPU device, use --device cpu"
    if kind in OTHER_TORCH_DEVICES and (not colon or index.isdigit()):
        return f"unsupported device {name!r}; use {DEVICE_CHOICES}"
    return f"unknown device {name!r}; use {DEVICE_CHOICES}"


def known(kind: str, name) -> bool:
    """Whether `name` is a piece of `kind`: in its table, else registered by an installed package
    (then added to the table). Entry points are scanned only for a name not in the table."""
    table = PIECES[kind]
    if not isinstance(name, str):  # a file's value may be anything (a list): the config says what is wrong
        return False
    if name in table:
        return True
    from importlib.metadata import entry_points  # scans every installed package: only when needed

    for point in entry_points(group=ENTRY_POINTS[kind]):
        if point.name == name:
            table[name] = point.value
            return True
    return False


# torch's side of what `ponder info` reads without it: a checkpoint folders.read_state leaves to
# torch.load, and whether a saved halting rule was calibrated on these very weights (their digest)
TORCH_LOAD = "ponder_cli.checkpoint:load_checkpoint"
TORCH_SAVED_HALTING = "ponder_cli.runs:saved_halting_for"


def loaded(spec: str):
    """What a "module:attribute" string names, its module imported now."""
    module, attribute = spec.split(":")
    return getattr(importlib.import_module(module), attribute)


def piece_declaration(kind: str, name: str):
    """What the piece `name` of `kind` ("task", "step", "method") is declared as: for a built-in
    one, the class the settings and reports read (input kind, `config_problems`, a task's
    `resolve_options` and `view`), without torch; for another, its class."""
    if not known(kind, name):
        raise ValueError(f"unknown {'step function' if kind == 'step' else kind} {name!r}; "
                         f"choose from {', '.join(PIECES[kind])}")
    return loaded(PIECES[kind][name])


def piece_class(kind: str, name: str):
    """The class that builds the piece `name` of `kind` (torch with it)."""
    declared = piece_declaration(kind, name)
    implementation = getattr(declared, "implementation", None)
    return loaded(implementation) if implementation else declared


task_class = functools.partial(piece_class, "task")
step_class = functools.partial(piece_class, "step")
method_class = functools.partial(piece_class, "method")


# How a model picks its halting step at inference (model.py): PonderNet's sample, median (quantile:0.5)
# and expected; quantile:Q, once the cumulative halting probability reaches Q (PALBERT); patience:K,
# once the argmax equals the K steps' before (PABEE); confidence:C, once the top class probability
# reaches C (CALM); threshold:T, once lambda_n reaches T (a head trained as a "done" probability);
# fixed:N, every input at step N, the fixed budget adaptive halting is measured against.
HALTING_RULES = ("sample", "median", "expected", "quantile", "patience", "confidence", "threshold", "fixed")
# what each rule with a parameter calls it and accepts, for help texts and messages
RULE_PARAMETERS = {"quantile": ("Q", "0 < Q < 1"), "patience": ("K", "a whole number K >= 1"),
                   "confidence": ("C", "0 < C < 1"), "threshold": ("T", "0 < T < 1"),
                   "fixed": ("N", "a whole number N >= 1")}
AVERAGING_RULES = ("expected",)  # rules that average every step's outputs rather than halt at one
# the shuffled-halting null: the mean over this many permutations of a bucket's halting steps
SHUFFLES = 10
# the rules `ponder calibrate` chooses among, cheapest first within each family
CALIBRATION_RULES = (*(f"quantile:{q}" for q in (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)),
                     *(f"patience:{k}" for k in (1, 2, 3, 4)),
                     *(f"confidence:{c}" for c in (0.5, 0.7, 0.9, 0.95, 0.99, 0.999)))
# calibrate's candidates for a head trained on the answer: its own rule, threshold:T, evenly in
# log(1 - T) near 1 where such a head puts most lambdas, beside the rules that read the answer
# alone (PonderNet's quantiles compound a "done" probability)
THRESHOLD_CALIBRATION_RULES = (*(f"threshold:{t}" for t in (0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.998, 0.999,
                                                            0.9995, 0.9998, 0.9999)),
                               *(rule for rule in CALIBRATION_RULES if not rule.startswith("quantile:")))


@dataclass(frozen=True)
class HaltingRule:
    name: str  # one of HALTING_RULES
    parameter: Union[float, int, None]  # Q of quantile, K of patience, C of confidence, N of fixed
    spelling: str  # as given (the name lower-cased)

    @property
    def quantile(self) -> Optional[float]:  # the cumulative halting probability it halts at
        return 0.5 if self.name == "median" else self.parameter if self.name == "quantile" else None

    @property
    def budget(self) -> Optional[int]:  # the step every input stops at (fixed:N)
        return self.parameter if self.name == "fixed" else None

    @property
    def halts_at_one_step(self) -> bool:
        return self.name not in AVERAGING_RULES

    def __str__(self) -> str:
        return self.spelling


def rule_choices(exit_rules_only: bool = False) -> str:
    """Every spelling, as messages and help texts list them (exit_rules_only: calibrate's)."""
    names = [name for name in HALTING_RULES if not (exit_rules_only and name in AVERAGING_RULES)]
    return ", ".join(f"{name}:{RULE_PARAMETERS[name][0]}" if name in RULE_PARAMETERS else name for name in names)


def parse_halting_rule(text: Union[str, HaltingRule]) -> HaltingRule:
    """'quantile:0.9' -> HaltingRule('quantile', 0.9, 'quantile:0.9'); a ValueError worded for the user."""
    if isinstance(text, HaltingRule):
        return text
    name, sep, value = str(text).strip().partition(":")
    name, value = name.strip().lower(), value.strip()
    if name not in HALTING_RULES:
        raise ValueError(f"unknown halting rule {text!r}; choose from {rule_choices()}")
    spelling = f"{name}:{value}" if sep else name
    if name not in RULE_PARAMETERS:
        if sep:
            raise ValueError(f"the {name} rule takes no parameter (got {text!r})")
        return HaltingRule(name, None, spelling)
    letter, accepted = RULE_PARAMETERS[name]
    if not sep or not value:
        raise ValueError(f"{name} needs its parameter: {name}:{letter} with {accepted} (got {text!r})")
    if name in ("patience", "fixed"):  # a whole number of steps
        if not (value.isascii() and value.isdigit()) or int(value) < 1:
            raise ValueError(f"{name}:{letter} needs {accepted} (got {value!r})")
        return HaltingRule(name, int(value), spelling)
    try:
        q = float(value)
    except ValueError:
        q = math.nan
    if not 0 < q < 1:  # NaN fails this too
        raise ValueError(f"{name}:{letter} needs a number {letter} with {accepted} (got {value!r})")
    return HaltingRule(name, q, spelling)


def parse_exit_rule(text: Union[str, HaltingRule]) -> HaltingRule:
    """A candidate rule for `ponder calibrate`: one that halts at a single step. Raises ValueError."""
    rule = parse_halting_rule(text)
    if not rule.halts_at_one_step:
        raise ValueError(f"the {rule} rule averages every step's outputs and halts at no single step; calibrate "
                         f"compares rules that halt at one step: {rule_choices(exit_rules_only=True)}")
    return rule
