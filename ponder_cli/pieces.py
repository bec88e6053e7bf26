"""The built-in step functions and methods as the settings read them, without torch: what a step
reads (`input_kind`) and shows the halting head (`halting_feature`), what each refuses
(`config_problems`). registry.STEPS and METHODS name these; each `implementation`, the class that
builds the piece (steps/, model.py), subclasses its declaration, so a fact is declared once. No
torch: `ponder info` checks a saved configuration with them."""

from __future__ import annotations

from typing import Optional

from .config import applies


# step functions ---------------------------------------------------------------------------------

class Step:
    """What every step function declares (steps.StepFunction, the class they build from, adds the rest)."""
    halting_feature: Optional[str] = None
    input_kind: str = ""  # the kind of input it reads: it fits every task giving that kind

    @classmethod
    def config_problems(cls, cfg) -> list[str]:
        """The step's own settings out of their range, as messages for the user."""
        return []


class MLP(Step):
    implementation = "ponder_cli.steps.mlp:MLPStep"
    input_kind = "images"


class Align(Step):
    implementation = "ponder_cli.steps.align:AlignStep"
    halting_feature = "turn"
    input_kind = "images"


class Vectors(Step):
    input_kind = "vectors"


class RNN(Vectors):
    implementation = "ponder_cli.steps.vectors:RNNStep"


class GRU(Vectors):
    implementation = "ponder_cli.steps.vectors:GRUStep"


# methods ------------------------------------------------------------------------------------------

class Method:
    """What every method declares (model.Method, the class they build from, adds the rest)."""
    name: str = ""

    @classmethod
    def config_problems(cls, cfg) -> list[str]:
        """What this method cannot train with beside the other settings, as messages for the user."""
        return []


class PonderNet(Method):
    implementation = "ponder_cli.model:PonderNetMethod"
    name = "pondernet"

    @classmethod
    def config_problems(cls, cfg):
        problems, m = [], cfg.method
        if not applies("depth_min", {"method": cls.name}):  # plain: one step, no depth to draw
            return problems
        if m.depth_min > m.max_steps:
            problems.append(f"depth-min {m.depth_min} is above max-steps {m.max_steps}: inputs train at a depth "
                            f"drawn from depth-min to max-steps")
        if m.halting_target != "prior" and (m.truncation > 0 or m.depth_min):
            problems.append(f"halting-target {m.halting_target} trains on every step's answer: give truncation 0 "
                            f"and depth-min 0 (got {m.truncation:g} and {m.depth_min}; --step align implies "
                            f"truncation 0.1)")
        if m.depth_min and m.truncation > 0 and m.truncation_rule == "roulette":
            problems.append("depth-min trains with truncation-rule cut, not roulette (roulette's loss weights "
                            "assume its own coins alone decide where an input stops)")
        return problems


class Plain(PonderNet):
    implementation = "ponder_cli.model:PlainMethod"
    name = "plain"

    @classmethod
    def config_problems(cls, cfg):
        problems = super().config_problems(cfg)
        if cfg.method.max_steps != 1:
            # only a saved config gets here: --max-steps given with plain is refused as not read
            problems.append(f"method plain runs exactly one step (got max-steps {cfg.method.max_steps})")
        return problems


class ACT(Method):
    implementation = "ponder_cli.model:ACTMethod"
    name = "act"
