"""Environments as pure JAX functions: ``reset(key, task) -> state``, ``step(state, action)``."""

from metalearn.rl.envs.base import Env
from metalearn.rl.envs.nav2d import NAV2D, Nav2dState, sample_goals

__all__ = ["NAV2D", "Env", "Nav2dState", "sample_goals"]
