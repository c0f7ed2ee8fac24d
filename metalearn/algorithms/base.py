"""The meta-learner interface every algorithm returns, and shared evaluation helpers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from metalearn.core import adapt_trajectory
from metalearn.data.task import Task
from metalearn.models.base import Model

PyTree = Any
Metrics = dict[str, jax.Array]


class MetaLearner(NamedTuple):
    """A meta-learning algorithm as pure functions (in the style of optax's transforms).

    - ``init(key, model_params) -> meta_params``: what the outer optimiser updates (the model
      initialisation, plus e.g. learned inner rates for Meta-SGD).
    - ``task_grad(meta_params, task, progress) -> (meta_grads, metrics)``: the meta-gradient of
      one task (a descent direction for the outer optax optimiser; for Reptile the difference
      to the adapted weights) and scalar metrics on the query set. ``progress`` in [0, 1] is the
      fraction of training done (a traced scalar), for schedules such as MAML++'s annealing.
    - ``evaluate(meta_params, task, steps) -> {metric: array[len(steps)]}``: query metrics after
      each number of inner steps in the static tuple ``steps``.
    - ``adapt(meta_params, support, num_steps) -> model_params``: task-specific parameters, for
      prediction and plots.
    """

    init: Callable[[jax.Array, PyTree], PyTree]
    task_grad: Callable[[PyTree, Task, jax.Array], tuple[PyTree, Metrics]]
    evaluate: Callable[[PyTree, Task, tuple[int, ...]], Metrics]
    adapt: Callable[[PyTree, Any, int], PyTree]


def evaluate_trajectory(
    model: Model,
    meta_params_to_trajectory: Callable[[Any, int], PyTree],
    task: Task,
    steps: Sequence[int],
) -> Metrics:
    """Query metrics at each step count in ``steps`` along one inner-loop trajectory.

    ``meta_params_to_trajectory(support, num_steps)`` returns stacked parameters with a leading
    axis of ``num_steps + 1`` (as :func:`metalearn.core.adapt_trajectory` does).
    """
    steps = tuple(int(s) for s in steps)
    trajectory = meta_params_to_trajectory(task.support, max(max(steps), 1))
    picked = jax.tree_util.tree_map(lambda t: t[jnp.asarray(steps)], trajectory)
    return jax.vmap(lambda p: model.metrics_fn(p, task.query))(picked)


def sgd_trajectory_fn(model: Model, params: PyTree, inner_lr: float | PyTree):
    """``(support, num_steps) -> stacked params`` for plain SGD adaptation from ``params``."""

    def trajectory(support, num_steps):
        return adapt_trajectory(
            model.loss_fn, params, support, inner_lr=inner_lr, num_steps=num_steps
        )

    return trajectory
