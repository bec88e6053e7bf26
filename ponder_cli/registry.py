"""Every choice the user can make, named in one place, without importing torch.

Tasks, step functions and halting methods are registered as "module:attribute" strings and imported
only when built, so the CLI can list choices and validate a config before torch loads.
Adding a task, a step function or a method is one module and one line here. The spellings of
--halting (`quantile:0.9`) are parsed here too, in one place and equally without torch.
"""

from __future__ import annotations

import importlib
import itertools
import math
from dataclasses import dataclass
from typing import Optional, Union

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
    "pondernet": "ponder_cli.model:PonderNetMethod",
    "act": "ponder_cli.model:ACTMethod",
    "plain": "ponder_cli.model:PlainMethod",
}

# what the halting head sees: the step's readout, plus any of its top class probability, the
# previous step's readout (the change between steps), the step function's own halting features
# (align: the size of its turn) and the step's answer (model.answer_features: how sure it is and
# how it changed since the last step), in that order: every subset of the four, after "state"
HALTING_INPUTS = tuple("+".join(("state", *parts, *answer)) for answer in ((), ("answer",)) for size in range(4)
                       for parts in itertools.combinations(("confidence", "previous", "turn"), size))
# what PonderNet trains its halting head towards: the prior (the paper's KL term), or, by binary
# cross-entropy of lambda_n, whether no later step changes the answer (final) or whether the
# answer is right (correct); model.halting_targets
HALTING_TARGETS = ("prior", "final", "correct")
# mlp: one Dropout2d mask per image shared by every step (the CNN runs once), or a fresh mask
# at every step, as the reference gets by recomputing its CNN at every step
CNN_DROPOUT_MASKS = ("shared", "per-step")
# what PonderNet's training does with an input whose remaining halting mass is below the
# truncation: stop it, its last computed step taking that mass (cut: biased), or go on with a
# probability that falls with the mass, later steps weighted by its inverse (roulette: unbiased)
TRUNCATION_RULES = ("cut", "roulette")
# the prior PonderNet's KL term pulls the halting distribution towards: geometric (lambda_p,
# truncated at max_steps and renormalised; the paper's) or uniform over the steps (Ouro: the
# geometric prior gives the later steps too little weight to train them)
PRIORS = ("geometric", "uniform")
# where a parity vector's non-zeros sit: at random positions (the PonderNet line's generators, and
# this tool's from the start) or in the first `count` positions (the ACT line's: Graves, Fojo et al.)
LAYOUTS = ("scattered", "prefix")
# how a vector step reads each entry: its value; one-hot over {-1, 0, +1}; or its value and its
# square side by side (x, x^2). The last two show which entries are non-zero apart from their
# signs, so the count of +1 entries, (sum x + sum x^2) / 2, is linear in the input
ENCODINGS = ("raw", "onehot", "square")
# how a model picks its halting step at inference; quantile, patience, confidence and fixed take a
# parameter (quantile:0.9, patience:2, confidence:0.95, fixed:4), parsed below (parse_halting_rule)
HALTING_RULES = ("sample", "median", "expected", "quantile", "patience", "confidence", "threshold", "fixed")
PROTOCOLS = ("uniform", "band", "fixed")  # how test images are rotated per angle bucket
DEFAULT_HALTING = "sample"  # the paper's; a method with a rule of its own (ACT) halts by that instead
DEFAULT_PROTOCOL = "uniform"  # the reference notebook's: within ±angle
# MNIST's default buckets, in degrees (the task evaluates on them, --help shows them): eval's,
# the test images as they are; extrapolate's and compare's, beyond training's ±22.5
EVAL_ANGLES = (0.0,)
EXTRAPOLATION_ANGLES = (22.5, 45.0, 67.5, 90.0)
FORMATS = ("table", "json", "csv")
# `ponder train` streams too: one JSON object a line, an epoch's as it ends, the report last
TRAIN_FORMATS = (*FORMATS, "jsonl")
# The version of every JSON document the commands write (stdout's, config.json, environment.json,
# --print-config's): a key removed or renamed, or its meaning changed, raises it; a key added does
# not (readers ignore keys they do not know).
FORMAT_VERSION = 1
# Why a run's training ended (the report's "stop_reason", last.pt's): every planned epoch
# trained; early stopping; its time limit (resumable: the next epoch would not have fitted); or a
# run that never left chance with its learning rate cut to the floor. The last two are news: the
# report says them.
FINISHED, EARLY_STOP, TIME_LIMIT, AT_CHANCE = "finished", "early stop", "time limit", "at chance"

# --device: auto (CUDA when there is a GPU), cpu, cuda, cuda:N. Torch knows other kinds of device,
# which it would accept by name; none of them is one this program runs on.
DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
OTHER_TORCH_DEVICES = ("meta", "mps", "xpu", "hip", "xla", "mtia", "hpu", "ipu", "maia", "ve", "lazy", "vulkan",
                       "fpga", "opengl", "opencl", "ideep", "mkldnn", "ort", "privateuseone")


def device_problem(name: str) -> Optional[str]:
    """Why --device NAME names no device this program runs on, from its spelling alone (before
    torch loads); None for auto, cpu, cuda and cuda:N (whether that GPU is there is torch's to say)."""
    name = name.strip().lower()
    kind, colon, index = name.partition(":")
    if name == "auto" or (kind == "cuda" and (not colon or index.isdigit())) or name == "cpu":
        return None
    if kind == "cpu" and index.isdigit():  # torch accepts cpu:1 and quietly uses the one CPU device
        return f"--device {name}: there is one CPU device, use --device cpu"
    if kind in OTHER_TORCH_DEVICES and (not colon or index.isdigit()):
        return f"unsupported device {name!r}; use {DEVICE_CHOICES}"
    return f"unknown device {name!r}; use {DEVICE_CHOICES}"
# the kinds of piece, in order: a later kind's implied values win (plain's one step over align's
# twelve), an earlier kind may imply a later kind's piece (parity: --step gru)
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


def piece_class(kind: str, name: str):
    """The class of the piece `name` of `kind` ("task", "step", "method")."""
    known(kind, name)
    return _load(PIECES[kind], "step function" if kind == "step" else kind, name)


def task_class(name: str):
    return piece_class("task", name)


def step_class(name: str):
    return piece_class("step", name)


def method_class(name: str):
    return piece_class("method", name)


# halting rules ----------------------------------------------------------------------------------
# The spellings of --halting: a rule's name from HALTING_RULES, with a parameter where the rule
# takes one.
#
# - sample, median, expected: PonderNet's own rules (see model.py);
# - quantile:Q (0 < Q < 1): halt at the first step where the cumulative halting probability
#   1 - prod_k (1 - lambda_k) reaches Q; median is quantile:0.5 (PALBERT's Q-exit);
# - patience:K (K >= 1): halt at the first step n whose predicted class argmax y_n is also that of
#   each of the K steps before it (n >= K + 1), or at the last step (PABEE);
# - confidence:C (0 < C < 1): halt at the first step whose top class probability max softmax(y_n)
#   reaches C, or at the last step (CALM's softmax-response exit);
# - threshold:T (0 < T < 1): halt at the first step whose halting probability lambda_n reaches T,
#   or at the last step: the natural rule for a lambda trained as a "done" probability
#   (--halting-target final or correct), whose cumulative product the coins would read too early;
# - fixed:N (N >= 1): every input stops at step N, whatever its halting says: the fixed budget
#   that adaptive halting is measured against, the same for every method (ACT's too). N is
#   checked against the steps a model runs where the model is known (api.check_halting).
#
# A rule keeps the user's spelling (`HaltingRule.spelling`): reports show it as it was given.

# what each rule with a parameter calls it and accepts, for help texts and messages
RULE_PARAMETERS = {"quantile": ("Q", "0 < Q < 1"), "patience": ("K", "a whole number K >= 1"),
                   "confidence": ("C", "0 < C < 1"), "threshold": ("T", "0 < T < 1"),
                   "fixed": ("N", "a whole number N >= 1")}
# rules whose parameter is a whole number of steps
WHOLE_PARAMETERS = ("patience", "fixed")
# rules that average every step's outputs rather than halt at one step
AVERAGING_RULES = ("expected",)
# --detail's and compare's shuffled-halting null: the mean over this many permutations of the
# halting steps across a bucket's inputs (evaluate.shuffled_null)
SHUFFLES = 10
# the rules `ponder calibrate` chooses among, cheapest first within each family
CALIBRATION_RULES = ("quantile:0.5", "quantile:0.6", "quantile:0.7", "quantile:0.8", "quantile:0.9",
                     "quantile:0.95", "quantile:0.99", "patience:1", "patience:2", "patience:3", "patience:4",
                     "confidence:0.5", "confidence:0.7", "confidence:0.9", "confidence:0.95", "confidence:0.99",
                     "confidence:0.999")
# calibrate's candidates for a head trained on the answer (--halting-target final, correct): its own
# rule, threshold:T, evenly in log(1 - T) near 1 where such a head puts most lambdas (docs/halting.md),
# beside the rules that read the answer alone; PonderNet's quantiles compound a "done" probability
THRESHOLD_CALIBRATION_RULES = (*(f"threshold:{t}" for t in (0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.998, 0.999,
                                                            0.9995, 0.9998, 0.9999)),
                               *(rule for rule in CALIBRATION_RULES if not rule.startswith("quantile:")))


@dataclass(frozen=True)
class HaltingRule:
    name: str  # one of HALTING_RULES
    parameter: Union[float, int, None]  # Q of quantile, K of patience, C of confidence, N of fixed
    spelling: str  # as given (the name lower-cased)

    @property
    def quantile(self) -> Optional[float]:
        """The cumulative halting probability at which the rule halts (median: 1/2), or None."""
        return 0.5 if self.name == "median" else self.parameter if self.name == "quantile" else None

    @property
    def budget(self) -> Optional[int]:
        """The step at which every input stops (fixed:N), or None: the rule halts by what it sees."""
        return self.parameter if self.name == "fixed" else None

    @property
    def halts_at_one_step(self) -> bool:
        """False for expected, which averages every step's outputs instead of halting at one."""
        return self.name not in AVERAGING_RULES

    def __str__(self) -> str:
        return self.spelling


def rule_choices(exit_rules_only: bool = False) -> str:
    """Every spelling, as messages and help texts list them (exit_rules_only: those that halt
    at one step, as calibrate takes them)."""
    names = [name for name in HALTING_RULES if not (exit_rules_only and name in AVERAGING_RULES)]
    return ", ".join(f"{name}:{RULE_PARAMETERS[name][0]}" if name in RULE_PARAMETERS else name for name in names)


def parse_halting_rule(text: Union[str, HaltingRule]) -> HaltingRule:
    """'median' -> HaltingRule('median', None, 'median'); 'quantile:0.9' -> ('quantile', 0.9, ...);
    'patience:2' -> ('patience', 2, ...); 'fixed:4' -> ('fixed', 4, ...). Raises ValueError, worded
    for the user."""
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
    if name in WHOLE_PARAMETERS:
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
    """A candidate rule for `ponder calibrate`: as parse_halting_rule, and one that halts at a
    single step, whose prediction can be compared with the last step's. Raises ValueError."""
    rule = parse_halting_rule(text)
    if not rule.halts_at_one_step:
        raise ValueError(f"the {rule} rule averages every step's outputs and halts at no single step; calibrate "
                         f"compares rules that halt at one step: {rule_choices(exit_rules_only=True)}")
    return rule
