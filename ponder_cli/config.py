"""The one frozen configuration that flows through training and lives in every checkpoint, and
its files (`--config FILE`, `--print-config`, a run folder's `config.toml`), all without torch.

Each setting is a field declared once (`setting`): its default, its one check, the pieces that
read it and the values pieces imply, and its help, from which `ponder train`'s option, its --help
and docs/configuration.md are made. Whether a setting applies follows from that declaration
(`unread`, the one rule): one the chosen pieces do not read is refused when the user gives it, a
one-line warning when a saved run holds it. Outside, a setting is known by its flat key.
"""

from __future__ import annotations

import contextvars
import dataclasses
import difflib
import itertools
import json
import math
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from . import BadValue, PonderError, PonderWarning, file_problem
from .registry import DEFAULT_HALTING, FORMAT_VERSION, METHODS, PIECES, STEPS, TASKS, known, piece_declaration

MAX_STEPS = 100  # a bound on the cost of an epoch (training runs every step for every image)
FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32: what the model's tensors can hold
MAX_SEED = 2 ** 63  # torch's generators take seeds below 2**64; we keep them signed 64-bit

# what PonderNet trains its halting head towards: the prior (the paper's KL term), or, by binary
# cross-entropy, whether no later step changes the answer (final) or the answer is right (correct)
HALTING_TARGETS = ("prior", "final", "correct")
# the kinds of piece a setting can belong to, each chosen by the setting of its name
KINDS = {**PIECES, "halting_target": HALTING_TARGETS}
BUILT_IN = {kind: tuple(table) for kind, table in KINDS.items()}  # before installed packages add theirs


def owners(names) -> dict[str, tuple]:
    """{kind: pieces} of the piece names a setting names; a name no piece has fails as the module loads."""
    names = (names,) if isinstance(names, str) else tuple(names)
    unknown = [name for name in names if not any(name in table for table in KINDS.values())]
    if unknown:
        raise ValueError(f"no piece is named {', '.join(unknown)}")
    found = {kind: tuple(name for name in table if name in names) for kind, table in KINDS.items()}
    return {kind: names_ for kind, names_ in found.items() if names_}


def setting(default, test=None, rule="", *, of=(), implied=None, help="", hidden=False, metavar=None,
            default_text=None, text=False):
    """A setting: its default; its check, `test(value)`, else "must be `rule`" (a table: one of its
    values, offered as choices in any case); the pieces that read it (`of`, by kind; none: every
    run); the values pieces imply (`implied`: piece -> value, a later kind's winning); its option's
    help, hidden from --help if `hidden`; `text`: the option takes text the config reads."""
    implied = implied or {}
    owners(implied)  # a misspelt piece fails here
    return dataclasses.field(default=default, metadata={
        "test": test, "rule": rule, "of": owners(of), "implied": implied, "help": help, "hidden": hidden,
        "metavar": metavar, "default_text": default_text, "text": text})


def within(lo, hi, brackets="[]", note=""):
    """A check that a value lies in an interval: [lo, hi], (lo, hi), ..."""
    return (lambda v: (lo <= v if brackets[0] == "[" else lo < v) and (v <= hi if brackets[1] == "]" else v < hi),
            f"in {brackets[0]}{lo}, {hi}{brackets[1]}{note}")


def one_of(table):  # the table as it is then: installed packages add pieces
    return (lambda v: v in table), table


ABOVE_0, AT_LEAST_0 = ((lambda v: v > 0), "> 0"), ((lambda v: v >= 0), ">= 0")
SEED_RULE = (lambda v: 0 <= v < MAX_SEED), "an integer from 0 to 2**63 - 1"
# what the halting head sees besides the state, in this order: every subset of the four
HALTING_INPUTS = tuple("+".join(("state", *parts, *answer)) for answer in ((), ("answer",)) for size in range(4)
                       for parts in itertools.combinations(("confidence", "previous", "turn"), size))

# Pieces that read a setting together: the steps of images; the methods that halt (plain runs one
# step); PonderNet's head trained towards the prior (a head trained on the answer has no KL term).
# What pieces imply are their recipes: align's, under which halting tracked the work best in the
# README's experiments, with truncation 0.1 since every step runs the CNN (docs/performance.md,
# "Training truncation"); parity's, what learns there (docs/parity-results.md); plain, its one step.
IMAGE_STEPS, HALTING, PRIOR_TARGET = ("mlp", "align"), ("pondernet", "act"), ("pondernet", "prior")


@dataclass(frozen=True)
class TaskSettings:
    name: str = setting("mnist", *one_of(TASKS), help=(
        "What to learn: mnist (digits; difficulty: rotation) or parity (the parity of +1 entries in vectors of ±1 "
        "and 0; difficulty: the non-zero count; implies --step gru, see docs/parity.md)."))
    elems: int = setting(64, of="parity", help="parity: entries per vector.")
    # elems and train_counts: checked by the task; a run saves its own counts, 1-elems
    train_counts: str = setting("", of="parity", default_text="1-ELEMS", metavar="LO-HI", hidden=True,
                                help="parity: non-zero counts of training vectors, LO-HI (e.g. 1-48).")
    batches_per_epoch: int = setting(1000, *ABOVE_0, of="parity", hidden=True, help=(
        "parity: batches of fresh vectors per epoch (the unit of validation, checkpoints and patience)."))
    curriculum: int = setting(0, *AT_LEAST_0, of="parity", hidden=True, help=(
        "parity: over the first this many batches the top training count grows from --curriculum-start (0: off)."))
    curriculum_start: int = setting(2, of="parity", hidden=True, help="parity: the curriculum's first top count.")
    curriculum_advance: float = setting(0.0, *within(0, 1, "[)"), of="parity", hidden=True, help=(
        "parity: a curriculum by progress: the top training count, from --curriculum-start, is raised by an eighth "
        "of the range once validation accuracy on the counts up to it reaches this (0: off)."))
    # Zaremba & Sutskever's "combined" curriculum
    curriculum_mix: float = setting(0.0, *within(0, 1), of="parity", hidden=True, help=(
        "parity: this share of every batch of a curriculum drawn from the whole training range, the rest from its "
        "current range (0: none)."))
    layout: str = setting("scattered", *one_of(("scattered", "prefix")), of="parity", hidden=True, help=(
        "parity: where a vector's non-zeros sit: at random positions (scattered, the PonderNet line's) or in the "
        "first COUNT positions (prefix, the ACT line's)."))
    train_rotation: float = setting(22.5, *within(0, 180, note=" degrees: images are rotated within +-angle"),
                                    of="mnist", help="Rotate training images uniformly within +-this many degrees "
                                                     "(0: plain MNIST).")
    val_size: int = setting(5000, *ABOVE_0, of="mnist", hidden=True, help="Training images held out for validation.")
    train_size: int = setting(0, *AT_LEAST_0, of="mnist", hidden=True,
                              help="Training images used (0: all not held out).")
    split_seed: Optional[int] = setting(None, *SEED_RULE, of="mnist", hidden=True, default_text="--seed", help=(
        "Seed of the held-out split (with --init-from: its source's, which keeps the digits that model trained on "
        "out of validation)."))


@dataclass(frozen=True)
class StepSettings:
    name: str = setting("mlp", *one_of(STEPS), implied={"parity": "gru"}, help=(
        "The step function: mlp (CNN once, MLP steps: the reference); align (re-reads the image through a learnt "
        "rotation); parity vectors: rnn (the paper's tanh RNN), gru."))
    hidden: int = setting(64, *ABOVE_0, implied={"parity": 128}, hidden=True, help=(
        "Size of the recurrent state (rnn: the paper's 128 tanh units)."))
    hidden_cnn: int = setting(64, *ABOVE_0, of=IMAGE_STEPS, hidden=True, help="Size of the image embedding.")
    hidden_lin: int = setting(64, *ABOVE_0, of="mlp", hidden=True, help="mlp: the step MLP's hidden layer.")
    kernel_size: int = setting(5, *within(1, 12, note=": a larger one does not fit a 28x28 image"), of=IMAGE_STEPS,
                               hidden=True, help="The CNN's kernel size.")
    cnn_dropout: float = setting(0.5, *within(0, 1, "[)"), of=IMAGE_STEPS, hidden=True,
                                 help="Dropout2d after the CNN's second convolution.")  # as in the reference
    cnn_dropout_mask: str = setting("shared", *one_of(("shared", "per-step")), of="mlp", implied={"mlp": "per-step"},
                                    hidden=True, help=(
        "mlp: a fresh Dropout2d mask at every step (as the reference, which reruns its CNN at every step), or one "
        "per image shared by every step (how runs saved before per-step became mlp's default trained)."))
    mlp_dropout: float = setting(0.2, *within(0, 1, "[)"), of="mlp", hidden=True, help="Dropout in the step MLP.")
    align_turn: float = setting(30.0, *within(0, 180, "(]", " degrees"), of="align", hidden=True,
                                help="align: the largest turn of one step, in degrees.")
    # align's, read by the halting of the methods that halt
    turn_gate: float = setting(0.0, *within(0, 1, note=", a fraction of the largest turn"), of=("align", *HALTING),
                               implied={"align": 0.2}, hidden=True, help=(
        "align: holds halting back while the step turns; no halting once its net turn over two steps reaches 2 × "
        "this × --align-turn (0: off; the formula: docs/align.md)."))
    # gru's options after min-pondernet, on by default for --step gru
    gru_layer_norm: bool = setting(False, of="gru", implied={"gru": True}, hidden=True,
                                   help="gru: LayerNorm on the new state.")
    gru_orthogonal: bool = setting(False, of="gru", implied={"gru": True}, hidden=True,
                                   help="gru: orthogonal recurrent weights.")
    gru_update_bias: float = setting(0.0, of="gru", implied={"gru": 1.0}, hidden=True, help=(
        "gru: added to the update gate's bias (keeps more of the previous state)."))
    encoding: str = setting("raw", *one_of(("raw", "onehot", "square")), of=("rnn", "gru"), hidden=True, help=(
        "rnn, gru: each entry read as its value (raw), one-hot over {-1, 0, +1} (onehot) or as its value and its "
        "square side by side (square)."))


@dataclass(frozen=True)
class MethodSettings:
    name: str = setting("pondernet", *one_of(METHODS), help=(
        "pondernet; act (Adaptive Computation Time, Graves 2016); plain (one step, no pondering: implies "
        "--max-steps 1)."))
    max_steps: int = setting(20, lambda v: 0 < v <= MAX_STEPS, f"from 1 to {MAX_STEPS}: every step is computed "
                             "for every training input, so an epoch takes about max-steps times longer",
                             of=HALTING, implied={"align": 12, "plain": 1}, help="Maximum ponder steps.")
    halting_input: str = setting("state", *one_of(HALTING_INPUTS), of=HALTING, implied={"align": "state+turn"},
                                 hidden=True, metavar="<state[+confidence][+previous][+turn][+answer]>", help=(
        "What the halting head sees besides the state: the step's top class probability, the previous step's "
        "state, the step's turn (align), in that order, and the step's answer (how sure, how it changed: "
        "docs/halting.md): state+confidence+previous+turn+answer or a part of it."))
    # the method's own: PyTorch's for pondernet; act's, Graves' +1, with which early training ponders little
    halting_bias: Optional[float] = setting(None, of=HALTING, implied={"align": "prior", "act": 1.0}, hidden=True,
                                            text=True, help=(
        "Initial halting-head bias: a number, or 'prior' (logit of --lambda-p); none: the method's own. A method's "
        "value wins over a step's."))
    lambda_p: float = setting(0.2, *within(0, 1, "(]"), of=PRIOR_TARGET, implied={"parity": 0.1, "align": 0.5},
                            help="Geometric prior parameter, in (0, 1].")
    prior: str = setting("geometric", *one_of(("geometric", "uniform")), of=PRIOR_TARGET, hidden=True, help=(
        "The prior's shape: geometric (--lambda-p, the paper's) or uniform over the steps."))
    halting_target: str = setting("prior", *one_of(HALTING_TARGETS), of="pondernet", hidden=True, help=(
        "What the halting head learns: prior (the KL pull towards the prior, the paper's), or, by binary "
        "cross-entropy, final (no later step changes the answer) or correct (the answer is right); halt such a "
        "head by --halting threshold:T (docs/halting.md). Needs --truncation 0."))
    halting_threshold: float = setting(0.99, *within(0, 1, "(]"), of=("pondernet", "final", "correct"),
                                       hidden=True, help=(
        "With --halting-target final|correct: the head's own rule, threshold:T (halt at the first lambda >= T), by "
        "which validation chooses best.pt and every command halts without --halting."))
    beta: float = setting(0.01, *AT_LEAST_0, of=PRIOR_TARGET, help="Weight of the KL regularisation.")
    beta_warmup: int = setting(0, *AT_LEAST_0, of=PRIOR_TARGET, hidden=True, help=(
        "The KL weight grows from 0 to --beta over this many optimizer steps (0: off)."))
    depth_min: int = setting(0, *AT_LEAST_0, of="pondernet", hidden=True, help=(
        "Random-depth training: each input trains at a depth drawn from this to --max-steps, its halting forced "
        "there (0: off)."))
    tau: float = setting(0.01, *AT_LEAST_0, of="act", hidden=True, help="ACT: weight of the ponder cost N + R.")
    act_epsilon: float = setting(0.01, *within(0, 1, "()"), of="act", hidden=True,
                                 help="ACT: halt once the halting units sum to 1 - this.")
    # ACT drops an input at its own halting step (exact)
    truncation: float = setting(0.0, *within(0, 1, "[)"), of=HALTING, implied={"align": 0.1}, hidden=True, help=(
        "Training drops an image from later steps once its remaining halting mass is below this (0: off)."))
    truncation_rule: str = setting("cut", *one_of(("cut", "roulette")), of="pondernet", hidden=True,
                                   help="Below --truncation: cut, or roulette (unbiased).")


@dataclass(frozen=True)
class TrainingSettings:
    epochs: int = setting(20, *ABOVE_0, help="Training epochs.")
    batch_size: int = setting(128, *ABOVE_0, help="Images per optimizer step (under torchrun: over all processes).")
    lr: float = setting(1e-3, *ABOVE_0, help="Adam learning rate.")
    grad_clip: float = setting(0.5, AT_LEAST_0[0], ">= 0, 0 disables clipping", implied={"parity": 1.0},
                               hidden=True,
                               help="Gradient-norm clip (0: off).")
    patience: int = setting(5, *AT_LEAST_0, help="Early stopping: epochs without a better validation accuracy "
                                                 "(0: off).")
    lr_patience: int = setting(2, *AT_LEAST_0, hidden=True,  # ReduceLROnPlateau
                               help="Epochs without improvement before the LR is cut.")
    lr_factor: float = setting(0.1, *within(0, 1, "()"), hidden=True, help="The LR's cut when it is reduced.")
    seed: int = setting(1234, *SEED_RULE, help="Seed of the split, initialisation and sampling.")
    # the floats move by rounding (inductor's fused kernels), so a setting of the run, as any other
    compile: bool = setting(False, default_text="off", hidden=True, help=(
        "Train with torch.compile (inductor): a minute or two of compilation first (a C++ compiler needed), then "
        "faster parity batches (one process on the CPU only); the floats change by rounding (docs/performance.md)."))
    refit_halting: bool = setting(False, default_text="off", help=(
        "With --init-from: refit that model's halting head alone, every other weight frozen, the head new "
        "(options given here override its settings: the halting ones, --epochs, ...; docs/halting.md)."))


SECTION_TYPES = {"task": TaskSettings, "step": StepSettings, "method": MethodSettings, "training": TrainingSettings}
# every setting's flat key -> (section, field); a section's `name` is the section's own key
PLACES = {(section if f.name == "name" else f.name): (section, f) for section, kind in SECTION_TYPES.items()
          for f in dataclasses.fields(kind)}
SECTIONS = {section: tuple(key for key, (s, _) in PLACES.items() if s == section) for section in SECTION_TYPES}
TYPES = {key: typing.get_type_hints(SECTION_TYPES[section])[f.name] for key, (section, f) in PLACES.items()}


class Origin(str):
    """The file a setting came from, knowing the option that named it: --config, or --init-from."""

    def __new__(cls, path, option: str = "--config"):
        origin = super().__new__(cls, str(path))
        origin.option = option
        return origin


def spelled(key: str, origins: dict = {}, dashes: str = "") -> str:
    """How a message names a setting: by the file that gave it (`origins`), else as its option."""
    if key not in origins:
        return dashes + key.replace("_", "-")
    return f"{getattr(origins[key], 'option', '--config')} {origins[key]}: {key}"


def problems_of(key: str, value, name: str = "") -> list[str]:
    """A value alone: its type (a whole number does for a float), finite in float32, its check."""
    name, kind = name or spelled(key), TYPES[key]
    base = {Optional[float]: float, Optional[int]: int}.get(kind, kind)
    if value is None and base is not kind:
        return []
    if type(value) is not base and not (base is float and type(value) is int):
        wanted = {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}[base]
        return [f"{name} must be {wanted} (got {value!r})"]
    if base is float and not math.isfinite(value):
        return [f"{name} must be a finite number"]
    if base is float and abs(value) > FLOAT32_MAX:  # the model's weights and losses are float32
        return [f"{name} must be at most {FLOAT32_MAX:.3g} in size, what a float32 holds (got {value:g})"]
    test, rule = PLACES[key][1].metadata["test"], PLACES[key][1].metadata["rule"]
    if test is None or test(value):
        return []
    if not isinstance(rule, str):
        return [f"{name} must be one of {', '.join(rule)} (got {value!r})"]
    got = rule.find(":") if ":" in rule else len(rule)  # "(got v)" before a rule's reason
    return [f"{name} must be {rule[:got]} (got {value}){rule[got:]}"]


# Above 32 elements the defaults of smaller vectors are a dead end (docs/parity.md): what learnt 64
# elements is batches of 2048, the learning rate held and no early stop on a noisy plateau. Parity
# derives them from --elems unless given (ParityTask.resolve_options); --help shows them.
PAPER_SCALE_ELEMS = 33
PAPER_SCALE = {"batch_size": 2048, "lr_patience": 1000, "patience": 0}


def _plugins(kind: str) -> list:
    """Installed pieces of `kind`: their classes name the settings they read (`reads`) and imply (`implied`)."""
    return [(name, piece_declaration(kind, name)) for name in PIECES.get(kind, ()) if name not in BUILT_IN[kind]]


def readers(key: str) -> dict[str, tuple]:
    """The pieces that read `key`, by kind (`of`; none: every run), installed ones that name it too."""
    found = dict(PLACES[key][1].metadata["of"])
    for kind in found:
        found[kind] += tuple(name for name, piece in _plugins(kind) if key in getattr(piece, "reads", ()))
    return found


def unread(key: str, chosen: dict[str, str], value: Optional[Callable[[str], object]] = None) -> Optional[str]:
    """The one rule: None when the chosen pieces (with the run's halting target, from `value`) read
    `key`; else who reads it, as messages say it ("--method act, not pondernet")."""
    pieces = dict(chosen)
    if value is not None and value("halting_target") is not None:
        pieces.setdefault("halting_target", value("halting_target"))
    for kind, names in readers(key).items():
        if kind in pieces and pieces[kind] not in names:
            return f"--{kind.replace('_', '-')} {', '.join(names)}, not {pieces[kind]}"
    return None


def applies(key: str, chosen: dict[str, str], value: Optional[Callable[[str], object]] = None) -> bool:
    return unread(key, chosen, value) is None


def inapplicable(keys, chosen: dict[str, str], name=lambda key: spelled(key, {}, "--"),
                 value: Optional[Callable[[str], object]] = None) -> list[str]:
    """Each of `keys` the chosen pieces do not read, as a message naming it (`name(key)`) and its readers."""
    return [f"{name(key)} applies to {who}" for key in keys for who in [unread(key, chosen, value)] if who]


def implied_values(chosen: dict[str, str]) -> dict[str, tuple]:
    """key -> (value, "--step align"): what the chosen pieces imply, a later kind's winning."""
    found = {}
    for kind in PIECES:
        if kind in chosen and known(kind, chosen[kind]):
            found.update({key: (field.metadata["implied"][chosen[kind]], f"--{kind} {chosen[kind]}")
                          for key, (_, field) in PLACES.items() if chosen[kind] in field.metadata["implied"]})
            found.update({key: (value, f"--{kind} {name}") for name, piece in _plugins(kind) if name == chosen[kind]
                          for key, value in getattr(piece, "implied", {}).items()})
    return found


def implied_by_pieces(key: str) -> list[tuple[str, object]]:
    """(piece, value) for each piece implying a value of `key`, then parity's at paper scale, for --help."""
    implied = PLACES[key][1].metadata["implied"]
    found = [(name, implied[name]) for table in PIECES.values() for name in table if name in implied]
    if key in PAPER_SCALE:
        found.append((f"parity --elems > {PAPER_SCALE_ELEMS - 1}", PAPER_SCALE[key]))
    return found


def bias_value(values: dict, name: str = "halting-bias"):
    """halting_bias as a number: "prior" is the logit of lambda_p (lambda starts at the prior's)."""
    bias = values.get("halting_bias")
    if bias == "prior":
        p = values.get("lambda_p", PonderConfig.default("lambda_p"))
        return math.log(p / (1 - p)) if isinstance(p, (int, float)) and 0 < p < 1 else float("nan")
    try:
        return float(bias) if isinstance(bias, str) else bias
    except ValueError:
        raise BadValue(f"{name} must be a number or 'prior' (got {bias!r})") from None


def default_halting(cfg: "PonderConfig") -> str:
    """The rule a model was trained to halt by: a head trained on the answer, its threshold; else sample."""
    if "halting_threshold" in cfg.applying():
        return f"threshold:{cfg.method.halting_threshold!r}"
    return DEFAULT_HALTING


def flat(values: dict) -> dict:
    """A saved config by flat key, whether flat or by section ({"task": {"name": ..., ...}})."""
    found = {}
    for key, value in values.items():
        sections = key in SECTION_TYPES and isinstance(value, dict)
        found.update({key if name == "name" else name: item for name, item in value.items()} if sections
                     else {key: value})
    return found


def with_defaults(values: dict) -> dict:
    """A saved config by flat key (flat or by section), with the default of each setting it is
    older than: every setting a value."""
    return {**{key: PonderConfig.default(key) for key in PLACES}, **flat(values)}


_warned: set = set()  # each warning about a saved run once per process
_building = contextvars.ContextVar("building", default=False)  # build checks what it builds itself


@dataclass(frozen=True)
class PonderConfig:
    """`cfg.task.name`, `cfg.step.hidden`, `cfg.method.lambda_p`, `cfg.training.epochs`; flat as
    `to_dict()` / `of(**settings)` / `from_dict` / `replace`, all through `build`. Every config
    is checked (`problems`), however it was made."""
    task: TaskSettings = dataclasses.field(default_factory=TaskSettings)
    step: StepSettings = dataclasses.field(default_factory=StepSettings)
    method: MethodSettings = dataclasses.field(default_factory=MethodSettings)
    training: TrainingSettings = dataclasses.field(default_factory=TrainingSettings)

    def __post_init__(self) -> None:
        for section, kind in SECTION_TYPES.items():
            if not isinstance(getattr(self, section), kind):
                raise TypeError(f"PonderConfig.{section} must be a {kind.__name__}; PonderConfig.of(...) takes "
                                f"flat settings")
        problems = [] if _building.get() else self.problems()
        if problems:
            raise BadValue("; ".join(problems))

    @classmethod
    def build(cls, values: dict, given=(), origins: dict = {}, saved: str = "") -> "PonderConfig":
        """`values` by flat key, of which the user gave `given` (from files: `origins`), checked in
        the user's spelling. A saved run's setting its pieces do not read, at a value other than
        its default or what they imply, is one warning (`saved` names the run)."""
        unknown = sorted(set(values) - set(PLACES))
        if unknown:
            raise BadValue(f"unknown config keys {unknown}")
        target = values.get("halting_target", cls.default("halting_target"))
        if "halting_bias" in given and values.get("halting_bias") == "prior" and target != "prior":
            # the prior's logit would read --lambda-p, which a head trained on the answer refuses
            raise BadValue(f"{spelled('halting_bias', origins, '--')} prior is the logit of lambda-p, the prior's "
                           f"parameter, which --halting-target {target} has none of: give the bias as a number")
        values = {**values, "halting_bias": bias_value(values, spelled("halting_bias", origins))}
        by_section: dict = {section: {} for section in SECTION_TYPES}
        for key, value in values.items():  # a whole number does for a float
            by_section[PLACES[key][0]][PLACES[key][1].name] = float(value) if TYPES[key] in (
                float, Optional[float]) and type(value) is int else value
        building = _building.set(True)
        try:
            cfg = cls(**{section: kind(**by_section[section]) for section, kind in SECTION_TYPES.items()})
        finally:
            _building.reset(building)
        problems = cfg.problems(given, origins)
        if problems:
            raise BadValue("; ".join(problems))
        if saved:  # what a fresh run of these pieces holds is neutral too: what they imply, or derive
            chosen, fresh = cfg.chosen(), cls.of(**cfg.chosen())
            set_apart = [key for key in values if values[key] not in (cls.default(key), fresh.value(key))]
            for problem in inapplicable(set_apart, chosen, lambda key: f"{key} = {values[key]!r}", cfg.value):
                if (saved, problem) not in _warned:
                    _warned.add((saved, problem))
                    warnings.warn(f"{saved}: {problem}; it has no effect", PonderWarning, stacklevel=3)
        return cfg

    def problems(self, given=(), origins: dict = {}) -> list[str]:
        """What is wrong, first things first: each value alone; a step and task of other inputs; a
        setting given that the pieces do not read; a halting input the step does not show; what
        each piece refuses (`config_problems`). Named as the user gave it (`origins`)."""
        chosen = self.chosen()
        problems = [problem for key in PLACES for problem in problems_of(key, self.value(key), spelled(key, origins))]
        if problems:
            return problems
        for kind, name in chosen.items():
            known(kind, name)  # a piece an installed package registers joins its table here
        task, step = piece_declaration("task", self.task.name), piece_declaration("step", self.step.name)
        if task.input_kind and step.input_kind not in ("", task.input_kind):  # a step of no kind fits any task
            fitting = ", ".join(name for name in STEPS if piece_declaration("step", name).input_kind == task.input_kind)
            return [f"--step {self.step.name} does not fit --task {self.task.name} ({task.inputs}); choose {fitting}"]
        return (inapplicable(given, chosen, lambda key: spelled(key, origins, "--"), self.value)
                or [f"{spelled('halting_input', origins)} {self.method.halting_input}: step {self.step.name} has no "
                    f"{part} to show" for part in self.method.halting_input.split("+")[1:]
                    if part not in ("confidence", "previous", "answer", step.halting_feature)]
                or [problem for kind, name in chosen.items()
                    for problem in piece_declaration(kind, name).config_problems(self)])

    @classmethod
    def of(cls, *, origins: Optional[dict] = None, **given) -> "PonderConfig":
        """A config of the settings the user gave, by flat key (`origins`: key -> the file that gave
        it); the rest what the chosen pieces imply, what the task derives or the defaults."""
        chosen: dict = {}
        for kind in PIECES:  # a piece the user gave, else one an earlier piece implies, else the default
            chosen[kind] = given.get(kind, implied_values(chosen).get(kind, (cls.default(kind),))[0])
        values = {**{key: cls.default(key) for key in PLACES}, **{key: value for key, (value, _) in
                                                                  implied_values(chosen).items()}, **given, **chosen}
        if known("task", chosen["task"]):  # what the task derives, from every value (a default one too)
            values = piece_declaration("task", chosen["task"]).resolve_options(values, given)
        return cls.build(values, given, origins or {})

    @classmethod
    def from_dict(cls, values: dict, saved: str = "a saved run") -> "PonderConfig":
        """A saved run's config, flat or by section ({"task": {...}})."""
        return cls.build(flat(values), saved=saved)

    def replace(self, **changes) -> "PonderConfig":
        """A copy with these settings changed, by flat key; validated as a new config."""
        return self.build({**self.to_dict(), **changes}, given=changes)

    def chosen(self) -> dict[str, str]:
        """The piece of each kind: {"task": "mnist", "step": "mlp", "method": "pondernet"}."""
        return {kind: getattr(self, kind).name for kind in PIECES}

    def value(self, key: str):
        """A setting by its flat key: value("lambda_p") is cfg.method.lambda_p."""
        return getattr(getattr(self, PLACES[key][0]), PLACES[key][1].name)

    def sources(self, given, origins: Optional[dict] = None) -> dict[str, str]:
        """Each value's source: given, file F, implied by --step align, derived by --task parity, default."""
        implied, origins = implied_values(self.chosen()), origins or {}
        return {key: (f"file {origins[key]}" if key in origins else "given") if key in given
                else f"implied by {implied[key][1]}" if key in implied
                else "default" if self.value(key) == self.default(key) else f"derived by --task {self.task.name}"
                for key in PLACES}

    def applying(self) -> list[str]:
        """The settings this config's pieces read (`unread`, the one rule), in the config's order."""
        return [key for key in PLACES if applies(key, self.chosen(), self.value)]

    def shown_fields(self) -> list[str]:
        """What its pieces read and imply: what the configuration lines, info and config.toml show."""
        shown = {*self.applying(), *implied_values(self.chosen())}
        return [key for key in PLACES if key in shown]

    @staticmethod
    def field_names() -> tuple[str, ...]:
        return tuple(PLACES)

    @staticmethod
    def default(key: str):
        return PLACES[key][1].default

    def to_dict(self) -> dict:
        """The flat form that checkpoints, run folders and JSON output hold: {key: value}."""
        return {key: self.value(key) for key in PLACES}


# Files: a table per section, its settings under their flat keys; a flat file, JSON of either shape
# and a run's `config.json` are read too. A file overrides the defaults and what the pieces imply;
# flags override the file.
DOCUMENT_KEYS = ("format_version", "sources")  # what `--print-config -f json` writes beside the settings
# what a run's record gives a rerun besides its settings, as `ponder train --init-from --init-weights --amp`
START_KEYS = {"init_from": str, "init_weights": str, "amp": bool}


def start_options(record: Optional[dict]) -> dict:
    """What of a run's record a rerun is given besides its settings (reproduce line, config.toml,
    --config of its config.json): init_from and init_weights (its source's epoch and weights'
    digest), amp when on."""
    record, options = record or {}, {}
    start = record.get("init_from")
    if isinstance(start, dict):
        options.update(init_from=str(start.get("checkpoint")),
                       init_weights=f"{start.get('epoch')}:{start.get('weights')}")
    elif start:  # an older record: the path as it was given
        options["init_from"] = str(start)
    if record.get("amp"):
        options["amp"] = True
    return options


def read_config_file(path: Path) -> dict:
    """The settings a file gives, {key: value}: TOML (.toml) or JSON (anything else)."""
    path, toml = Path(path), Path(path).suffix.lower() == ".toml"
    problem = file_problem(path)
    if problem is not None:
        raise PonderError(f"--config {path} {problem}; name a .toml or .json configuration (a run folder's "
                          f"config.toml re-runs that run)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PonderError(f"--config {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        data = tomllib.loads(text) if toml else json.loads(text)
    except ValueError as exc:  # a TOMLDecodeError is one too
        raise PonderError(f"--config {path}: not valid {'TOML' if toml else 'JSON'} ({exc})" +
                          ("" if toml else "; TOML files must end in .toml")) from None
    if not isinstance(data, dict):
        raise PonderError(f"--config {path}: a JSON object of settings is needed, not a {type(data).__name__}")
    if isinstance(data.get("config"), dict) and "ponder_cli" in data:
        # a run's config.json holds every setting: those its pieces do not read had no effect on
        # it (a warning for any not at its neutral value), and are left out
        saved = {key: value for key, value in flat(data["config"]).items() if value is not None}
        try:
            applying = PonderConfig.from_dict(saved, saved=f"--config {path}").applying()
        except PonderError as exc:  # of its kind: a bad value stays one
            raise type(exc)(f"--config {path}: {exc}") from None
        return {**{key: value for key, value in saved.items() if key in applying}, **start_options(data)}
    values = {}
    for table, items in data.items():
        if table in DOCUMENT_KEYS:  # --print-config -f json's own keys, not settings
            continue
        if table in START_KEYS:
            if not isinstance(items, START_KEYS[table]):
                raise BadValue(f"--config {path}: {table} must be {'true or false' if table == 'amp' else 'text'}")
            values[table] = items
            continue
        if isinstance(items, dict) and table not in SECTIONS:
            raise BadValue(f"--config {path}: unknown table [{table}]; the tables are "
                           f"{', '.join(f'[{s}]' for s in SECTIONS)}")
        for key, value in (items.items() if isinstance(items, dict) else [(table, items)]):
            if key not in PLACES:
                close = difflib.get_close_matches(key, list(PLACES), n=1)
                raise BadValue(f"--config {path}: unknown setting {key!r}" +
                               (f" (did you mean {close[0]!r}?)" if close else ""))
            if isinstance(items, dict) and PLACES[key][0] != table:
                raise BadValue(f"--config {path}: {key} belongs in [{PLACES[key][0]}], not [{table}]")
            values[key] = value
    return values


def render_config(cfg: PonderConfig, sources: dict, fmt: str = "toml") -> str:
    """The settings its pieces read (None left out) by table, each with its source; read back, the
    same configuration. What the pieces imply but do not read (plain's one step) is a comment."""
    values, applying = cfg.to_dict(), cfg.applying()
    shown = [key for key in cfg.shown_fields() if values[key] is not None]
    settable = [key for key in shown if key in applying]
    if fmt == "json":
        tables = {section: {key: values[key] for key in keys if key in settable} for section, keys in SECTIONS.items()}
        return json.dumps({"format_version": FORMAT_VERSION, **tables,
                           "sources": {key: sources.get(key, "default") for key in settable}}, indent=2) + "\n"
    lines = ["# ponder train --config FILE (flags on the command line override it)"]
    for section, keys in SECTIONS.items():
        rows = [(f"{key} = {json.dumps(values[key])}", sources.get(key, "default")) for key in keys if key in settable]
        rows += [(f"# {key} = {json.dumps(values[key])}", f"{sources.get(key, 'default')}, not a setting of this "
                  f"{'method' if section == 'method' else 'run'}") for key in keys
                 if key in shown and key not in settable]
        width = max((len(text) for text, _ in rows), default=0)
        lines += ["", f"[{section}]", *(f"{text.ljust(width)}  # {source}" for text, source in rows)] if rows else []
    return "\n".join(lines) + "\n"
