"""The sections of the configuration, one per kind of piece and one for training, each a frozen
dataclass that checks its own values (`problems`); `config.PonderConfig` holds one of each. Also
the flat keys every setting is known by outside (its option's name: checkpoints, JSON, config
files) and where each sits."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

from . import PonderError
from .registry import CNN_DROPOUT_MASKS, HALTING_INPUTS, METHODS, STEPS, TASKS, TRUNCATION_RULES

MAX_STEPS = 100  # a bound on the cost of an epoch (training runs every step for every image)
FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32: what the model's tensors can hold
MAX_SEED = 2 ** 63  # torch's generators take seeds below 2**64; we keep them signed 64-bit


def seed_problems(seed: int, what: str) -> list[str]:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < MAX_SEED:
        return [f"{what} must be an integer from 0 to 2**63 - 1 (got {seed})"]
    return []


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



# A setting's annotated type -> the Python types its value may have, and how a message names it
_KINDS = {"int": ((int,), "a whole number"), "float": ((float, int), "a number"), "str": ((str,), "a string"),
          "bool": ((bool,), "true or false"), "Optional[float]": ((float, int, type(None)), "a number or none")}


class Settings:
    """One section of the configuration: the settings of one kind of piece, or of training. Its
    `problems` check each value on its own (a registered name, a size, a finite float32 number);
    what a value means beside the others is the chosen piece's `config_problems`."""
    section = ""
    choices: dict = {}  # attribute -> the registry table its value must be in
    positive: tuple = ()
    non_negative: tuple = ()
    numbers: tuple = ()  # finite, and within float32 (None allowed: halting_bias)

    @classmethod
    def key(cls, attribute: str) -> str:
        """The setting's flat key (its option's name): a section's `name` is the section's own."""
        return cls.section if attribute == "name" else attribute

    def type_problems(self) -> list[str]:
        """Values of the wrong type (a checkpoint's or a file's `max_steps = "twenty"`), each
        naming its key as files and checkpoints spell it: checked before any value is compared."""
        problems = []
        for f in dataclasses.fields(self):
            value, wanted = getattr(self, f.name), _KINDS.get(str(f.type))
            if wanted is not None and type(value) not in wanted[0]:  # type(): True is no whole number
                problems.append(f"{self.key(f.name)} must be {wanted[1]} (got {value!r})")
        return problems

    def problems(self) -> list[str]:
        problems = []
        for attribute, choices in self.choices.items():
            if getattr(self, attribute) not in choices:
                problems.append(f"{self.key(attribute).replace('_', '-')} must be one of {', '.join(choices)} "
                                f"(got {getattr(self, attribute)!r})")
        problems += [f"{name.replace('_', '-')} must be > 0 (got {getattr(self, name)})" for name in self.positive
                     if getattr(self, name) <= 0]
        problems += [f"{name.replace('_', '-')} must be >= 0 (got {getattr(self, name)})" for name in self.non_negative
                     if getattr(self, name) < 0]
        for name in self.numbers:
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                problems.append(f"{name.replace('_', '-')} must be a finite number")
            elif value is not None and abs(value) > FLOAT32_MAX:  # the model's weights and losses are float32
                problems.append(f"{name.replace('_', '-')} must be at most {FLOAT32_MAX:.3g} in size, what a float32 "
                                f"holds (got {value:g})")
        return problems


@dataclass(frozen=True)
class TaskSettings(Settings):
    # what is learnt (registry.TASKS): mnist digits (rotation as difficulty) or parity vectors
    # (the non-zero count as difficulty); checkpoints without the key are mnist
    name: str = "mnist"
    # parity: vectors of `elems` entries; training non-zero counts "LO-HI" ("": 1-elems);
    # an epoch is `batches_per_epoch` batches drawn on the fly
    elems: int = 64
    train_counts: str = ""
    batches_per_epoch: int = 1000
    # parity's count curriculum: over the first `curriculum` batches (0: off) the top training count
    # grows linearly from `curriculum_start` to the top of train_counts
    curriculum: int = 0
    curriculum_start: int = 2
    train_rotation: float = 22.5  # mnist: training images rotated uniformly within +-this many degrees
    val_size: int = 5000
    train_size: int = 0  # mnist: 0 trains on every image not held out for validation

    section = "task"
    choices = {"name": TASKS}
    positive = ("val_size", "batches_per_epoch")
    non_negative = ("train_size", "curriculum")
    numbers = ("train_rotation",)

    def train_range(self) -> tuple[int, int]:
        """parity: the training non-zero counts (lo, hi)."""
        return parse_count_range(self.train_counts, self.elems) if self.train_counts else (1, self.elems)


@dataclass(frozen=True)
class StepSettings(Settings):
    name: str = "mlp"  # the step function (registry.STEPS)
    hidden: int = 64  # size of the recurrent state h_n
    hidden_cnn: int = 64  # size of the image embedding
    hidden_lin: int = 64  # hidden layer of the step MLP
    kernel_size: int = 5
    cnn_dropout: float = 0.5  # Dropout2d after conv2, as in the reference
    cnn_dropout_mask: str = "shared"  # registry.CNN_DROPOUT_MASKS; per-step: a fresh mask at every step
    mlp_dropout: float = 0.2
    align_turn: float = 30.0  # align: the largest turn of one step, in degrees
    # align: halting held back while the step still turns, lambda_n = sigmoid(z_n) (1 - min(1,
    # w_n / turn_gate)), w_n the step's work (the formula: steps/align.py's docstring). 0: off
    turn_gate: float = 0.0
    # gru: LayerNorm on the new state, orthogonal recurrent blocks, update-gate bias (min-pondernet)
    gru_layer_norm: bool = False
    gru_orthogonal: bool = False
    gru_update_bias: float = 0.0

    section = "step"
    choices = {"name": STEPS, "cnn_dropout_mask": CNN_DROPOUT_MASKS}
    positive = ("hidden", "hidden_cnn", "hidden_lin", "kernel_size")
    numbers = ("cnn_dropout", "mlp_dropout", "align_turn", "turn_gate", "gru_update_bias")


@dataclass(frozen=True)
class MethodSettings(Settings):
    # pondernet (Banino et al. 2021), act (Graves 2016) or plain (one step: no pondering)
    name: str = "pondernet"
    max_steps: int = 20
    halting_input: str = "state"  # what the halting head sees (registry.HALTING_INPUTS)
    # initial bias of the halting head; None: the method's own (PyTorch's default init for
    # pondernet, Graves' +1 for act)
    halting_bias: Optional[float] = None
    lambda_p: float = 0.2  # parameter of the geometric prior on the halting step
    beta: float = 0.01  # weight of KL(p || p_G)
    tau: float = 0.01  # ACT: weight of the ponder cost N + R
    act_epsilon: float = 0.01  # ACT: halt once the halting units sum to 1 - epsilon
    # training drops an input from later steps once its remaining halting mass is below this
    # (0: every step of every input); ACT drops it at its own halting step (exact)
    truncation: float = 0.0
    # pondernet: what happens below the truncation (registry.TRUNCATION_RULES): cut stops the
    # input; roulette goes on with probability (remaining mass) / truncation, an unbiased loss
    truncation_rule: str = "cut"

    section = "method"
    choices = {"name": METHODS, "halting_input": HALTING_INPUTS, "truncation_rule": TRUNCATION_RULES}
    positive = ("max_steps",)
    numbers = ("halting_bias", "lambda_p", "beta", "tau", "act_epsilon", "truncation")

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.max_steps > MAX_STEPS:
            problems.append(f"max-steps must be <= {MAX_STEPS} (got {self.max_steps}): every step is computed for "
                            "every training input, so an epoch takes about max-steps times longer")
        return problems


@dataclass(frozen=True)
class TrainingSettings(Settings):
    epochs: int = 20
    batch_size: int = 128
    lr: float = 1e-3
    grad_clip: float = 0.5
    patience: int = 5  # early stopping, in epochs without a better validation accuracy
    lr_patience: int = 2  # ReduceLROnPlateau, in epochs
    lr_factor: float = 0.1
    seed: int = 1234

    section = "training"
    positive = ("epochs", "batch_size")
    non_negative = ("patience", "lr_patience")
    numbers = ("lr", "grad_clip", "lr_factor")

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.lr <= 0:
            problems.append(f"lr must be > 0 (got {self.lr})")
        if self.grad_clip < 0:
            problems.append(f"grad-clip must be >= 0, 0 disables clipping (got {self.grad_clip})")
        if not 0 < self.lr_factor < 1:
            problems.append(f"lr-factor must be in (0, 1) (got {self.lr_factor})")
        return problems + seed_problems(self.seed, "seed")


SECTION_TYPES = {kind.section: kind for kind in (TaskSettings, StepSettings, MethodSettings, TrainingSettings)}
# every setting's flat key (its option's name, the key of checkpoints and JSON) -> (section, attribute)
PLACES = {kind.key(f.name): (section, f.name) for section, kind in SECTION_TYPES.items()
          for f in dataclasses.fields(kind)}
SECTIONS = {section: tuple(kind.key(f.name) for f in dataclasses.fields(kind))
            for section, kind in SECTION_TYPES.items()}
SECTION_OF = {key: section for key, (section, _) in PLACES.items()}


def setting_types() -> dict[str, object]:
    """Each setting's flat key -> its annotated type ("int", "Optional[float]")."""
    return {kind.key(f.name): f.type for kind in SECTION_TYPES.values() for f in dataclasses.fields(kind)}
