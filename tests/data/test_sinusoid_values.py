"""The sinusoid family's values, recovered in NumPy from the sampled points alone: every task is
one sinusoid A sin(x - phase) with A, phase and x in the configured ranges, drawn uniformly."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from scipy import stats

from metalearn.data.sinusoid import SinusoidConfig, sinusoid

TASKS = 2000


def fitted(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(amplitude, phase in [0, 2pi), largest residual) of y = a sin x + b cos x fitted by
    least squares: A sin(x - phase) = A cos(phase) sin x - A sin(phase) cos x."""
    basis = np.stack([np.sin(x), np.cos(x)], axis=1)
    (a, b), *_ = np.linalg.lstsq(basis, y, rcond=None)
    return (
        float(np.hypot(a, b)),
        float(np.arctan2(-b, a) % (2 * np.pi)),
        float(np.abs(basis @ [a, b] - y).max()),
    )


@pytest.fixture(scope="module")
def tasks():
    family = sinusoid(SinusoidConfig(amplitude_range=(0.5, 3.0), phase_range=(0.2, 2.0)))
    sample = jax.jit(jax.vmap(lambda k: family.sample({}, k, 4)))
    batch = sample(jax.random.split(jax.random.key(7), TASKS))
    x = np.concatenate([batch.support[0], batch.query[0]], axis=1)[..., 0].astype(np.float64)
    y = np.concatenate([batch.support[1], batch.query[1]], axis=1)[..., 0].astype(np.float64)
    return x, y


def test_each_task_is_one_sinusoid_in_range(tasks):
    x, y = tasks
    assert x.shape == (TASKS, 4 + 10)  # 4 shots, 10 query points by default
    fits = np.array([fitted(xi, yi) for xi, yi in zip(x, y, strict=True)])
    amplitude, phase, residual = fits.T
    assert residual.max() < 1e-5  # support and query lie on the same curve
    assert amplitude.min() >= 0.5 - 1e-5 and amplitude.max() <= 3.0 + 1e-5
    assert phase.min() >= 0.2 - 1e-5 and phase.max() <= 2.0 + 1e-5
    assert x.min() >= -5.0 and x.max() <= 5.0


def test_amplitude_phase_and_inputs_are_uniform(tasks):
    x, y = tasks
    amplitude, phase, _ = np.array([fitted(xi, yi) for xi, yi in zip(x, y, strict=True)]).T
    # Kolmogorov-Smirnov against the configured uniform laws; a wrong range or law gives p ~ 0
    assert stats.kstest(amplitude, stats.uniform(0.5, 2.5).cdf).pvalue > 1e-3
    assert stats.kstest(phase, stats.uniform(0.2, 1.8).cdf).pvalue > 1e-3
    assert stats.kstest(x.ravel()[:5000], stats.uniform(-5, 10).cdf).pvalue > 1e-3
    # the parameters are drawn independently of each other
    assert abs(stats.pearsonr(amplitude, phase).statistic) < 0.1
