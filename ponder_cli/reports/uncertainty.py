"""The uncertainty of a figure (plain Python, no torch): measured on one sample, and over
repeated draws (`--repeats`).

A share (accuracy, agreement) measured on a sample is a binomial proportion: its interval is
Wilson's score interval, which stays inside [0, 1] and keeps its coverage at 0 or n successes,
where the normal approximation collapses to a point. A mean (ponder steps) has its standard
error. Over repeated draws, each figure is the mean over the draws, with Student's t interval.
"""

from __future__ import annotations

import math
import statistics
from typing import Optional

# one sample -------------------------------------------------------------------------------------

Z_TWO_SIDED_95 = 1.959963984540054  # the normal 97.5% quantile: a two-sided 95% interval
Z_ONE_SIDED_95 = 1.6448536269514722  # the normal 95% quantile: a one-sided 95% bound


def _wilson(successes: float, n: int, z: float) -> tuple[float, float]:
    share = successes / n
    denominator = 1 + z * z / n
    centre = (share + z * z / (2 * n)) / denominator
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def wilson_interval(successes: float, n: int) -> list[float] | None:
    """Wilson's two-sided 95% interval [low, high] for a share of `successes` out of `n`
    (None for no trials)."""
    return list(_wilson(successes, n, Z_TWO_SIDED_95)) if n > 0 else None


def wilson_lower(successes: float, n: int) -> float | None:
    """Wilson's one-sided 95% lower bound: the true share is at least this with 95% confidence."""
    return _wilson(successes, n, Z_ONE_SIDED_95)[0] if n > 0 else None


def standard_error(sd: float, n: int) -> float | None:
    """The standard error of a mean of `n` values whose population standard deviation is `sd`
    (the sample's, corrected by n / (n - 1)); None below two values."""
    return sd * math.sqrt(n / (n - 1)) / math.sqrt(n) if n > 1 else None


# repeated draws ---------------------------------------------------------------------------------

# Student's t, 97.5% quantile, for 1..30 degrees of freedom (a 95% two-sided interval)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042)


def mean_ci(values: list[float], bounds: tuple[float, float] = (-math.inf, math.inf)
            ) -> tuple[float, Optional[list[float]]]:
    """Mean and its 95% confidence interval [low, high] from independent draws (Student's t
    with n - 1 degrees of freedom), kept within `bounds` (an accuracy: 0 to 1); no interval
    from a single draw."""
    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, None
    t = _T975[len(values) - 2] if len(values) - 1 <= len(_T975) else 1.960
    half = t * statistics.stdev(values) / len(values) ** 0.5
    return mean, [max(mean - half, bounds[0]), min(mean + half, bounds[1])]


def combine_draws(draws: list[dict]) -> dict:
    """One bucket from K independent draws of rotations and coins: every figure is the mean over
    draws; accuracy and mean steps also get a 95% interval (`accuracy_ci`, `mean_steps_ci`), and
    the histogram is the mean count per draw. Means are floats even where every draw gave a
    whole count, so that a figure's type never depends on the draws' luck."""
    first = draws[0]
    if len(draws) == 1:
        return {**first, "repeats": 1, "accuracy_ci": None, "mean_steps_ci": None}
    combined = dict(first)
    for key, value in first.items():
        values = [d[key] for d in draws]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "images" \
                and all(v is not None for v in values):
            combined[key] = statistics.fmean(values)
        elif isinstance(value, list) and value and isinstance(value[0], (int, float)):
            combined[key] = [statistics.fmean(column) for column in zip(*values)]
        elif value is None or any(v is None for v in values):
            present = [v for v in values if v is not None]
            combined[key] = statistics.fmean(present) if present and isinstance(present[0], float) else value
    combined["accuracy"], combined["accuracy_ci"] = mean_ci([d["accuracy"] for d in draws], bounds=(0.0, 1.0))
    combined["mean_steps"], combined["mean_steps_ci"] = mean_ci([d["mean_steps"] for d in draws])
    combined["repeats"] = len(draws)
    return combined
