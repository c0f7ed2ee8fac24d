"""The environment interface: a bundle of pure functions, batched by ``vmap`` from outside."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from metalearn.core.checks import check_count
from metalearn.registry import register_other_part

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
# (metalearn.rl.lapack.schedule_lapack_calls_serially), and one on several XLA:CPU
# devices is refused if a device would solve more at once than jaxlib runs inline
# (metalearn.rl.lapack.lapack_batch_error).
BATCHED_LINALG_ENVS: dict[str, int] = {}


def register_env(
    name: str, *, linalg_size: int | None = None
) -> Callable[[Callable[[], Env]], Callable[[], Env]]:
    """Decorator: ``@register_env("nav2d")`` above a factory ``() -> Env``; ``data.env=NAME``
    then selects it in a run (:mod:`metalearn.rl.family`). ``linalg_size=n`` for an
    environment whose step calls LAPACK-backed linear algebra (``jnp.linalg``,
    ``jax.scipy.linalg``) on n x n systems, one per rollout: see :data:`BATCHED_LINALG_ENVS`."""

    def decorate(factory: Callable[[], Env]) -> Callable[[], Env]:
        register_other_part("data.env", name, factory)  # refuses another factory's name
        ENVS[name] = factory
        if linalg_size is not None:
            BATCHED_LINALG_ENVS[name] = linalg_size
        return factory

    return decorate


def make_env(name: str) -> Env:
    """The registered environment ``name``; ValueError naming the known ones otherwise, or
    saying what breaks the contract in an environment registered outside metalearn
    (:func:`env_problem`).

    >>> make_env("nav2d").horizon
    100
    >>> make_env("cartpole")
    Traceback (most recent call last):
    ...
    ValueError: unknown environment 'cartpole'; registered: ant_dir, cheetah_dir, cheetah_vel, ...
    """
    if name not in ENVS:
        raise ValueError(f"unknown environment {name!r}; registered: {', '.join(sorted(ENVS))}")
    factory = ENVS[name]
    env = factory()
    # A researcher's environment is checked here (tracing a Brax step costs ~2 s); the
    # library's own are checked by tests/rl/test_env_contract.py.
    problem = None if factory.__module__.startswith("metalearn.") else env_problem(env)
    if problem:
        raise ValueError(f"data.env={name}: {problem}; see docs/extending.md (an RL environment)")
    return env


def env_problem(env: Any) -> str | None:
    """What breaks the :class:`Env` contract in ``env``, or None; traced without computing
    (``jax.eval_shape``): 3 tasks from ``sample_tasks`` on a leading axis, an observation of
    shape ``(obs_dim,)``, and a ``step`` that returns ``(state, obs, reward, done)`` with the
    state's structure and shapes unchanged (``lax.scan`` carries it), a scalar reward and done.
    An exception raised by the environment's own functions propagates.

    >>> nav = make_env("nav2d")
    >>> env_problem(nav) is None
    True
    >>> env_problem(nav._replace(obs_dim=3))
    'its observation has shape (2,), not (obs_dim,) = (3,)'
    """
    if not isinstance(env, Env):
        return f"its factory returned a {type(env).__name__}, not a metalearn.rl.envs.base.Env"
    for field in ("obs_dim", "action_dim", "horizon"):
        try:
            check_count(f"its {field}", getattr(env, field))
        except ValueError as err:
            return str(err)
    tasks = jax.eval_shape(lambda key: env.sample_tasks(key, 3), jax.random.key(0))
    shapes = [leaf.shape for leaf in jax.tree.leaves(tasks)]
    if not shapes or any(shape[:1] != (3,) for shape in shapes):
        return (
            f"sample_tasks(key, 3) gave leaves of shapes {shapes}; it must give the 3 tasks "
            "stacked on a leading axis"
        )
    task = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype), tasks)
    state = jax.eval_shape(env.reset, jax.random.key(0), task)
    obs = jax.eval_shape(env.observation, state)
    if getattr(obs, "shape", None) != (env.obs_dim,):
        return f"its observation has shape {_shapes(obs)}, not (obs_dim,) = ({env.obs_dim},)"
    action = jax.ShapeDtypeStruct((env.action_dim,), obs.dtype)
    out = jax.eval_shape(env.step, state, action)
    if not (isinstance(out, tuple) and len(out) == 4):
        return f"step(state, action) returned {_shapes(out)}, not (state, obs, reward, done)"
    new_state, step_obs, reward, done = out
    if jax.tree.structure(new_state) != jax.tree.structure(state) or _shapes(new_state) != _shapes(
        state
    ):
        return (
            f"step(state, action) returned a state {_shapes(new_state)} unlike reset's "
            f"{_shapes(state)}: the state must keep its structure and shapes"
        )
    if getattr(step_obs, "shape", None) != (env.obs_dim,):
        return f"step's observation has shape {_shapes(step_obs)}, not ({env.obs_dim},)"
    for what, value in (("reward", reward), ("done", done)):
        if getattr(value, "shape", None) != ():
            return f"step's {what} has shape {_shapes(value)}: it must be a scalar per step"
    return None


def _shapes(tree: Any) -> Any:
    """``tree`` with each array leaf shown as its shape."""
    return jax.tree.map(lambda leaf: tuple(getattr(leaf, "shape", ())), tree)
