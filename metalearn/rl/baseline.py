"""Discounted returns, the linear feature baseline (Duan et al. 2016) and advantages.

rllab's ``LinearFeatureBaseline``: features ``[o, o^2, t/100, (t/100)^2, (t/100)^3, 1]`` with
``o`` the observation clipped to ``[-10, 10]`` and ``t`` the step index; a ridge regression
(``reg_coeff = 1e-5``) of the discounted returns on them, fitted in closed form on one task's
batch of rollouts. With ``gae_lambda = 1`` (rllab's default), the advantage is the discounted
return minus the baseline.
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
    return jnp.linalg.solve(gram + reg_coeff * jnp.eye(gram.shape[0], dtype=gram.dtype), rhs)


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
