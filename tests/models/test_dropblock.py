"""DropBlock against a loop-by-loop NumPy construction, and its statistics over many draws."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.models.dropblock import block_mask, clipped_block_size, drop_block, seed_rate


def numpy_keep_mask(seeds: np.ndarray, block_size: int) -> np.ndarray:
    """MetaOptNet's construction, NHWC: every seed at (i, j) zeroes [i, i+b) x [j, j+b)."""
    n, sh, sw, c = seeds.shape
    keep = np.ones((n, sh + block_size - 1, sw + block_size - 1, c), np.float32)
    for b, i, j, ch in zip(*np.nonzero(seeds), strict=True):
        keep[b, i : i + block_size, j : j + block_size, ch] = 0.0
    return keep


def numpy_gamma(rate: float, b: int, h: int, w: int) -> float:
    return rate / b**2 * h * w / ((h - b + 1) * (w - b + 1))


def coverage(size: int, b: int) -> np.ndarray:
    """How many seed positions of one axis cover each of its ``size`` positions."""
    return np.array([sum(i <= p < i + b for i in range(size - b + 1)) for p in range(size)])


def expected_kept_fraction(rate: float, b: int, h: int, w: int) -> float:
    """Exact E[kept fraction]: a position covered by m seed positions is kept w.p. (1-g)^m."""
    g = numpy_gamma(rate, b, h, w)
    m = np.outer(coverage(h, b), coverage(w, b))
    return float(np.mean((1.0 - g) ** m))


@pytest.mark.parametrize("shape, b", [((3, 6, 6, 4), 5), ((2, 10, 7, 3), 3), ((2, 4, 4, 2), 1)])
def test_block_mask_matches_the_loop_construction(shape, b):
    n, h, w, c = shape
    seeds = np.random.default_rng(0).random((n, h - b + 1, w - b + 1, c)) < 0.2
    seeds[0, 0, 0, 0] = seeds[-1, -1, -1, -1] = True  # squares at both corners
    got = np.asarray(block_mask(jnp.asarray(seeds), b))
    np.testing.assert_array_equal(got, numpy_keep_mask(seeds, b))
    assert got.shape == shape


@pytest.mark.parametrize("shape, b, rate", [((4, 10, 10, 8), 5, 0.1), ((3, 5, 6, 5), 2, 0.3)])
def test_drop_block_matches_numpy_given_the_same_seeds(shape, b, rate):
    n, h, w, c = shape
    x = jax.random.normal(jax.random.key(0), shape)
    key = jax.random.key(7)
    out = drop_block(x, key, rate, b)
    seeds = jax.random.bernoulli(key, numpy_gamma(rate, b, h, w), (n, h - b + 1, w - b + 1, c))
    keep = numpy_keep_mask(np.asarray(seeds), b)
    assert 0 < keep.sum() < keep.size  # the draw drops something and keeps something
    expected = np.asarray(x) * keep * (keep.size / keep.sum())
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_seed_rate_is_metaoptnets_formula():
    assert seed_rate(0.1, 5, 10, 10) == pytest.approx(numpy_gamma(0.1, 5, 10, 10))
    assert seed_rate(0.2, 3, 7, 9) == pytest.approx(numpy_gamma(0.2, 3, 7, 9))
    assert seed_rate(0.1, 5, 5, 5) == pytest.approx(0.1)


@pytest.mark.parametrize("h, b, rate", [(10, 5, 0.1), (5, 5, 0.1), (21, 5, 0.2), (8, 2, 0.1)])
def test_kept_fraction_over_many_draws(h, b, rate):
    n, c = 64, 64
    out = drop_block(jnp.ones((n, h, h, c)), jax.random.key(h * 31 + b), rate, b)
    kept = np.asarray(out != 0).mean(axis=(1, 2))  # one kept fraction per channel map
    exact = expected_kept_fraction(rate, b, h, h)
    stderr = kept.std() / np.sqrt(kept.size)
    assert abs(kept.mean() - exact) < 4 * stderr + 1e-4
    # Overlapping squares drop slightly less than the nominal rate, never more.
    assert 1.0 - rate <= exact < 1.0 - rate + 0.03


def test_rescaling_preserves_the_mean():
    x = jax.random.uniform(jax.random.key(0), (64, 10, 10, 32), minval=0.0, maxval=2.0)
    means = [float(drop_block(x, jax.random.key(s), 0.1, 5).mean()) for s in range(20)]
    assert abs(np.mean(means) - float(x.mean())) < 0.01
    # On a constant input the rescaled output's mean is the input's, draw by draw.
    ones = drop_block(jnp.ones((8, 10, 10, 4)), jax.random.key(3), 0.2, 5)
    assert float(ones.mean()) == pytest.approx(1.0, rel=1e-4)  # float32 sums


def test_block_larger_than_the_map_is_clipped():
    assert clipped_block_size(5, 2, 3) == 2
    out = drop_block(jnp.ones((16, 2, 2, 8)), jax.random.key(0), 0.5, 5)
    per_map = np.asarray(out != 0).reshape(16, 4, 8).sum(axis=1)
    assert set(np.unique(per_map)) <= {0, 4}  # a 2x2 block covers the whole 2x2 map


def test_gradient_is_the_rescaled_mask():
    x = jax.random.normal(jax.random.key(0), (2, 6, 6, 3))
    key = jax.random.key(1)
    grad = jax.grad(lambda v: drop_block(v, key, 0.3, 3).sum())(x)
    np.testing.assert_allclose(grad, drop_block(jnp.ones_like(x), key, 0.3, 3), rtol=1e-6)


def test_everything_dropped_gives_zeros_not_nans():
    out = drop_block(jnp.ones((2, 3, 3, 2)), jax.random.key(0), 1.0, 3)  # gamma = 1
    np.testing.assert_array_equal(out, np.zeros((2, 3, 3, 2)))
