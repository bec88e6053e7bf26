"""The one frozen configuration that flows through training and lives in every checkpoint."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

from . import PonderError
from .registry import (CNN_DROPOUT_MASKS, HALTING_INPUTS, METHODS, STEPS, TASKS, known, method_class,
                       step_class, task_class)


MAX_STEPS = 100  # a bound on the cost of an epoch (training runs every step for every image)
FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32: what the model's tensors can hold
MAX_SEED = 2 ** 63  # torch's generators take seeds below 2**64; we keep them signed 64-bit


def seed_problems(seed: int, what: str) -> list[str]:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < MAX_SEED:
        return [f"{what} must be an integer from 0 to 2**63 - 1 (got {seed})"]
    return []


# The kinds of piece a config chooses: the config field that names the piece -> its registry
# table and loader. A later kind's implied values win over an earlier one's (plain's one step
# over align's twelve); an earlier kind may imply a later kind's piece (parity: --step gru).
PIECE_KINDS = {"task": (TASKS, task_class), "step": (STEPS, step_class), "method": (METHODS, method_class)}


def parse_count_range(text: str, elems: int) -> tuple[int, int]:
    """'17-32' -> (17, 32), '5' -> (5, 5), checked against 1..elems; a PonderError otherwise."""
    lo, sep, hi = str(text).partition("-")
    try:
        bounds = (int(lo), int(hi) if sep else int(lo))
    except ValueError:
        raise PonderError(f"a count range is LO-HI or N (got {text!r})") from None
    if not 1 <= bounds[0] <= bounds[1] <= elems:
        raise PonderError(f"count range {text} must satisfy 1 <= LO <= HI <= {elems} (the elements of a vector)")
    return bounds


def choose_pieces(given: dict, default) -> dict[str, str]:
    """The piece of each kind: the user's, else one an earlier chosen piece implies (parity
    implies --step gru), else the default."""
    chosen: dict[str, str] = {}
    for kind in PIECE_KINDS:
        implied = {}
        for earlier, name in chosen.items():
            if name in PIECE_KINDS[earlier][0]:
                implied.update(load_piece(earlier, name).implied)
        chosen[kind] = given.get(kind, implied.get(kind, default(kind)))
    return chosen


def load_piece(kind: str, name: str):
    return PIECE_KINDS[kind][1](name)


def fit_problems(chosen: dict[str, str]) -> list[str]:
    """A step function that reads another kind of input than the task gives (mlp on parity
    vectors, gru on images)."""
    task, step = chosen.get("task"), chosen.get("step")
    kind = task_class(task).input_kind if task in TASKS else None
    if kind is not None and step in STEPS and step_class(step).input_kind != kind:
        fitting = [name for name in STEPS if step_class(name).input_kind == kind]
        return [f"--step {step} does not fit --task {task} ({task_class(task).inputs}); "
                f"choose {', '.join(fitting)}"]
    return []


def option_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def readers(field: str) -> dict[str, list[str]]:
    """For each kind of piece some of whose pieces read `field` (their `reads`), those pieces."""
    found = {}
    for kind, (table, load) in PIECE_KINDS.items():
        names = [name for name in table if field in load(name).reads]
        if names:
            found[kind] = names
    return found


def applies(field: str, chosen: dict[str, str]) -> bool:
    """Whether a field matters to the chosen pieces: every kind that has readers of it has it
    read by the chosen piece (a field no piece declares, like --epochs, applies to every run)."""
    return all(chosen[kind] in names for kind, names in readers(field).items())


def inapplicable(given, chosen: dict[str, str]) -> list[str]:
    """The one rule for options that do not apply: a field the user set that the chosen piece of
    some kind does not read, though other pieces of that kind do, is refused, naming who reads it."""
    problems = []
    for field in given:
        for kind, names in readers(field).items():
            if chosen[kind] not in names:
                problems.append(f"{option_name(field)} applies to --{kind} {', '.join(names)}, not {chosen[kind]}")
                break
    return problems


def implied_values(chosen: dict[str, str]) -> dict[str, tuple]:
    """field -> (value, "--step align"): what the chosen pieces imply unless the user says otherwise."""
    found = {}
    for kind, (table, load) in PIECE_KINDS.items():
        if chosen.get(kind) in table:
            found.update({name: (value, f"--{kind} {chosen[kind]}") for name, value in load(chosen[kind]).implied.items()})
    return found


def implied_by_pieces(field: str) -> list[tuple[str, object]]:
    """(piece, value) for every piece of any kind that implies a value of `field`, for --help."""
    return [(name, load(name).implied[field]) for table, load in PIECE_KINDS.values() for name in table
            if field in load(name).implied]


@dataclass(frozen=True)
class PonderConfig:
    # what is learnt (registry.TASKS): mnist digits (rotation as difficulty) or parity vectors
    # (the non-zero count as difficulty); checkpoints without the key are mnist
    task: str = "mnist"
    # pondernet (Banino et al. 2021), act (Graves 2016) or plain (one step: no pondering)
    method: str = "pondernet"
    # model
    step: str = "mlp"  # the step function (registry.STEPS)
    hidden: int = 64  # size of the recurrent state h_n
    hidden_cnn: int = 64  # size of the image embedding
    hidden_lin: int = 64  # hidden layer of the step MLP
    kernel_size: int = 5
    max_steps: int = 20
    halting_input: str = "state"  # what the halting head sees (registry.HALTING_INPUTS)
    align_turn: float = 30.0  # align: the largest turn of one step, in degrees
    # align: halting held back while the step still turns, lambda_n = sigmoid(z_n) (1 - min(1,
    # w_n / turn_gate)), w_n the step's work (the formula: steps/align.py's docstring). 0: off
    turn_gate: float = 0.0
    # initial bias of the halting head; None: the method's own (PyTorch's default init for
    # pondernet, Graves' +1 for act)
    halting_bias: Optional[float] = None
    cnn_dropout: float = 0.5  # Dropout2d after conv2, as in the reference
    cnn_dropout_mask: str = "shared"  # registry.CNN_DROPOUT_MASKS; per-step: a fresh mask at every step
    mlp_dropout: float = 0.2
    # loss
    lambda_p: float = 0.2  # parameter of the geometric prior on the halting step
    beta: float = 0.01  # weight of KL(p || p_G)
    tau: float = 0.01  # ACT: weight of the ponder cost N + R
    act_epsilon: float = 0.01  # ACT: halt once the halting units sum to 1 - epsilon
    # training drops an image from later steps once its remaining halting mass is below this
    # (0: every step of every image); ACT drops it at its own halting step (exact)
    truncation: float = 0.0
    # optimisation
    epochs: int = 20
    batch_size: int = 128
    lr: float = 1e-3
    grad_clip: float = 0.5
    patience: int = 5  # early stopping, in epochs without a better validation accuracy
    lr_patience: int = 2  # ReduceLROnPlateau, in epochs
    lr_factor: float = 0.1
    # data
    train_rotation: float = 22.5  # training images rotated uniformly within +-this many degrees
    val_size: int = 5000
    train_size: int = 0  # 0: every training image not held out for validation
    # parity: vectors of `elems` entries; training non-zero counts "LO-HI" ("": 1-elems);
    # an epoch is `batches_per_epoch` batches drawn on the fly
    elems: int = 64
    train_counts: str = ""
    batches_per_epoch: int = 1000
    # parity's count curriculum: over the first `curriculum` batches (0: off) the top training count
    # grows linearly from `curriculum_start` to the top of train_counts
    curriculum: int = 0
    curriculum_start: int = 2
    # gru: LayerNorm on the new state, orthogonal recurrent blocks, update-gate bias (min-pondernet)
    gru_layer_norm: bool = False
    gru_orthogonal: bool = False
    gru_update_bias: float = 0.0
    seed: int = 1234

    def __post_init__(self) -> None:
        problems = self._value_problems() + self._range_problems()
        if all(name in PIECE_KINDS[kind][0] for kind, name in self.chosen().items()):
            # each chosen piece checks the settings it reads (parity its counts, align its turn)
            problems += [problem for kind, name in self.chosen().items()
                         for problem in load_piece(kind, name).config_problems(self)]
            if not problems:
                problems += self.step_problems()
        if problems:
            raise PonderError("; ".join(problems))

    def _value_problems(self) -> list[str]:
        """Choices among the registered names; sizes, counts and finite float32 numbers."""
        problems = []
        for kind in PIECE_KINDS:
            known(kind, getattr(self, kind))  # a piece an installed package registers joins its table here
        for name, choices in (("task", TASKS), ("method", METHODS), ("step", STEPS), ("halting_input", HALTING_INPUTS),
                              ("cnn_dropout_mask", CNN_DROPOUT_MASKS)):
            if getattr(self, name) not in choices:
                problems.append(f"{name.replace('_', '-')} must be one of {', '.join(choices)} "
                                f"(got {getattr(self, name)!r})")
        for name in ("hidden", "hidden_cnn", "hidden_lin", "kernel_size", "max_steps",
                     "epochs", "batch_size", "val_size", "batches_per_epoch"):
            if getattr(self, name) <= 0:
                problems.append(f"{name.replace('_', '-')} must be > 0 (got {getattr(self, name)})")
        for name in ("patience", "lr_patience", "train_size", "curriculum"):
            if getattr(self, name) < 0:
                problems.append(f"{name.replace('_', '-')} must be >= 0 (got {getattr(self, name)})")
        for name in ("lambda_p", "beta", "tau", "act_epsilon", "lr", "grad_clip", "train_rotation", "lr_factor",
                     "cnn_dropout", "mlp_dropout", "truncation", "align_turn", "turn_gate", "gru_update_bias",
                     "halting_bias"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                problems.append(f"{name.replace('_', '-')} must be a finite number")
            elif value is not None and abs(value) > FLOAT32_MAX:  # the model's weights and losses are float32
                problems.append(f"{name.replace('_', '-')} must be at most {FLOAT32_MAX:.3g} in size, what a float32 "
                                f"holds (got {value:g})")
        return problems

    def _range_problems(self) -> list[str]:
        """The training settings within the range where they mean something (a piece checks its
        own: its `config_problems`)."""
        problems = []
        if self.lr <= 0:
            problems.append(f"lr must be > 0 (got {self.lr})")
        if self.grad_clip < 0:
            problems.append(f"grad-clip must be >= 0, 0 disables clipping (got {self.grad_clip})")
        if self.max_steps > MAX_STEPS:
            problems.append(f"max-steps must be <= {MAX_STEPS} (got {self.max_steps}): every step is computed for "
                            "every training image, so an epoch takes about max-steps times longer")
        problems += seed_problems(self.seed, "seed")
        if not 0 < self.lr_factor < 1:
            problems.append(f"lr-factor must be in (0, 1) (got {self.lr_factor})")
        return problems

    def step_problems(self) -> list[str]:
        """What the chosen step function cannot do: show a halting feature it has none of, or
        honour a setting of another step's (a value other than the default)."""
        step = step_class(self.step)
        features = {"confidence", "previous", step.halting_feature}
        problems = [f"halting-input {self.halting_input}: step {self.step} has no {part} to show"
                    for part in self.halting_input.split("+")[1:] if part not in features]
        for name in self.field_names():
            others = readers(name).get("step", [])
            if others and self.step not in others and getattr(self, name) != self.default(name):
                problems.append(f"{name.replace('_', '-')} applies to --step {', '.join(others)}, not {self.step}")
        return problems

    @classmethod
    def from_options(cls, **given) -> "PonderConfig":
        """A config from the options the user gave; the rest are the defaults, or what the chosen
        method or step implies (plain: one step). An option that no chosen piece reads is refused
        (see inapplicable)."""
        for kind in PIECE_KINDS:
            if kind in given:
                known(kind, given[kind])  # a piece an installed package registers joins its table here
        chosen = choose_pieces(given, cls.default)
        if all(name in PIECE_KINDS[kind][0] for kind, name in chosen.items()):  # else __post_init__ says so
            problems = fit_problems(chosen) or inapplicable(given, chosen)
            if problems:
                raise PonderError("; ".join(problems))
        values = {**{name: value for name, (value, _) in implied_values(chosen).items()}, **given, **chosen}
        if chosen["task"] in TASKS:
            values = task_class(chosen["task"]).resolve_options(values, given)
        if values.get("halting_bias") == "prior":  # lambda starts at the prior's lambda_p
            lambda_p = values.get("lambda_p", cls.default("lambda_p"))
            values["halting_bias"] = math.log(lambda_p / (1 - lambda_p)) if 0 < lambda_p < 1 else float("nan")
        elif isinstance(values.get("halting_bias"), str):
            try:
                values["halting_bias"] = float(values["halting_bias"])
            except ValueError:
                raise PonderError(f"halting-bias must be a number or 'prior' (got {values['halting_bias']!r})") from None
        return cls(**values)

    def chosen(self) -> dict[str, str]:
        """The piece of each kind this config chooses: {"step": "mlp", "method": "pondernet"}."""
        return {kind: getattr(self, kind) for kind in PIECE_KINDS}

    def sources(self, given) -> dict[str, str]:
        """Where each value came from: "given", "implied by --step align" (or the method), "default"."""
        implied = implied_values(self.chosen())
        return {name: "given" if name in given else f"implied by {implied[name][1]}" if name in implied else "default"
                for name in self.field_names()}

    def shown_fields(self) -> list[str]:
        """The fields that matter to this config's pieces, and whatever they imply: what the
        configuration lines, `ponder info` and a saved config.toml show."""
        implied = implied_values(self.chosen())
        return [name for name in self.field_names() if applies(name, self.chosen()) or name in implied]

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def default(cls, name: str):
        """A field's default value, without building (and validating) a config."""
        return {f.name: f.default for f in dataclasses.fields(cls)}[name]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "PonderConfig":
        """Rebuild from a checkpoint's plain dict; unknown keys mean another version wrote it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise PonderError(f"unknown config keys {unknown}")
        cfg = cls(**values)
        problems = fit_problems(cfg.chosen())
        if problems:
            raise PonderError(problems[0])
        return cfg

    def train_range(self) -> tuple[int, int]:
        """parity: the training non-zero counts (lo, hi)."""
        return parse_count_range(self.train_counts, self.elems) if self.train_counts else (1, self.elems)

    def replace(self, **changes) -> "PonderConfig":
        return dataclasses.replace(self, **changes)
