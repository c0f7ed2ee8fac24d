"""Environments as pure JAX functions: ``reset(key, task) -> state``, ``step(state, action)``."""

from metalearn.rl.envs.base import ENVS, Env, make_env, register_env
from metalearn.rl.envs.nav2d import NAV2D, Nav2dState, sample_goals

# Registers cheetah_dir, cheetah_vel and ant_dir; Brax is imported only when one is built.
from metalearn.rl.envs import locomotion  # noqa: E402, F401  isort: skip

__all__ = ["ENVS", "NAV2D", "Env", "Nav2dState", "make_env", "register_env", "sample_goals"]
