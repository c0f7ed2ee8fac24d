"""Locomotion task families of Finn et al. 2017 on Brax physics (HalfCheetah, Ant).

The physics is Brax's: its HalfCheetah and Ant systems (MJCF models shipped with Brax, with the
timestep, frame skip and gears Brax sets per pipeline) stepped by ``pipeline_step``. Only the
task-conditioned reward and termination are written here, after cbfinn/maml_rl's rllab
environments:

- ``cheetah_dir`` (``half_cheetah_env_rand_direc.py``): a task is a direction ``d`` in
  ``{-1, +1}`` (each with probability 1/2); reward ``d v - 0.05 |a|^2``.
- ``cheetah_vel`` (``half_cheetah_env_rand.py``): a task is a goal velocity ``g`` uniform in
  ``[0, 2]``; reward ``-|v - g| - 0.05 |a|^2``.
- ``ant_dir`` (``ant_env_rand_direc.py``): direction as for the cheetah; reward
  ``d v - 0.005 |a|^2 + 0.05``; the episode ends when the torso height leaves ``[0.2, 1.0]``.
  The original's contact cost (``5e-4 |clip(cfrc_ext, -1, 1)|^2``)
  is left out: Brax's pipelines do not expose external contact forces (Brax's own Ant drops it
  too).

``v`` is the torso's forward velocity over the step, ``(x_after - x_before) / dt`` (Brax's
convention; rllab read the torso subtree's centre-of-mass velocity), ``a`` the action clipped to
the actuators' control range (rllab's ``normalize`` clips the policy's action to ``[-1, 1]``).
Observations are Brax's: joint positions without the root's x (and y for the Ant) and all joint
velocities (17 numbers for the cheetah, 27 for the Ant). Every episode is ``horizon`` (200)
steps, as in the paper, unless it ends earlier; in every family a step into a non-finite state
(Brax's physics can blow up) ends the episode and earns 0.

Brax is imported when an environment is built, not when ``metalearn.rl.envs`` is imported.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from metalearn.data.sources import DataSourceError
from metalearn.rl.envs.base import Env, register_env

log = logging.getLogger("metalearn")

HORIZON = 200
BACKENDS = ("generalized", "positional", "spring", "mjx")
DEFAULT_BACKEND = "generalized"


class LocoState(NamedTuple):
    """Brax's pipeline state (positions ``q``, velocities ``qd``, body frames ``x``), the
    task (a direction or a goal velocity, a scalar)."""

    pipeline_state: Any
    task: jax.Array


def sample_directions(key: jax.Array, num: int) -> jax.Array:
    """``num`` directions, each ``-1.0`` or ``+1.0`` with probability 1/2.

    >>> d = sample_directions(jax.random.key(0), 1000)
    >>> sorted(set(d.tolist())), bool(abs(float(d.mean())) < 0.1)
    ([-1.0, 1.0], True)
    """
    return jnp.where(jax.random.bernoulli(key, 0.5, (num,)), 1.0, -1.0)


def sample_velocities(key: jax.Array, num: int) -> jax.Array:
    """``num`` goal velocities uniform in ``[0, 2]``.

    >>> v = sample_velocities(jax.random.key(0), 1000)
    >>> bool(v.min() >= 0.0), bool(v.max() <= 2.0)
    (True, True)
    """
    return jax.random.uniform(key, (num,), minval=0.0, maxval=2.0)


def direction_reward(velocity: jax.Array, task: jax.Array) -> jax.Array:
    """Velocity along the task's direction: ``d v``.

    >>> float(direction_reward(jnp.array(1.5), jnp.array(-1.0)))
    -1.5
    """
    return task * velocity


def velocity_reward(velocity: jax.Array, task: jax.Array) -> jax.Array:
    """Minus the distance to the goal velocity: ``-|v - g|``.

    >>> float(velocity_reward(jnp.array(1.5), jnp.array(0.5)))
    -1.0
    """
    return -jnp.abs(velocity - task)


@dataclass(frozen=True)
class Family:
    """What distinguishes one task family: the Brax model, the reward, the task sampler."""

    robot: str  # "halfcheetah" or "ant"
    task_reward: Callable[[jax.Array, jax.Array], jax.Array]
    sample_tasks: Callable[[jax.Array, int], jax.Array]
    ctrl_cost: float
    survive_reward: float = 0.0
    healthy_z: tuple[float, float] | None = None  # torso height range outside which it ends


FAMILIES = {
    "cheetah_dir": Family("halfcheetah", direction_reward, sample_directions, 0.05),
    "cheetah_vel": Family("halfcheetah", velocity_reward, sample_velocities, 0.05),
    "ant_dir": Family("ant", direction_reward, sample_directions, 0.005, 0.05, (0.2, 1.0)),
}


class _NoMJXInfo(logging.Filter):
    """Drops MJX's INFO records on the root logger ("Using JAX default device", at every trace)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or "mjx" not in record.pathname


_NO_MJX_INFO = _NoMJXInfo()


def brax_env(robot: str, backend: str) -> Any:
    """Brax's own environment object for ``robot`` on ``backend`` (its system, pipeline, dt)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    try:
        # brax imports the unmaintained jaxopt (DeprecationWarning), and MuJoCo prints "Failed to
        # import warp" on stdout when its optional GPU backend is absent: neither is the user's.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore", DeprecationWarning)
            from brax import envs
        import mujoco  # installed with Brax
    except ImportError as err:  # a DataSourceError: the run and evaluate say it in one line
        raise DataSourceError(
            f"the locomotion environments need Brax, which cannot be imported here ({err}): "
            "pip install 'metalearn-jax[locomotion]' (in a checkout: pip install '.[locomotion]')"
        ) from err

    # MuJoCo's compiler warns about Brax's own models (a deprecated attribute); by default it
    # writes MUJOCO_LOG.TXT into the working directory and prints to stderr. Brax warns, on every
    # model it loads, that it is no longer maintained (the README says why it is used). Both go
    # to the debug log.
    handler = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(lambda message: log.debug("MuJoCo (%s): %s", robot, message))
    try:
        logging.getLogger().addFilter(_NO_MJX_INFO)  # once: the same filter is not added twice
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env = envs.get_environment(robot, backend=backend)
        for warning in caught:
            log.debug("Brax (%s): %s", robot, warning.message)
        return env
    finally:
        mujoco.set_mju_user_warning(handler)


def make_locomotion_env(name: str, backend: str = DEFAULT_BACKEND, horizon: int = HORIZON) -> Env:
    """The ``name`` task family (a key of ``FAMILIES``) as metalearn's pure-function ``Env``.

    >>> env = make_locomotion_env("cheetah_dir", horizon=6)
    >>> state = jax.jit(env.reset)(jax.random.key(0), jnp.array(1.0))
    >>> state, obs, reward, done = jax.jit(env.step)(state, jnp.zeros(env.action_dim))
    >>> env.obs_dim, env.action_dim, obs.shape, reward.shape, bool(done)
    (17, 6, (17,), (), False)
    """
    if name not in FAMILIES:
        raise ValueError(f"locomotion env must be one of {sorted(FAMILIES)}, got {name!r}")
    family = FAMILIES[name]
    brax = brax_env(family.robot, backend)
    skip = 1 if family.robot == "halfcheetah" else 2  # root coordinates left out of obs
    low, high = brax.sys.actuator.ctrl_range[:, 0], brax.sys.actuator.ctrl_range[:, 1]

    def observation(state: LocoState) -> jax.Array:
        ps = state.pipeline_state
        return jnp.concatenate([ps.q[skip:], ps.qd])

    def reset(key: jax.Array, task: jax.Array) -> LocoState:
        # Brax's reset noise: q + U(-0.1, 0.1), qd ~ N(0, 0.1^2).
        return LocoState(brax.reset(key).pipeline_state, jnp.asarray(task, jnp.float32))

    def step(state: LocoState, action: jax.Array):
        action = jnp.clip(action, low, high)
        before = state.pipeline_state
        after = brax.pipeline_step(before, action)
        velocity = (after.x.pos[0, 0] - before.x.pos[0, 0]) / brax.dt
        reward = (
            family.task_reward(velocity, state.task)
            - family.ctrl_cost * jnp.sum(action**2)
            + family.survive_reward
        )
        new = LocoState(after, state.task)
        obs = observation(new)
        # a step into a non-finite state ends the episode and earns nothing
        finite = jnp.all(jnp.isfinite(obs)) & jnp.isfinite(reward)
        reward = jnp.where(finite, reward, 0.0)
        done = ~finite
        if family.healthy_z is not None:
            z = after.x.pos[0, 2]
            done = done | (z < family.healthy_z[0]) | (z > family.healthy_z[1])
        return new, obs, reward, done

    return Env(
        reset=reset,
        observation=observation,
        step=step,
        sample_tasks=family.sample_tasks,
        obs_dim=int(brax.sys.q_size() - skip + brax.sys.qd_size()),
        action_dim=int(brax.sys.act_size()),
        horizon=horizon,
    )


def env_dt(name: str, backend: str = DEFAULT_BACKEND) -> float:
    """Seconds of simulated time per environment step (Brax's ``dt`` for that pipeline).

    >>> round(env_dt("cheetah_dir"), 4)
    0.05
    """
    return float(brax_env(FAMILIES[name].robot, backend).dt)


# The robots' generalized velocities (Brax's sys.qd_size()): the size of the mass matrix that
# Brax's generalized pipeline factorises (Cholesky) and solves against the identity every step.
MASS_MATRIX_SIZE = {"halfcheetah": 9, "ant": 14}


def _register(name: str) -> None:
    size = MASS_MATRIX_SIZE[FAMILIES[name].robot]
    register_env(name, linalg_size=size)(lambda: make_locomotion_env(name))


for _name in FAMILIES:  # data.env=cheetah_dir etc.: the default backend, horizon 200
    _register(_name)
