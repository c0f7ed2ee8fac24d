"""Meta-reinforcement learning on the device: MAML-RL with every rollout inside one jitted step.

Modules, one idea each: ``envs`` (pure-function environments), ``policy`` (Gaussian MLP),
``rollout`` (scan over time, vmap over rollouts), ``baseline`` (returns, linear baseline,
advantages), ``inner`` (the VPG inner loop), ``estimators`` (DiCE, LVC, MAML meta-gradients),
``trpo`` and ``ppo`` (outer steps), ``maml_rl`` (the meta-iteration and adaptation evaluation),
and for the Hydra runner: ``family`` (``data=nav2d``: any registered environment's tasks),
``policy_model`` (``model=gaussian_mlp``), ``algorithm`` (``algorithm=maml_rl``); ``probe``
(a trained run's rollouts before and after each inner step, for measurements beyond eval.json).
"""

from metalearn.rl import algorithm, family, policy_model  # noqa: F401  (register themselves)
from metalearn.rl.estimators import ESTIMATORS, TaskBatch, task_loss
from metalearn.rl.inner import InnerConfig
from metalearn.rl.maml_rl import (
    MAMLRLConfig,
    MetaRLState,
    make_adaptation_eval,
    make_meta_iteration,
)
from metalearn.rl.policy import init_policy, policy_apply
from metalearn.rl.ppo import PPOConfig
from metalearn.rl.trpo import TRPOConfig, trpo_step

__all__ = [
    "ESTIMATORS",
    "InnerConfig",
    "MAMLRLConfig",
    "MetaRLState",
    "PPOConfig",
    "TRPOConfig",
    "TaskBatch",
    "init_policy",
    "make_adaptation_eval",
    "make_meta_iteration",
    "policy_apply",
    "task_loss",
    "trpo_step",
]
