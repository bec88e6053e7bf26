"""The uncertainty of a figure (plain Python): a share measured on a sample has Wilson's score
interval (inside [0, 1], keeping its coverage at 0 or n successes, where the normal
approximation collapses); a mean its standard error; a figure over repeated draws (--repeats)
the mean over them, with Student's t interval."""

from __future__ import annotations

import math
import statistics
from typing import Optional

Z_TWO_SIDED_95 = 1.959963984540054  # the normal 97.5% quantile: a two-sided 95% interval
Z_ONE_SIDED_95 = 1.6448536269514722  # the normal 95% quantile: a one-sided 95% bound


def _wilson(successes: float, n: int, z: float) -> tuple[float, float]:
    share = successes / n
    denominator = 1 + z * z / n
    centre = (share + z * z / (2 * n)) / denominator
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def wilson_interval(successes: float, n: int) -> list[float] | None:
    return list(_wilson(successes, n, Z_TWO_SIDED_95)) if n > 0 else None


def wilson_lower(successes: float, n: int) -> float | None:
    return _wilson(successes, n, Z_ONE_SIDED_95)[0] if n > 0 else None


def standard_error(sd: float, n: int) -> float | None:
    """Of a mean of `n` values of population sd `sd`; None below two values."""
    return sd * math.sqrt(n / (n - 1)) / math.sqrt(n) if n > 1 else None


def student_t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t, in closed form (Abramowitz & Stegun 26.7.3 and 26.7.4)."""
    theta = math.atan2(t, math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    term, total = (1.0, 1.0) if df % 2 == 0 else (math.cos(theta), math.cos(theta))
    for k in range(2 if df % 2 == 0 else 3, df, 2):  # the series' next terms, k = 2, 4, ... or 3, 5, ...
        term *= c2 * (k - 1) / k
        total += term
    a = s * total if df % 2 == 0 else (2 / math.pi) * (theta + (s * total if df > 1 else 0.0))
    return 0.5 + 0.5 * a


def _bisect(below, low: float, high: float, tolerance: float) -> tuple[float, float]:
    """The bracket [low, high] narrowed to `tolerance` around where `below(x)` turns False."""
    for _ in range(200):
        middle = (low + high) / 2
        if below(middle):
            low = middle
        else:
            high = middle
        if high - low < tolerance:
            break
    return low, high


def student_t_quantile(p: float, df: int) -> float:
    """The p quantile (p > 0.5) of Student's t: exact for every count (t(0.975, 31) = 2.040,
    where z = 1.96 is too narrow)."""
    high = 1.0
    while student_t_cdf(high, df) < p:
        high *= 2
    return sum(_bisect(lambda t: student_t_cdf(t, df) < p, 0.0, high, 1e-12)) / 2


def mean_ci(values: list[float], bounds: tuple[float, float] = (-math.inf, math.inf)
            ) -> tuple[float, Optional[list[float]]]:
    """Mean and its 95% interval from independent draws (Student's t), kept within `bounds`; no
    interval from a single draw."""
    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, None
    t = student_t_quantile(0.975, len(values) - 1)
    half = t * statistics.stdev(values) / len(values) ** 0.5
    return mean, [max(mean - half, bounds[0]), min(mean + half, bounds[1])]


def combine_draws(draws: list[dict]) -> dict:
    """One bucket from K independent draws: every figure the mean over draws (a float even where
    each draw gave a whole count), accuracy and mean steps with a 95% interval."""
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


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, by its continued fraction (Lentz's
    method, Numerical Recipes' betacf), which converges fast below x = (a + 1) / (a + b + 2);
    above it, by the symmetry I_x(a, b) = 1 - I_{1-x}(b, a)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - regularized_beta(b, a, 1.0 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 100_000):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-16:
            break
    return math.exp(log_front) * fraction / a


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p): I_{1-p}(n - k, k + 1)."""
    return 0.0 if k < 0 else 1.0 if k >= n else regularized_beta(n - k, k + 1, 1.0 - p)


def clopper_pearson_upper(k: int, n: int, risk: float) -> float:
    """The exact (Clopper–Pearson) upper 1 - risk bound on a share from k successes in n: the p
    at which P(Binomial(n, p) <= k) = risk; 1 when k = n."""
    return 1.0 if k >= n else _bisect(lambda p: binomial_cdf(k, n, p) > risk, k / n, 1.0, 1e-15)[1]
