"""The environment interface: a bundle of pure functions, batched by ``vmap`` from outside."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

State = Any
Task = Any


class Env(NamedTuple):
    """An episodic environment as pure functions of explicit state (gymnax-style, minimal).

    ``reset(key, task) -> state`` starts an episode of ``task`` (any pytree: a goal, a target
    velocity); ``observation(state) -> obs``; ``step(state, action) -> (state, obs, reward,
    done)``. Nothing is stateful, so rollouts are ``lax.scan`` over time and ``vmap`` over
    rollouts and tasks. ``horizon`` is the episode length used for rollouts.
    """

    reset: Callable[[jax.Array, Task], State]
    observation: Callable[[State], jax.Array]
    step: Callable[[State, jax.Array], tuple[State, jax.Array, jax.Array, jax.Array]]
    sample_tasks: Callable[[jax.Array, int], Task]
    obs_dim: int
    action_dim: int
    horizon: int
