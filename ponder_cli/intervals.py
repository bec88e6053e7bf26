"""The uncertainty of a figure measured on a sample (plain Python, no torch).

A share (accuracy, agreement) is a binomial proportion: its interval is Wilson's score
interval, which stays inside [0, 1] and keeps its coverage at 0 or n successes, where the
normal approximation collapses to a point. A mean (ponder steps) has its standard error.
"""

from __future__ import annotations

import math

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
