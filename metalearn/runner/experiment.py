"""Build the parts of a run from a validated config: tasks, model, algorithm, optimiser."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from metalearn.algorithms.base import MetaLearner, algorithm_lr_schedule
from metalearn.config import Config, OptimizerConfig
from metalearn.data.task import TaskDistribution
from metalearn.models.base import Model, model_from_flax
from metalearn.registry import ALGORITHMS, MODELS, TASKS
from metalearn.runner.steps import TrainState, resolve_steps_per_call, resolve_task_batching

# Streams derived from the run's seed; evaluation uses its own seed (EvalConfig.seed).
TRAIN_STREAM, INIT_STREAM = 0, 1


class Experiment(NamedTuple):
    tasks: TaskDistribution
    model: Model
    learner: MetaLearner
    optimizer: optax.GradientTransformation
    task_batching: str
    steps_per_call: int
    initial_state: TrainState
    train_key: jax.Array


def build_optimizer(
    cfg: OptimizerConfig, total_steps: int, schedule: optax.Schedule | None = None
) -> optax.GradientTransformation:
    """The outer optimiser: adam | adamw | sgd, constant or cosine rate, optional clipping.

    ``schedule``, when given (an algorithm that prescribes its own, like MAML++), replaces the
    rate the optimiser config describes.
    """
    if schedule is not None:
        lr = schedule
    elif cfg.schedule == "cosine":
        lr = optax.warmup_cosine_decay_schedule(
            init_value=0.0 if cfg.warmup_steps else cfg.lr,
            peak_value=cfg.lr,
            warmup_steps=cfg.warmup_steps,
            decay_steps=max(total_steps, cfg.warmup_steps + 1),
            end_value=cfg.lr * cfg.final_lr_fraction,
        )
    elif cfg.warmup_steps:
        lr = optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)
    else:
        lr = cfg.lr
    if cfg.name == "adam":
        base = optax.adam(lr)
    elif cfg.name == "adamw":
        base = optax.adamw(lr, weight_decay=cfg.weight_decay)
    else:
        base = optax.sgd(lr, momentum=cfg.momentum or None)
    if cfg.grad_clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(cfg.grad_clip_norm), base)
    return base


def build_model(cfg: Config, tasks: TaskDistribution) -> Model:
    module = MODELS.build(cfg.model, tasks.num_outputs)
    rank = getattr(module, "input_rank", None)
    if rank == 3 and len(tasks.input_shape) != 3:
        raise ValueError(
            f"model={cfg.model.name} needs images (inputs [height, width, channels]) but "
            f"data={cfg.data.name} gives inputs of shape {tuple(tasks.input_shape)}; use "
            "model=mlp, or an image dataset (data=omniglot, miniimagenet, cifarfs or fc100)"
        )
    embed = "embed" if hasattr(module, "embed") else None
    return model_from_flax(
        module, tasks.input_shape, tasks.kind, head=("head",), embed_method=embed
    )


def build_experiment(cfg: Config) -> Experiment:
    """Everything a run needs, from a config already checked by :func:`config.validate`."""
    tasks = TASKS.build(cfg.data)
    model = build_model(cfg, tasks)
    learner = ALGORITHMS.build(cfg.algorithm, model)
    prescribed = algorithm_lr_schedule(cfg.algorithm, cfg.optimizer.lr, cfg.trainer.num_steps)
    optimizer = build_optimizer(cfg.optimizer, cfg.trainer.num_steps, prescribed)
    root = jax.random.key(cfg.seed)
    init_key, learner_key = jax.random.split(jax.random.fold_in(root, INIT_STREAM))
    model_params = model.init(init_key)
    meta_params = learner.init(learner_key, model_params)
    state = TrainState(jnp.asarray(0, jnp.int32), meta_params, optimizer.init(meta_params))
    strategy = resolve_task_batching(cfg.trainer.task_batching, model_params)
    steps_per_call = resolve_steps_per_call(cfg.trainer.steps_per_call, model_params)
    train_key = jax.random.fold_in(root, TRAIN_STREAM)
    return Experiment(tasks, model, learner, optimizer, strategy, steps_per_call, state, train_key)


def count_parameters(tree: Any) -> int:
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(tree))
