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
            # only a saved config gets here: --max-steps given with plain is refused as not read
            problems.append(f"method plain runs exactly one step (got max-steps {cfg.method.max_steps})")
        return problems

    def halting_label(self, rule):
        return "one step"

    def needs_all_steps(self, rule):
        return False  # one step: every rule is the same prediction
