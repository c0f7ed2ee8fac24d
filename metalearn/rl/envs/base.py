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


# name -> factory building the environment (called when a run selects it, so a locomotion
# environment's physics library is imported only by the runs that use it).
ENVS: dict[str, Callable[[], Env]] = {}
# Environments whose step makes batched LAPACK calls on CPU (Brax's physics factorises a batch
# of mass matrices every step and solves them against the identity), with the size n of those
# n x n systems: a run on them asks XLA:CPU for serial LAPACK scheduling
# (metalearn.runner.cpu_backend.schedule_lapack_calls_serially), and one on several XLA:CPU
# devices is refused if a device would solve more at once than jaxlib runs inline
# (metalearn.runner.experiment.lapack_batch_error).
BATCHED_LINALG_ENVS: dict[str, int] = {}


def register_env(
    name: str, *, linalg_size: int | None = None
) -> Callable[[Callable[[], Env]], Callable[[], Env]]:
    """Decorator: ``@register_env("nav2d")`` above a factory ``() -> Env``; ``data.env=NAME``
    then selects it in a run (:mod:`metalearn.rl.family`). ``linalg_size=n`` for an
    environment whose step calls LAPACK-backed linear algebra (``jnp.linalg``,
    ``jax.scipy.linalg``) on n x n systems, one per rollout: see :data:`BATCHED_LINALG_ENVS`."""

    def decorate(factory: Callable[[], Env]) -> Callable[[], Env]:
        ENVS[name] = factory
        if linalg_size is not None:
            BATCHED_LINALG_ENVS[name] = linalg_size
        return factory

    return decorate


def make_env(name: str) -> Env:
    """The registered environment ``name``; ValueError naming the known ones otherwise.

    >>> make_env("nav2d").horizon
    100
    >>> make_env("cartpole")
    Traceback (most recent call last):
    ...
    ValueError: unknown environment 'cartpole'; registered: ant_dir, cheetah_dir, cheetah_vel, nav2d
    """
    if name not in ENVS:
        raise ValueError(f"unknown environment {name!r}; registered: {', '.join(sorted(ENVS))}")
    return ENVS[name]()
