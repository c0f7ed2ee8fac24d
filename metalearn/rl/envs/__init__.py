"""Environments as pure JAX functions: ``reset(key, task) -> state``, ``step(state, action)``."""

from metalearn.rl.envs.base import BATCHED_LINALG_ENVS, ENVS, Env, make_env, register_env
from metalearn.rl.envs.nav2d import NAV2D, Nav2dState, sample_goals

# Registers cheetah_dir, cheetah_vel and ant_dir; Brax is imported only when one is built.
from metalearn.rl.envs import locomotion  # noqa: E402, F401  isort: skip

__all__ = [
    "BATCHED_LINALG_ENVS",
    "ENVS",
    "NAV2D",
    "Env",
    "Nav2dState",
    "make_env",
    "register_env",
    "sample_goals",
]
