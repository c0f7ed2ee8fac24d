"""Reptile (Nichol, Achiam and Schulman 2018): move the initialisation toward adapted weights.

For each task, run ``inner_steps`` steps of SGD (or Adam) on its support set from the current
initialisation ``theta`` to get ``phi``; Reptile then moves ``theta`` toward ``phi``:
``theta <- theta + epsilon * mean_tasks(phi - theta)``.

Here ``task_grad`` returns ``theta - phi`` (the "Reptile gradient"), so an outer ``optax.sgd``
with learning rate ``epsilon`` applied to the meta-batch mean of it is exactly the batched
Reptile update. Any other optax optimiser (e.g. Adam, as in the paper's few-shot experiments)
treats ``theta - phi`` as a gradient. No gradient flows through the inner loop.

The inner loop trains on the support set only, full batch (the paper samples mini-batches from
the task's training data; with few-shot support sets that is the whole set). Evaluation fine-tunes
with the same inner optimiser, like MAML; no transduction.
"""

from __future__ import annotations

import dataclasses

import jax
import optax

from metalearn.algorithms.base import (
    InnerLoopConfig,
    MetaLearner,
    check_choice,
    check_fraction,
    evaluate_trajectory,
    hyperparameter_values,
    hyperparameters,
    inner_loss,
    query_loss,
    with_config,
)
from metalearn.core import adapt, adapt_trajectory
from metalearn.data.task import Objective, Task
from metalearn.registry import ALGORITHMS

INNER_OPTIMIZERS = ("sgd", "adam")


@dataclasses.dataclass
class ReptileConfig(InnerLoopConfig):
    name: str = "reptile"
    inner_steps: int = 5
    inner_optimizer: str = "sgd"
    adam_b1: float = 0.0

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        super().__post_init__()
        check_choice("inner_optimizer", self.inner_optimizer, INNER_OPTIMIZERS)
        check_fraction("adam_b1", self.adam_b1)
        if self.adam_b1 == 1:
            raise ValueError(f"algorithm.adam_b1 must be < 1, got {self.adam_b1}")
        if self.adam_b1 != 0 and self.inner_optimizer != "adam":
            raise ValueError(
                f"algorithm.adam_b1={self.adam_b1} is used by algorithm.inner_optimizer=adam "
                f"only, and algorithm.inner_optimizer={self.inner_optimizer}: set "
                "algorithm.inner_optimizer=adam, or leave adam_b1 at 0"
            )


@ALGORITHMS.register("reptile", ReptileConfig)
def reptile(objective: Objective, config: ReptileConfig | None = None, **overrides) -> MetaLearner:
    """Reptile: ``task_grad`` is ``theta - phi`` for ``phi`` the weights after ``inner_steps``.

    ``inner_optimizer`` is ``"sgd"`` (rate ``inner_lr``) or ``"adam"`` (``optax.adam`` with rate
    ``inner_lr`` and ``b1 = adam_b1``; the paper uses ``b1 = 0``). The meta-parameters are the
    model parameters. Use an outer ``optax.sgd(epsilon)`` for the update of the paper's
    Algorithm 2 (``theta += epsilon * mean(phi - theta)``).

    >>> import jax, jax.numpy as jnp, optax
    >>> from metalearn.algorithms.base import context
    >>> from metalearn.data.sinusoid import sinusoid
    >>> from metalearn.data.task import family_objective
    >>> from metalearn.models.base import model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> tasks = sinusoid()
    >>> model = model_from_flax(MLP((40, 40), 1), (1,))
    >>> learner = reptile(family_objective(tasks, model), inner_lr=0.02, inner_steps=5)
    >>> params, state = model.init(jax.random.key(1))
    >>> theta, ctx = learner.init(jax.random.key(0), params), context(state)
    >>> task = tasks.sample(tasks.splits["train"], jax.random.key(2), 10)
    >>> grads, aux = jax.jit(learner.task_grad)(theta, task, ctx)
    >>> phi = learner.adapt(theta, task.support, ctx, 5)
    >>> updates, _ = optax.sgd(1.0).update(grads, optax.sgd(1.0).init(theta))
    >>> moved = optax.apply_updates(theta, updates)       # epsilon = 1 lands on phi
    >>> bool(jnp.allclose(moved["head"]["kernel"], phi["head"]["kernel"], atol=1e-6))
    True
    """
    c = with_config(ReptileConfig, config, overrides)
    own = hyperparameters(c)

    def inner_kwargs(ctx):
        inner_lr = hyperparameter_values(ctx, own).inner_lr
        if c.inner_optimizer == "adam":
            return {"optimizer": optax.adam(inner_lr, b1=c.adam_b1)}
        return {"inner_lr": inner_lr}

    def init(key, model_params):
        del key
        return model_params

    def adapt_params(params, support, ctx, steps=c.inner_steps, train=True):
        params = jax.lax.stop_gradient(params)
        loss_fn = inner_loss(objective, ctx, train)
        return adapt(loss_fn, params, support, num_steps=steps, **inner_kwargs(ctx))

    def task_grad(params, task: Task, ctx):
        adapted = adapt_params(params, task.support, ctx)
        _, aux = query_loss(objective, adapted, ctx, task.query)
        return jax.tree_util.tree_map(lambda p, a: p - a, params, adapted), aux

    def evaluate(params, task: Task, ctx, steps):
        loss_fn = inner_loss(objective, ctx, train=False)
        solver = inner_kwargs(ctx)

        def trajectory(support, n):
            return adapt_trajectory(loss_fn, params, support, num_steps=n, **solver)

        return evaluate_trajectory(objective, trajectory, task, ctx, steps)

    return MetaLearner(init, task_grad, evaluate, adapt_params, hyper=own)
