"""Discounted returns, the linear feature baseline (Duan et al. 2016) and advantages.

rllab's ``LinearFeatureBaseline``: features ``[o, o^2, t/100, (t/100)^2, (t/100)^3, 1]`` with
``o`` the observation clipped to ``[-10, 10]`` and ``t`` the step index; a ridge regression
(``reg_coeff = 1e-5``) of the discounted returns on them, fitted in closed form on one task's
batch of rollouts. With ``gae_lambda = 1`` (rllab's default), the advantage is the discounted
return minus the baseline.

The ridge system is solved by a Cholesky factorisation written with ``lax.fori_loop``, not
``jnp.linalg.solve``: on CPU, jaxlib 0.10's LAPACK kernels split a batch of matrices across
XLA's intra-op thread pool and block until the pieces are done, so as many concurrent batched
solves as the pool has threads (two on a 2-core machine: the fits of several inner steps, or
of the pre- and post-update batches) wait forever for each other. An ``rl_ant_dir_maml`` run
hung that way in its validation (gdb: both pool threads in ``lapack_strsm_ffi`` ->
``ParallelBatchMap`` -> ``BlockingCounter::Wait``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from metalearn.rl.rollout import Trajectories

REG_COEFF = 1e-5


def discounted_returns(rewards: jax.Array, mask: jax.Array, discount: float) -> jax.Array:
    """``R_t = sum_k discount^k r_{t+k}`` over the valid steps, along the last axis.

    >>> discounted_returns(jnp.array([1.0, 1.0, 1.0]), jnp.array([1.0, 1.0, 0.0]), 0.5)
    Array([1.5, 1. , 0. ], dtype=float32)
    """
    rewards = rewards * mask

    def body(future, r):
        ret = r + discount * future
        return ret, ret

    moved = jnp.moveaxis(rewards, -1, 0)
    _, returns = jax.lax.scan(body, jnp.zeros(moved.shape[1:], rewards.dtype), moved, reverse=True)
    return jnp.moveaxis(returns, 0, -1) * mask


def baseline_features(obs: jax.Array) -> jax.Array:
    """rllab's features of each step of ``obs`` shaped ``(..., T, d)``: ``(..., T, 2d + 4)``."""
    o = jnp.clip(obs, -10.0, 10.0)
    horizon = obs.shape[-2]
    t = jnp.broadcast_to((jnp.arange(horizon) / 100.0)[:, None], obs.shape[:-1] + (1,))
    return jnp.concatenate([o, o**2, t, t**2, t**3, jnp.ones_like(t)], axis=-1)


def fit_linear_baseline(
    traj: Trajectories, returns: jax.Array, reg_coeff: float = REG_COEFF
) -> jax.Array:
    """Ridge coefficients ``(F^T F + reg I)^{-1} F^T R`` over the valid steps of a batch.

    >>> obs = jnp.zeros((1, 3, 1))
    >>> traj = Trajectories(obs, obs, jnp.zeros((1, 3)), jnp.ones((1, 3)))
    >>> fit_linear_baseline(traj, jnp.full((1, 3), 2.0)).shape
    (6,)
    """
    features = baseline_features(traj.obs).reshape(-1, 2 * traj.obs.shape[-1] + 4)
    weights = traj.mask.reshape(-1)
    gram = features.T @ (weights[:, None] * features)
    rhs = features.T @ (weights * returns.reshape(-1))
    return ridge_solve(gram, rhs, reg_coeff)


def ridge_solve(gram: jax.Array, rhs: jax.Array, reg_coeff: float, tries: int = 5) -> jax.Array:
    """``(gram + reg I)^{-1} rhs`` for symmetric positive semi-definite ``gram``, by Cholesky in
    ``lax`` loops (no LAPACK call; see the module docstring). As rllab's baseline does, when the
    factorisation fails (float32 rounding on an ill-conditioned ``gram``) ``reg`` grows tenfold,
    up to ``tries`` times.

    >>> gram = jnp.array([[4.0, 2.0], [2.0, 3.0]])
    >>> [round(float(x), 4) for x in ridge_solve(gram, jnp.array([2.0, 1.0]), 0.0)]
    [0.5, 0.0]
    """
    size = gram.shape[-1]
    index = jnp.arange(size)

    def solve(reg):
        matrix = gram + reg * jnp.eye(size, dtype=gram.dtype)

        def column(j, low):  # low's columns >= j are still zero, so low @ low[j] sums k < j
            residual = matrix[:, j] - low @ low[j]
            return low.at[:, j].set(jnp.where(index >= j, residual / jnp.sqrt(residual[j]), 0.0))

        low = jax.lax.fori_loop(0, size, column, jnp.zeros_like(matrix))

        def forward(i, y):  # low y = rhs; y's entries >= i are still zero
            return y.at[i].set((rhs[i] - low[i] @ y) / low[i, i])

        def backward(k, x):  # low^T x = y, from the last row; x's entries <= i are still zero
            i = size - 1 - k
            return x.at[i].set((y[i] - low[:, i] @ x) / low[i, i])

        y = jax.lax.fori_loop(0, size, forward, jnp.zeros_like(rhs))
        return jax.lax.fori_loop(0, size, backward, jnp.zeros_like(rhs))

    def failed(state):
        attempt, x = state
        return (attempt < tries) & ~jnp.all(jnp.isfinite(x))

    def retry(state):
        attempt, _ = state
        return attempt + 1, solve(reg_coeff * 10.0 ** (attempt + 1))

    return jax.lax.while_loop(failed, retry, (0, solve(reg_coeff)))[1]


def predict_baseline(coeffs: jax.Array, traj: Trajectories) -> jax.Array:
    """The fitted baseline at every step, shaped like ``traj.rewards``."""
    return baseline_features(traj.obs) @ coeffs


def advantages(
    traj: Trajectories,
    discount: float,
    *,
    baseline: bool = True,
    normalize: bool = False,
) -> jax.Array:
    """Discounted returns minus the per-batch linear baseline, zero on masked steps.

    ``normalize`` centres and scales them over the batch's valid steps (rllab's
    ``center_adv``, used by MAML's inner step). A function of the samples only: callers treat
    it as a constant under differentiation.
    """
    returns = discounted_returns(traj.rewards, traj.mask, discount)
    adv = returns
    if baseline:
        adv = returns - predict_baseline(fit_linear_baseline(traj, returns), traj)
    adv = adv * traj.mask
    if normalize:
        count = jnp.sum(traj.mask)
        mean = jnp.sum(adv) / count
        std = jnp.sqrt(jnp.sum(((adv - mean) * traj.mask) ** 2) / count)
        adv = (adv - mean) / (std + 1e-8) * traj.mask
    return jax.lax.stop_gradient(adv)
