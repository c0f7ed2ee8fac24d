"""Rollouts: ``lax.scan`` over time, ``vmap`` over rollouts (and, from outside, over tasks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from metalearn.rl.envs.base import Env
from metalearn.rl.policy import gaussian_log_prob

Params = Any
PolicyApply = Callable[[Params, jax.Array], tuple[jax.Array, jax.Array]]


class Trajectories(NamedTuple):
    """A batch of rollouts, time-major inside each rollout: ``(..., T, dim)`` or ``(..., T)``.

    ``mask`` is 1 up to and including the step that ended the episode, 0 afterwards. The
    environment keeps stepping inside the fixed-length scan, but masked steps count nowhere:
    their observations, actions and rewards are recorded as zeros, so a simulation that blows
    up after the episode ended (a fallen Ant's physics can reach NaN) cannot reach a sum or a
    baseline fit through ``0 * nan``.
    """

    obs: jax.Array
    actions: jax.Array
    rewards: jax.Array
    mask: jax.Array


def rollout(
    env: Env, policy_apply: PolicyApply, params: Params, key: jax.Array, task: Any
) -> Trajectories:
    """One episode of ``env.horizon`` steps with actions from the Gaussian policy.

    >>> from metalearn.rl.envs import NAV2D
    >>> from metalearn.rl.policy import init_policy, policy_apply
    >>> params = init_policy(jax.random.key(0), 2, 2)
    >>> traj = rollout(NAV2D, policy_apply, params, jax.random.key(1), jnp.array([0.2, 0.1]))
    >>> traj.obs.shape, traj.rewards.shape
    ((100, 2), (100,))
    """
    reset_key, key = jax.random.split(key)
    state = env.reset(reset_key, task)

    def body(carry, step_key):
        state, ended = carry
        obs = env.observation(state)
        mean, log_std = policy_apply(params, obs)
        action = mean + jnp.exp(log_std) * jax.random.normal(step_key, mean.shape)
        state, _, reward, done = env.step(state, action)
        reward, done = jnp.asarray(reward, obs.dtype), jnp.asarray(done, bool)  # Python numbers
        mask = 1.0 - ended.astype(reward.dtype)
        return (state, ended | done), (obs, action, reward, mask)

    keys = jax.random.split(key, env.horizon)
    _, (obs, actions, rewards, mask) = jax.lax.scan(body, (state, jnp.asarray(False)), keys)
    valid = mask > 0
    obs, actions = (jnp.where(valid[:, None], x, 0.0) for x in (obs, actions))
    return Trajectories(obs, actions, jnp.where(valid, rewards, 0.0), mask)


def rollouts(
    env: Env, policy_apply: PolicyApply, params: Params, key: jax.Array, task: Any, num: int
) -> Trajectories:
    """``num`` independent episodes of one task, stacked on a leading axis."""
    keys = jax.random.split(key, num)
    return jax.vmap(lambda k: rollout(env, policy_apply, params, k, task))(keys)


def log_probs(policy_apply: PolicyApply, params: Params, traj: Trajectories) -> jax.Array:
    """Per-step log-probabilities of ``traj.actions`` under ``params``, shaped like ``rewards``."""
    mean, log_std = policy_apply(params, traj.obs)
    return gaussian_log_prob(mean, log_std, traj.actions)


def episode_returns(traj: Trajectories) -> jax.Array:
    """Undiscounted return of each episode (rllab's ``AverageReturn`` averages these)."""
    return jnp.sum(traj.rewards * traj.mask, axis=-1)
