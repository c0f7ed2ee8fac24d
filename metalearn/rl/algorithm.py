"""MAML-RL as a registered algorithm (``algorithm=maml_rl``), for RL task families.

The learner's ``batch_update`` is the meta-iteration of :mod:`metalearn.rl.maml_rl` on the
meta-batch the runner sampled: every task's inner loop and post-update rollouts
(:func:`~metalearn.rl.maml_rl.collect_meta_batch`), then the outer step on the chosen
meta-gradient estimator (:func:`~metalearn.rl.maml_rl.outer_update`: TRPO, or PPO-style
epochs of the run's ``optimizer``). ``evaluate`` is the mean undiscounted return of
``eval_rollouts`` episodes after each number of inner steps, at Finn et al.'s evaluation rates
(0.1, then 0.05). ``inner_steps=0`` is the "pretrained" baseline of Finn et al.'s Figure 5:
TRPO on the task distribution with no inner step (evaluated with 0-3 steps all the same).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp

from metalearn.algorithms.base import (
    MetaLearner,
    TaskContext,
    check_choice,
    check_count,
    check_nonnegative,
    check_positive,
    context,
    hyperparameter,
    hyperparameter_values,
    hyperparameters,
    with_config,
)
from metalearn.data.task import Aux, Objective, Task
from metalearn.registry import ALGORITHMS
from metalearn.rl.estimators import ESTIMATORS, collect_task_batch, meta_surrogate
from metalearn.rl.family import RLObjective
from metalearn.rl.inner import InnerConfig, sample_adaptation
from metalearn.rl.maml_rl import (
    MAMLRLConfig,
    adaptation_returns,
    collect_meta_batch,
    outer_update,
)
from metalearn.rl.ppo import PPOConfig
from metalearn.rl.rollout import episode_returns
from metalearn.rl.trpo import TRPOConfig

log = logging.getLogger("metalearn")

OUTER_STEPS = ("trpo", "ppo")
# The settings each outer step reads (PPO's step size is optimizer.lr).
OUTER_STEP_KEYS = {
    "trpo": ("max_kl", "cg_iters", "cg_damping", "backtrack_ratio", "max_backtracks"),
    "ppo": ("ppo_clip", "ppo_epochs"),
}


@dataclasses.dataclass
class MAMLRLAlgorithmConfig:
    """``algorithm=maml_rl``; defaults are those of :mod:`metalearn.rl` (Finn et al.'s 2D
    navigation). Rollouts per inner step and the discount belong to the task family
    (``data.rollouts``, ``data.discount``); PPO's learning rate is ``optimizer.lr``."""

    # Read in training only (metalearn.evaluate refuses them as overrides).
    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        "estimator": "",
        "outer": "",
        "inner_steps": "eval.steps are the evaluation's inner step counts",
        "inner_lr": "algorithm.eval_lrs are the evaluation's inner rates",
        "post_rollouts": "algorithm.eval_rollouts are the evaluation's episodes",
        "max_kl": "",
        "cg_iters": "",
        "cg_damping": "",
        "backtrack_ratio": "",
        "max_backtracks": "",
        "ppo_clip": "",
        "ppo_epochs": "",
    }

    name: str = "maml_rl"
    estimator: str = MAMLRLConfig.estimator  # dice | lvc | maml (metalearn/rl/estimators.py)
    outer: str = MAMLRLConfig.outer  # trpo | ppo
    inner_steps: int = InnerConfig.num_steps  # 0: the pretrained baseline
    inner_lr: float = hyperparameter(InnerConfig.lrs[0])
    post_rollouts: int = MAMLRLConfig.num_post_rollouts
    max_kl: float = TRPOConfig.max_kl
    cg_iters: int = TRPOConfig.cg_iters
    cg_damping: float = TRPOConfig.damping
    backtrack_ratio: float = TRPOConfig.backtrack_ratio
    max_backtracks: int = TRPOConfig.max_backtracks
    ppo_clip: float = PPOConfig.clip
    ppo_epochs: int = PPOConfig.num_epochs
    # Inner rates of evaluation steps 1, 2, ...; the last repeats (Finn et al.: 0.1, then 0.05).
    eval_lrs: tuple[float, ...] = (0.1, 0.05, 0.05)
    eval_rollouts: int = 40  # episodes per task and step count in evaluation

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        check_config(self)


def _default(key: str):
    """The default of :class:`MAMLRLAlgorithmConfig`'s field ``key``, read from the class (a
    default instance would check itself, recursively)."""
    field = next(f for f in dataclasses.fields(MAMLRLAlgorithmConfig) if f.name == key)
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


def check_config(c: MAMLRLAlgorithmConfig) -> None:
    """ValueError naming the first bad key (as ``algorithm.<key>``); the config's
    ``__post_init__`` calls it.

    >>> MAMLRLAlgorithmConfig(max_kl=-1.0)
    Traceback (most recent call last):
    ...
    ValueError: algorithm.max_kl must be > 0, got -1.0
    """
    check_choice("estimator", c.estimator, ESTIMATORS)
    check_choice("outer", c.outer, OUTER_STEPS)
    check_count("inner_steps", c.inner_steps, minimum=0)
    check_positive("inner_lr", c.inner_lr)
    for key in ("post_rollouts", "eval_rollouts", "cg_iters", "ppo_epochs"):
        check_count(key, getattr(c, key))
    check_count("max_backtracks", c.max_backtracks, minimum=0)
    check_positive("max_kl", c.max_kl)
    check_nonnegative("cg_damping", c.cg_damping)
    if not 0 < c.backtrack_ratio < 1:  # 1 would retry the same step max_backtracks times
        raise ValueError(f"algorithm.backtrack_ratio must be in (0, 1), got {c.backtrack_ratio}")
    check_positive("ppo_clip", c.ppo_clip)
    if not c.eval_lrs or min(c.eval_lrs) <= 0:
        raise ValueError(f"algorithm.eval_lrs must be positive rates, got {list(c.eval_lrs)}")
    for outer, keys in OUTER_STEP_KEYS.items():  # a setting the chosen outer step never reads
        changed = [k for k in keys if getattr(c, k) != _default(k)]
        if outer != c.outer and changed:
            key = changed[0]
            raise ValueError(
                f"algorithm.{key}={getattr(c, key)} is used by algorithm.outer={outer} only, and "
                f"algorithm.outer={c.outer}: set algorithm.outer={outer}, or leave {key} at "
                f"{_default(key)}"
            )


# What algorithm.inner_steps=0 (the pretrained baseline) leaves unread: training takes no inner
# step, and evaluation's inner steps are plain policy-gradient steps at algorithm.eval_lrs.
UNUSED_WITHOUT_INNER_STEPS = ("inner_lr", "estimator")


def warn_unused_without_inner_steps(c: MAMLRLAlgorithmConfig) -> None:
    """Log a warning if ``inner_steps=0`` and a setting only the inner step reads is changed."""
    if c.inner_steps != 0:
        return
    changed = [k for k in UNUSED_WITHOUT_INNER_STEPS if getattr(c, k) != _default(k)]
    if changed:
        settings = " and ".join(f"algorithm.{k}={getattr(c, k)}" for k in changed)
        log.warning(
            "%s %s unused with algorithm.inner_steps=0 (the pretrained baseline): training takes "
            "no inner step, and evaluation's inner steps are plain policy-gradient steps at "
            "algorithm.eval_lrs=%s, whatever the estimator",
            settings,
            "is" if len(changed) == 1 else "are",
            list(c.eval_lrs),
        )


def meta_rl_config(
    c: MAMLRLAlgorithmConfig, inner: InnerConfig, inner_lr: float | jax.Array | None = None
) -> MAMLRLConfig:
    """The :class:`MAMLRLConfig` of these settings, on the family's ``inner`` (rollouts,
    discount), at ``inner_lr`` (default ``c.inner_lr``; a traced rate as the runner passes it)."""
    inner_lr = c.inner_lr if inner_lr is None else inner_lr
    return MAMLRLConfig(
        num_post_rollouts=c.post_rollouts,
        inner=dataclasses.replace(inner, num_steps=c.inner_steps, lrs=(inner_lr,) * c.inner_steps),
        estimator=c.estimator,
        outer=c.outer,
        trpo=TRPOConfig(
            max_kl=c.max_kl,
            cg_iters=c.cg_iters,
            damping=c.cg_damping,
            backtrack_ratio=c.backtrack_ratio,
            max_backtracks=c.max_backtracks,
        ),
        ppo=PPOConfig(clip=c.ppo_clip, num_epochs=c.ppo_epochs),
    )


def evaluation_inner(c: MAMLRLAlgorithmConfig, inner: InnerConfig, num_steps: int) -> InnerConfig:
    """``num_steps`` inner steps at the evaluation rates, ``eval_rollouts`` episodes each.

    >>> c = MAMLRLAlgorithmConfig(eval_lrs=(0.1, 0.05))
    >>> evaluation_inner(c, InnerConfig(), 3).lrs
    (0.1, 0.05, 0.05)
    """
    rates = tuple(c.eval_lrs[min(i, len(c.eval_lrs) - 1)] for i in range(num_steps))
    return dataclasses.replace(inner, num_steps=num_steps, lrs=rates, num_rollouts=c.eval_rollouts)


def outer_step_settings(c: MAMLRLAlgorithmConfig) -> str | None:
    """The settings of the outer step when it is not the ``optimizer`` section's (TRPO's).

    >>> outer_step_settings(MAMLRLAlgorithmConfig()), outer_step_settings(
    ...     MAMLRLAlgorithmConfig(outer="ppo"))
    ('algorithm.max_kl (TRPO)', None)
    """
    return "algorithm.max_kl (TRPO)" if c.outer == "trpo" else None


@ALGORITHMS.register("maml_rl", MAMLRLAlgorithmConfig, outer_step_settings=outer_step_settings)
def maml_rl(
    objective: Objective, config: MAMLRLAlgorithmConfig | None = None, **overrides
) -> MetaLearner:
    """MAML-RL (Finn et al. 2017) on an RL task family's :class:`RLObjective`.

    With ``inner_steps=0`` (the pretrained baseline) an ``inner_lr`` or ``estimator`` changed
    from its default is logged as unused (:func:`warn_unused_without_inner_steps`).

    >>> from metalearn.models.base import model_from_flax
    >>> from metalearn.rl.family import RLTasksConfig, rl_env
    >>> from metalearn.rl.policy_model import GaussianMLP
    >>> family = rl_env(RLTasksConfig(rollouts=2))
    >>> model = model_from_flax(GaussianMLP((8,), 2), family.input_shape)
    >>> learner = maml_rl(family.objective(model), post_rollouts=2, eval_rollouts=2)
    >>> params, _ = model.init(jax.random.key(0))
    >>> task = family.sample({}, jax.random.key(1), 1)
    >>> ctx = TaskContext(0, 1, {}, jax.random.key(2))
    >>> learner.evaluate(params, task, ctx, (0, 1, 3))["return"].shape
    (3,)
    """
    c = with_config(MAMLRLAlgorithmConfig, config, overrides)
    if not isinstance(objective, RLObjective):
        raise ValueError(
            "algorithm=maml_rl needs a reinforcement-learning task family (data=nav2d, or "
            "data=rl_env with data.env=NAME); this data has no environment"
        )
    warn_unused_without_inner_steps(c)
    env, policy_apply = objective.env, objective.policy_apply
    own = hyperparameters(c)

    def configured(ctx: TaskContext) -> MAMLRLConfig:
        return meta_rl_config(c, objective.inner, hyperparameter_values(ctx, own).inner_lr)

    def init(key, model_params):
        del key
        return model_params

    def task_grad(meta_params, task: Task, ctx: TaskContext):
        cfg = configured(ctx)
        batch = collect_task_batch(
            env, policy_apply, meta_params, ctx.key, task.support, cfg.inner, cfg.num_post_rollouts
        )
        surrogate = lambda p: meta_surrogate(policy_apply, p, batch, cfg.inner, c.estimator)  # noqa: E731
        grads = jax.grad(lambda p: -surrogate(p))(meta_params)
        return grads, Aux(ctx.model_state, {"post_return": jnp.mean(episode_returns(batch.post))})

    def batch_update(meta_params, opt_state, tasks: Task, keys, optimizer, strategy, hyper):
        cfg = configured(context(hyper=hyper))
        step_cfg = dataclasses.replace(cfg, task_batching=strategy)
        batch = collect_meta_batch(env, policy_apply, step_cfg, meta_params, keys, tasks.support)
        return outer_update(policy_apply, step_cfg, meta_params, opt_state, optimizer, batch)

    def evaluate(meta_params, task: Task, ctx: TaskContext, steps):
        steps = tuple(int(s) for s in steps)
        inner = evaluation_inner(c, objective.inner, max(steps))
        returns = adaptation_returns(env, policy_apply, meta_params, ctx.key, task.query, inner)
        return {"return": returns[jnp.asarray(steps)]}

    def adapt(meta_params, support, ctx: TaskContext, inner_steps: int | None = None):
        num = c.inner_steps if inner_steps is None else inner_steps
        inner = evaluation_inner(c, objective.inner, num)
        return sample_adaptation(env, policy_apply, meta_params, ctx.key, support, inner)[2]

    return MetaLearner(init, task_grad, evaluate, adapt, batch_update, hyper=own)
