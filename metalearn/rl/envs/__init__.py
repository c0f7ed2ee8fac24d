"""Environments as pure JAX functions: ``reset(key, task) -> state``, ``step(state, action)``."""

from metalearn.rl.envs.base import ENVS, Env, make_env, register_env
from metalearn.rl.envs.nav2d import NAV2D, Nav2dState, sample_goals

__all__ = ["ENVS", "NAV2D", "Env", "Nav2dState", "make_env", "register_env", "sample_goals"]
