"""The "couldn't a plain network do as well?" baseline: PonderNet's network run for one step."""

from __future__ import annotations

from .pondernet import PonderNetMethod


class PlainMethod(PonderNetMethod):
    name = "plain"
    implied = {"max_steps": 1}
    # one step: p_1 = 1 whatever the halting head says, so no halting or prior setting matters
    reads = ()

    @classmethod
    def config_problems(cls, cfg):
        problems = super().config_problems(cfg)
        if cfg.method.max_steps != 1:
            problems.append(f"method plain runs exactly one step: leave out --max-steps or use 1 "
                            f"(got {cfg.method.max_steps})")
        return problems

    def halting_label(self, rule):
        return "one step"

    def needs_all_steps(self, rule):
        return False  # one step: every rule is the same prediction
