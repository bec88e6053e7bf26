"""The one frozen configuration that flows through training and lives in every checkpoint, and
how its pieces are chosen: what each implies, reads and refuses."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional
from dataclasses import dataclass

from . import PonderError
from .registry import METHODS, STEPS, TASKS, known, method_class, step_class, task_class
from .settings import (PLACES, SECTION_TYPES, MethodSettings, StepSettings, TaskSettings,
                       TrainingSettings)


# The kinds of piece a config chooses: the config field that names the piece -> its registry
# table and loader. A later kind's implied values win over an earlier one's (plain's one step
# over align's twelve); an earlier kind may imply a later kind's piece (parity: --step gru).
PIECE_KINDS = {"task": (TASKS, task_class), "step": (STEPS, step_class), "method": (METHODS, method_class)}


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


def inapplicable(given, chosen: dict[str, str], spelled: Optional[dict[str, str]] = None) -> list[str]:
    """The one rule for options that do not apply: a field the user set that the chosen piece of
    some kind does not read, though other pieces of that kind do, is refused, naming who reads it.
    spelled: how the user gave a field, where not as its option ("train_rotation in --config
    FILE"), so that the message names what they wrote."""
    problems = []
    for field in given:
        for kind, names in readers(field).items():
            if chosen[kind] not in names:
                problems.append(f"{(spelled or {}).get(field) or option_name(field)} applies to --{kind} "
                                f"{', '.join(names)}, not {chosen[kind]}")
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
    """The configuration, a section per kind of piece and one for training: `cfg.task.name`,
    `cfg.step.hidden`, `cfg.method.lambda_p`, `cfg.training.epochs`. Checkpoints, JSON output and
    run folders hold it flat, a key per setting (`to_dict`); `of(**settings)` builds one from flat
    keys. Each section checks its own values, then each chosen piece the settings it reads."""
    task: TaskSettings = dataclasses.field(default_factory=TaskSettings)
    step: StepSettings = dataclasses.field(default_factory=StepSettings)
    method: MethodSettings = dataclasses.field(default_factory=MethodSettings)
    training: TrainingSettings = dataclasses.field(default_factory=TrainingSettings)

    def __post_init__(self) -> None:
        for section, kind in SECTION_TYPES.items():
            if not isinstance(getattr(self, section), kind):
                raise TypeError(f"PonderConfig.{section} must be a {kind.__name__}; PonderConfig.of(...) takes "
                                f"flat settings")
        problems = [problem for section in SECTION_TYPES for problem in getattr(self, section).type_problems()]
        if problems:  # no value can be checked beside one of the wrong type
            raise PonderError("; ".join(problems))
        for kind, name in self.chosen().items():
            known(kind, name)  # a piece an installed package registers joins its table here
        problems = [problem for section in SECTION_TYPES for problem in getattr(self, section).problems()]
        if all(name in PIECE_KINDS[kind][0] for kind, name in self.chosen().items()):
            # each chosen piece checks the settings it reads (parity its counts, align its turn)
            problems += [problem for kind, name in self.chosen().items()
                         for problem in load_piece(kind, name).config_problems(self)]
            if not problems:
                problems += self.step_problems()
        if problems:
            raise PonderError("; ".join(problems))

    def step_problems(self) -> list[str]:
        """What the chosen step function cannot do: show a halting feature it has none of, or
        honour a setting of another step's (a value other than the default)."""
        step = step_class(self.step.name)
        features = {"confidence", "previous", step.halting_feature}
        problems = [f"halting-input {self.method.halting_input}: step {self.step.name} has no {part} to show"
                    for part in self.method.halting_input.split("+")[1:] if part not in features]
        for name in self.field_names():
            others = readers(name).get("step", [])
            if others and self.step.name not in others and self.value(name) != self.default(name):
                problems.append(f"{name.replace('_', '-')} applies to --step {', '.join(others)}, not {self.step.name}")
        return problems

    @classmethod
    def of(cls, **settings) -> "PonderConfig":
        """A config of these settings, by flat key (`lambda_p=0.3, step="align"`); the rest default."""
        unknown = sorted(set(settings) - set(PLACES))
        if unknown:
            raise PonderError(f"unknown config keys {unknown}")
        by_section: dict[str, dict] = {section: {} for section in SECTION_TYPES}
        for key, value in settings.items():
            section, attribute = PLACES[key]
            by_section[section][attribute] = value
        return cls(**{section: kind(**by_section[section]) for section, kind in SECTION_TYPES.items()})

    @classmethod
    def from_options(cls, spelled: Optional[dict[str, str]] = None, **given) -> "PonderConfig":
        """A config from the options the user gave; the rest are the defaults, or what the chosen
        method or step implies (plain: one step). An option that no chosen piece reads is refused
        (see inapplicable, and its `spelled`)."""
        for kind in PIECE_KINDS:
            if kind in given:
                known(kind, given[kind])  # a piece an installed package registers joins its table here
        chosen = choose_pieces(given, cls.default)
        if all(name in PIECE_KINDS[kind][0] for kind, name in chosen.items()):  # else __post_init__ says so
            problems = fit_problems(chosen) or inapplicable(given, chosen, spelled)
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
        return cls.of(**values)

    def chosen(self) -> dict[str, str]:
        """The piece of each kind this config chooses: {"step": "mlp", "method": "pondernet"}."""
        return {kind: getattr(self, kind).name for kind in PIECE_KINDS}

    def value(self, key: str):
        """A setting by its flat key: value("lambda_p") is cfg.method.lambda_p."""
        section, attribute = PLACES[key]
        return getattr(getattr(self, section), attribute)

    def sources(self, given) -> dict[str, str]:
        """Where each value came from: "given", "implied by --step align" (or the method), "derived
        by --task parity" (a value the task fills in from others: parity's training counts from
        --elems), "default"."""
        implied = implied_values(self.chosen())

        def source(name: str) -> str:
            if name in given:
                return "given"
            if name in implied:
                return f"implied by {implied[name][1]}"
            return "default" if self.value(name) == self.default(name) else f"derived by --task {self.task.name}"

        return {name: source(name) for name in self.field_names()}

    def shown_fields(self) -> list[str]:
        """The settings that matter to this config's pieces, and whatever they imply: what the
        configuration lines, `ponder info` and a saved config.toml show."""
        implied = implied_values(self.chosen())
        return [name for name in self.field_names() if applies(name, self.chosen()) or name in implied]

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Every setting's flat key, section by section."""
        return tuple(PLACES)

    @classmethod
    def default(cls, key: str):
        """A setting's default value, without building (and validating) a config."""
        section, attribute = PLACES[key]
        return {f.name: f.default for f in dataclasses.fields(SECTION_TYPES[section])}[attribute]

    def to_dict(self) -> dict:
        """The flat form that checkpoints, run folders and JSON output hold: {key: value}."""
        return {key: self.value(key) for key in PLACES}

    @classmethod
    def from_dict(cls, values: dict) -> "PonderConfig":
        """Rebuild from a checkpoint's dict, flat ({key: value}) or by section ({"task": {...}});
        unknown keys mean another version wrote it."""
        flat = {}
        for key, value in values.items():
            if key in SECTION_TYPES and isinstance(value, dict):
                kind = SECTION_TYPES[key]
                flat.update({kind.key(attribute): item for attribute, item in value.items()})
            else:
                flat[key] = value
        cfg = cls.of(**flat)
        problems = fit_problems(cfg.chosen())
        if problems:
            raise PonderError(problems[0])
        return cfg

    def replace(self, **changes) -> "PonderConfig":
        """A copy with these settings changed, by flat key; validated as a new config."""
        return self.of(**{**self.to_dict(), **changes})
