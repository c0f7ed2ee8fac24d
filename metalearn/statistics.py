"""The statistics of an evaluation's per-task values, as the papers' tables report them: the
mean and its normal 95% confidence interval, the median with a distribution-free interval, the
paired change from before adaptation, and the count of tasks that diverged."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def mean_and_ci95(values: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """Mean and half-width of the normal 95% confidence interval, 1.96 * s / sqrt(n) (ddof=1,
    as in the MAML paper's tables).

    >>> mean_and_ci95([1.0, 2.0, 3.0, 4.0])
    (2.5, 1.2651...)
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no values to average")
    if values.size == 1:
        return float(values[0]), float("nan")
    return float(values.mean()), float(1.96 * values.std(ddof=1) / math.sqrt(values.size))


# A task diverged when its value is not finite or, for a loss, above DIVERGENCE_FACTOR times the
# larger of its loss before adaptation and that loss's median (a nearly flat task is not).
DIVERGENCE_FACTOR = 10.0


def median_and_ci95(values: np.ndarray) -> tuple[float, float, float]:
    """Median and a distribution-free 95% interval for it, from order statistics (ranks by the
    binomial's normal approximation): valid for heavy tails too. The caller maps NaN to an end.

    >>> median_and_ci95(np.arange(1.0, 101.0))
    (50.5, 40.0, 61.0)
    """
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    n = ordered.size
    half = 1.96 * math.sqrt(n) / 2
    lo = max(int(math.floor(n / 2 - half)), 1)
    hi = min(int(math.ceil(n / 2 + half)) + 1, n)
    return float(np.median(ordered)), float(ordered[lo - 1]), float(ordered[hi - 1])


def json_float(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def diverged_mask(
    values: np.ndarray, before: np.ndarray | None = None, *, lower_is_better: bool = True
) -> np.ndarray:
    """Per task, whether it diverged (the rule above, the loss rule when ``before`` is given).

    >>> diverged_mask(np.array([0.2, 40.0, np.nan, 31.0]), np.array([3.0, 3.0, 3.0, 0.01])).tolist()
    [False, True, True, True]
    """
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    blown = ~finite
    if before is not None and lower_is_better:
        before = np.asarray(before, dtype=np.float64)
        finite_before = before[np.isfinite(before)]
        floor = np.median(finite_before) if finite_before.size else np.inf
        with np.errstate(invalid="ignore"):
            blown |= finite & (values > DIVERGENCE_FACTOR * np.maximum(before, floor))
    return blown


def summarize(
    values: np.ndarray, before: np.ndarray | None = None, *, lower_is_better: bool = True
) -> dict:
    """Mean and ci95 over the finite per-task values, the median over all (a non-finite value
    counted as the worst), and the counts of non-finite and diverged tasks.

    >>> r = summarize(np.array([1.0, 2.0, 3.0, 4.0, np.inf, np.nan, 1e20]), before=np.full(7, 5.0))
    >>> r["nonfinite"], r["diverged"], r["median"]
    (2, 3, 4.0)
    """
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    nonfinite = int(values.size - finite.sum())
    blown = diverged_mask(values, before, lower_is_better=lower_is_better)
    worst = np.inf if lower_is_better else -np.inf
    median, lo, hi = median_and_ci95(np.where(np.isnan(values), worst, values))
    record = {
        "median": json_float(median),
        "median_ci95": [json_float(lo), json_float(hi)],
        "nonfinite": nonfinite,
        "diverged": int(blown.sum()),
    }
    return {**_mean_ci(values[finite], "mean", "ci95"), **record}


def paired_change(after: np.ndarray, before: np.ndarray) -> dict:
    """``{"change": mean, "change_ci95": half-width}`` of ``after - before`` over the tasks
    where both are finite: a paired interval, narrower than the values' own.

    >>> paired_change(np.array([-10.0, -50.0, -90.0]), np.array([-12.0, -51.0, -93.0]))
    {'change': 2.0, 'change_ci95': 1.1316...}
    """
    diff = np.asarray(after, np.float64) - np.asarray(before, np.float64)
    return _mean_ci(diff[np.isfinite(diff)], "change", "change_ci95")


def _mean_ci(values: np.ndarray, mean: str, ci: str) -> dict:
    """``{mean: ..., ci: ...}`` of :func:`mean_and_ci95`, None where undefined."""
    if values.size == 0:
        return {mean: None, ci: None}
    m, ci95 = mean_and_ci95(values)
    return {mean: m, ci: None if math.isnan(ci95) else ci95}
