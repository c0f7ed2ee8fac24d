"""The evaluation statistics, on cases with known answers and by their coverage."""

import math

import numpy as np
import pytest

from metalearn.statistics import (
    diverged_mask,
    mean_and_ci95,
    median_and_ci95,
    paired_change,
    summarize,
)


def test_mean_and_ci95_known_answer():
    values = np.arange(1.0, 11.0)  # mean 5.5, sample std sqrt(55/6)
    mean, ci95 = mean_and_ci95(values)
    assert mean == 5.5
    assert ci95 == pytest.approx(1.96 * math.sqrt(55 / 6) / math.sqrt(10))


def test_ci95_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(2000):
        mean, ci95 = mean_and_ci95(rng.normal(3.0, 2.0, size=600))
        covered += abs(mean - 3.0) <= ci95
    assert 0.93 <= covered / 2000 <= 0.97


def test_nonfinite_tasks_are_counted_not_averaged():
    record = summarize(np.array([1.0, 3.0, np.inf, np.nan]))
    assert record == {
        "mean": 2.0,
        "ci95": pytest.approx(1.96 * math.sqrt(2) / math.sqrt(2)),
        "median": None,  # two of four tasks blew up: the median is a blow-up too
        "median_ci95": [1.0, None],
        "nonfinite": 2,
        "diverged": 2,
    }
    assert summarize(np.array([np.nan, np.nan]))["mean"] is None


def test_inf_nan_and_finite_blow_up_are_counted_and_the_median_ignores_them():
    # 10 tasks: 7 well adapted, one inf, one NaN and one finite blow-up to 1e20.
    values = np.array([0.3, 0.1, 0.5, 0.2, np.inf, 0.4, np.nan, 0.6, 1e20, 0.7])
    before = np.full(10, 3.0)
    record = summarize(values, before)
    assert record["nonfinite"] == 2 and record["diverged"] == 3
    # Median over all 10, the two non-finite ones counted as worst: sorted
    # [0.1 .. 0.7, 1e20, inf, inf] -> (0.5 + 0.6) / 2.
    assert record["median"] == pytest.approx(0.55)
    # Distribution-free interval: ranks floor(5 - 3.1) = 1 and ceil(1 + 5 + 3.1) = 10.
    assert record["median_ci95"] == [pytest.approx(0.1), None]
    # The mean is over finite values, so the 1e20 task dominates it: why the median is there.
    assert record["mean"] == pytest.approx((2.8 + 1e20) / 8)
    # A nearly flat task (before 0.01 -> after 0.3) is not a blow-up: the threshold is 10 x
    # max(its own loss before, the median loss before).
    small = summarize(np.array([0.3, 0.2, 0.2]), np.array([0.01, 3.0, 3.0]))
    assert small["diverged"] == 0 and small["nonfinite"] == 0
    assert summarize(np.array([31.0, 0.2, 0.2]), np.array([0.01, 3.0, 3.0]))["diverged"] == 1
    # Without the values before adaptation only non-finite tasks count; accuracy never blows up.
    assert summarize(values)["diverged"] == 2
    accuracy = summarize(
        np.array([0.9, np.nan, 0.8]), np.array([0.2, 0.2, 0.2]), lower_is_better=False
    )
    assert accuracy["diverged"] == 1 and accuracy["median"] == pytest.approx(0.8)


def test_median_ci95_covers_the_true_median_about_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    covered = 0
    for _ in range(1000):  # a heavy-tailed distribution with median 0
        _, lo, hi = median_and_ci95(rng.standard_cauchy(600))
        covered += lo <= 0.0 <= hi
    assert 0.93 <= covered / 1000 <= 0.975


def test_one_task_has_a_mean_and_no_interval():
    record = summarize(np.array([0.7]))
    assert record["mean"] == pytest.approx(0.7) and record["ci95"] is None


def test_the_paired_change_leaves_out_tasks_that_are_not_finite_in_either():
    after = np.array([1.0, np.nan, 3.0, np.inf, 2.0, 5.0])
    before = np.array([2.0, 1.0, np.inf, 1.0, 4.0, 4.5])
    diff = np.array([1.0 - 2.0, 2.0 - 4.0, 5.0 - 4.5])  # the three tasks finite in both
    expected = diff.mean(), 1.96 * diff.std(ddof=1) / math.sqrt(3)
    change = paired_change(after, before)
    assert change["change"] == pytest.approx(expected[0])
    assert change["change_ci95"] == pytest.approx(expected[1])


def test_divergence_is_judged_against_the_median_before_adaptation_not_the_mean():
    # 10 x max(0.01, median 0.01) = 0.1 < 5: task 0 diverged; the mean (33.3) would hide it.
    blown = diverged_mask(np.array([5.0, 0.005, 50.0]), np.array([0.01, 0.01, 100.0]))
    assert blown.tolist() == [True, False, False]
