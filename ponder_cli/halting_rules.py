"""The spellings of --halting, parsed in one place and without torch: a rule's name from
`registry.HALTING_RULES`, with a parameter where the rule takes one.

- sample, median, expected: PonderNet's own rules (see halting.py);
- quantile:Q (0 < Q < 1): halt at the first step where the cumulative halting probability
  1 - prod_k (1 - lambda_k) reaches Q; median is quantile:0.5 (PALBERT's Q-exit);
- patience:K (K >= 1): halt at the first step n whose predicted class argmax y_n is also that of
  each of the K steps before it (n >= K + 1), or at the last step (PABEE);
- confidence:C (0 < C < 1): halt at the first step whose top class probability max softmax(y_n)
  reaches C, or at the last step (CALM's softmax-response exit).

A rule keeps the user's spelling (`HaltingRule.spelling`): reports show it as it was given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

from .registry import HALTING_RULES

# what each rule with a parameter calls it and accepts, for help texts and messages
PARAMETERS = {"quantile": ("Q", "0 < Q < 1"), "patience": ("K", "a whole number K >= 1"),
              "confidence": ("C", "0 < C < 1")}
# rules that average every step's outputs rather than halt at one step
AVERAGING_RULES = ("expected",)
# the rules `ponder calibrate` chooses among, cheapest first within each family
CALIBRATION_RULES = ("quantile:0.5", "quantile:0.6", "quantile:0.7", "quantile:0.8", "quantile:0.9",
                     "quantile:0.95", "quantile:0.99", "patience:1", "patience:2", "patience:3", "patience:4",
                     "confidence:0.5", "confidence:0.7", "confidence:0.9", "confidence:0.95", "confidence:0.99",
                     "confidence:0.999")


@dataclass(frozen=True)
class HaltingRule:
    name: str  # one of registry.HALTING_RULES
    parameter: Union[float, int, None]  # Q of quantile, K of patience, C of confidence
    spelling: str  # as given (the name lower-cased)

    @property
    def quantile(self) -> Optional[float]:
        """The cumulative halting probability at which the rule halts (median: 1/2), or None."""
        return 0.5 if self.name == "median" else self.parameter if self.name == "quantile" else None

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
    return ", ".join(f"{name}:{PARAMETERS[name][0]}" if name in PARAMETERS else name for name in names)


def parse_halting_rule(text: Union[str, HaltingRule]) -> HaltingRule:
    """'median' -> HaltingRule('median', None, 'median'); 'quantile:0.9' -> ('quantile', 0.9, ...);
    'patience:2' -> ('patience', 2, ...). Raises ValueError, worded for the user."""
    if isinstance(text, HaltingRule):
        return text
    name, sep, value = str(text).strip().partition(":")
    name, value = name.strip().lower(), value.strip()
    if name not in HALTING_RULES:
        raise ValueError(f"unknown halting rule {text!r}; choose from {rule_choices()}")
    spelling = f"{name}:{value}" if sep else name
    if name not in PARAMETERS:
        if sep:
            raise ValueError(f"the {name} rule takes no parameter (got {text!r})")
        return HaltingRule(name, None, spelling)
    letter, accepted = PARAMETERS[name]
    if not sep or not value:
        raise ValueError(f"{name} needs its parameter: {name}:{letter} with {accepted} (got {text!r})")
    if name == "patience":
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"patience:K needs a whole number K >= 1 (got {value!r})")
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
