"""2D point navigation (Finn et al. 2017, Section 5.3), as in the paper's code.

cbfinn/maml_rl ``maml_examples/point_env_randgoal.py`` wrapped in rllab's ``normalize``: the
agent starts at the origin, goals are uniform in ``[-0.5, 0.5]^2``, the wrapped environment's
action box is ``[-0.1, 0.1]^2`` and ``normalize`` maps a policy action ``a`` to
``clip(lb + (a + 1) (ub - lb) / 2, lb, ub) = clip(0.1 a, -0.1, 0.1)``. The reward is minus the
distance to the goal after the move; an episode ends when both coordinates are within 0.01 of
the goal, or after the horizon (100).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from metalearn.rl.envs.base import Env, register_env

GOAL_LOW, GOAL_HIGH = -0.5, 0.5
ACTION_BOUND = 0.1
SUCCESS_RADIUS = 0.01
HORIZON = 100


class Nav2dState(NamedTuple):
    """The agent's position and the task's goal, both ``(2,)``."""

    position: jax.Array
    goal: jax.Array


def sample_goals(key: jax.Array, num: int) -> jax.Array:
    """``num`` goals uniform in ``[-0.5, 0.5]^2``, shape ``(num, 2)``.

    >>> sample_goals(jax.random.key(0), 3).shape
    (3, 2)
    """
    return jax.random.uniform(key, (num, 2), minval=GOAL_LOW, maxval=GOAL_HIGH)


def reset(key: jax.Array, goal: jax.Array) -> Nav2dState:
    """Start at the origin (``key`` is unused: the start is deterministic)."""
    del key
    return Nav2dState(jnp.zeros(2, goal.dtype), jnp.asarray(goal))


def observation(state: Nav2dState) -> jax.Array:
    """The observation is the position."""
    return state.position


def step(
    state: Nav2dState, action: jax.Array
) -> tuple[Nav2dState, jax.Array, jax.Array, jax.Array]:
    """Move by the rescaled, clipped action; reward ``-|position - goal|``.

    >>> s = reset(jax.random.key(0), jnp.array([0.3, 0.0]))
    >>> s, obs, reward, done = step(s, jnp.array([5.0, 0.5]))   # x clipped to 0.1
    >>> [round(float(v), 4) for v in obs], round(float(reward), 4), bool(done)
    ([0.1, 0.05], -0.2062, False)
    """
    move = jnp.clip(ACTION_BOUND * action, -ACTION_BOUND, ACTION_BOUND)
    position = state.position + move
    offset = position - state.goal
    reward = -jnp.sqrt(jnp.sum(offset**2))
    done = jnp.all(jnp.abs(offset) < SUCCESS_RADIUS)
    return Nav2dState(position, state.goal), position, reward, done


NAV2D = Env(
    reset=reset,
    observation=observation,
    step=step,
    sample_tasks=sample_goals,
    obs_dim=2,
    action_dim=2,
    horizon=HORIZON,
)


@register_env("nav2d")
def nav2d() -> Env:
    """Finn et al.'s 2D navigation (``data.env=nav2d``)."""
    return NAV2D
