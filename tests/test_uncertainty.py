"""Every figure with its uncertainty: Wilson intervals and standard errors by hand, parity's
--repeats redrawing the vectors, halting coins that do not depend on how buckets are laid out."""

import json
import math

import pytest
import torch

from ponder_cli.api import EvalOptions, evaluate_checkpoint
from ponder_cli.reports import standard_error, wilson_interval, wilson_lower
from ponder_cli.tasks.parity import TEST_SEED, VALIDATION_SEED, evaluation_set, halting_coins


def test_wilson_interval_by_hand():
    # 8 of 10: p = 0.8, z = 1.96, z^2 = 3.8415; centre (0.8 + 0.19207) / 1.38415 = 0.71674,
    # half 1.96 * sqrt(0.016 + 0.0096037) / 1.38415 = 0.22659
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.49016, abs=1e-5) and high == pytest.approx(0.94332, abs=1e-5)
    # none of 20: [0, z^2 / (n + z^2)] = [0, 3.8415 / 23.8415], never a point at 0
    assert wilson_interval(0, 20) == pytest.approx([0.0, 0.161125], abs=1e-6)
    assert wilson_interval(0, 0) is None


def test_one_sided_lower_bound_and_standard_error_by_hand():
    # all of n agree: n / (n + z^2) with z = 1.6449 (one-sided 95%), z^2 = 2.70554
    assert wilson_lower(100, 100) == pytest.approx(100 / 102.70554, abs=1e-7)
    assert wilson_lower(0, 50) == 0.0
    # steps 1, 3 (population sd 1): sample sd sqrt(2), standard error sqrt(2) / sqrt(2) = 1
    assert standard_error(1.0, 2) == pytest.approx(1.0)
    assert standard_error(0.0, 1) is None


def _parity(counts, **options):
    report = evaluate_checkpoint("eval", "parity16-extrapolation", {"--counts": counts}, EvalOptions(**options))
    return report.buckets


def test_a_count_gives_the_same_figures_alone_or_in_a_wider_bucket():
    wide = _parity(["13-16"], limit=16)[0]
    singles = _parity(["13", "14", "15", "16"], limit=16)
    # the same vectors and, per count, the same coins: the wide bucket is the singles pooled
    assert wide["accuracy"] == pytest.approx(sum(b["accuracy"] for b in singles) / 4)
    assert wide["mean_steps"] == pytest.approx(sum(b["mean_steps"] for b in singles) / 4)


def test_coins_of_a_count_do_not_depend_on_the_rows_that_follow():
    few = halting_coins(torch.full((3,), 5), 16, 4, seed=7)
    many = halting_coins(torch.tensor([5] * 10 + [6] * 2), 16, 4, seed=7)
    assert few.shape == (4, 3) and torch.equal(few, many[:, :3])
    assert not torch.equal(many[:, :2], many[:, 10:])  # another count, other coins


def test_every_bucket_carries_its_interval_and_standard_error():
    bucket = _parity(["9-12"], limit=20)[0]
    n = bucket["images"]
    assert n == 80
    assert bucket["accuracy_wilson"] == pytest.approx(wilson_interval(round(bucket["accuracy"] * n), n))
    assert bucket["steps_se"] == pytest.approx(bucket["std_steps"] / math.sqrt(n - 1))
    assert bucket["accuracy_ci"] is None  # the interval over draws keeps its meaning: none from one draw


def test_repeats_redraw_the_vectors_not_only_the_coins():
    # ACT halts deterministically: with the vectors fixed, every draw gave the same accuracy
    report = evaluate_checkpoint("eval", "parity16-extrapolation-act", ["13-16"], EvalOptions(limit=16, repeats=3))
    bucket = report.buckets[0]
    low, high = bucket["accuracy_ci"]
    assert high - low > 0.01
    # the Wilson interval pools every vector of every draw: 3 draws of 4 counts x 16
    pooled = round(bucket["accuracy"] * 192)
    assert bucket["accuracy_wilson"] == pytest.approx(wilson_interval(pooled, 192))


def test_redrawn_vectors_are_neither_the_test_nor_the_validation_set():
    from ponder_cli.checkpoint import load_model
    from ponder_cli.folders import resolve_checkpoint
    from ponder_cli.tasks import get_task

    _, cfg, _ = load_model(resolve_checkpoint("parity16-extrapolation").path, "cpu")
    task = get_task(cfg)
    test = task.test_data(EvalOptions(limit=8), "cpu")
    first = task.bucket(test, (9, 9), [(9, 9)], 20, cfg.training.seed, None, draw=0)
    second = task.bucket(test, (9, 9), [(9, 9)], 20, cfg.training.seed + 1, None, draw=1)
    fixed = evaluation_set(16, 9, 9, 8, TEST_SEED).x
    assert torch.equal(first.inputs(0, 8), fixed)
    assert not torch.equal(second.inputs(0, 8), fixed)
    assert not torch.equal(second.inputs(0, 8), evaluation_set(16, 9, 9, 8, VALIDATION_SEED).x)


def test_the_table_shows_the_accuracy_interval_within_80_columns(ponder, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    result = ponder("extrapolate", "parity16-extrapolation", "--counts", "9-12", "--limit", 16)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    data = json.loads(ponder("extrapolate", "parity16-extrapolation", "--counts", "9-12", "--limit", 16,
                             "-f", "json").stdout)["buckets"][0]
    low, high = data["accuracy_wilson"]
    assert any(f"{data['accuracy']:.4f} ±{(high - low) / 2:.4f}" in line for line in lines)


def test_intervals_use_students_t_for_every_count():
    """t(0.975, n - 1) exactly, from two draws to thousands: from 32 draws up it was z = 1.96,
    up to 4% too narrow (t(0.975, 31) = 2.0395)."""
    import statistics

    from scipy.stats import t

    from ponder_cli.reports.uncertainty import mean_ci, student_t_quantile

    for df in (1, 2, 5, 30, 31, 32, 100, 2000):
        assert math.isclose(student_t_quantile(0.975, df), t.ppf(0.975, df), rel_tol=1e-10)
    values = [0.9 + 0.01 * (i % 5) for i in range(32)]
    mean, (low, high) = mean_ci(values)
    half = t.ppf(0.975, 31) * statistics.stdev(values) / math.sqrt(32)
    assert math.isclose(high - mean, half, rel_tol=1e-10) and math.isclose(mean - low, half, rel_tol=1e-10)
