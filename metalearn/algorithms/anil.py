"""ANIL (Raghu et al. 2020, "Almost No Inner Loop"): adapt only the head in the inner loop.

The parameters are partitioned by their top-level entry: ``model.head`` names the entries of
the final layer (``("head",)`` for the MLP here). The inner loop runs MAML's SGD steps on those
entries only, with the body held at the meta-parameters; the outer loop differentiates the
query loss with respect to everything (body and head), through the inner loop.
"""

from __future__ import annotations

import dataclasses

import jax

from metalearn.algorithms.base import (
    MetaLearner,
    check_inner_loop_settings,
    evaluate_trajectory,
    query_metrics,
    split_top_level,
)
from metalearn.core import adapt, adapt_trajectory
from metalearn.data.task import Task
from metalearn.models.base import Model
from metalearn.registry import ALGORITHMS


@dataclasses.dataclass
class ANILConfig:
    name: str = "anil"
    inner_lr: float = 0.01
    num_steps: int = 1
    first_order: bool = False
    remat: bool = False


@ALGORITHMS.register("anil", ANILConfig)
def anil(
    model: Model,
    *,
    inner_lr: float = 0.01,
    num_steps: int = 1,
    first_order: bool = False,
    remat: bool = False,
) -> MetaLearner:
    """ANIL: MAML whose inner loop adapts only the parameter entries named by ``model.head``.

    The meta-parameters are the model parameters (a dict whose top-level entries include
    ``model.head``); ``adapt`` returns the full model parameters with the head adapted.

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.data.sinusoid import sinusoid
    >>> from metalearn.models.base import model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> model = model_from_flax(MLP((40, 40), 1), (1,), "regression", head=("head",))
    >>> learner = anil(model, inner_lr=0.01)
    >>> meta_params = learner.init(jax.random.key(0), model.init(jax.random.key(1)))
    >>> tasks = sinusoid()
    >>> task = tasks.sample(tasks.splits["train"], jax.random.key(2), 10)
    >>> adapted = learner.adapt(meta_params, task.support, 3)
    >>> bool(jnp.all(adapted["hidden_0"]["kernel"] == meta_params["hidden_0"]["kernel"]))
    True
    >>> grads, metrics = jax.jit(learner.task_grad)(meta_params, task, 0.0)
    >>> evaluate = jax.jit(learner.evaluate, static_argnums=2)
    >>> sorted(grads), evaluate(meta_params, task, (0, 1, 5))["mse"].shape
    (['head', 'hidden_0', 'hidden_1'], (3,))
    """
    check_inner_loop_settings(inner_lr, num_steps)
    head_names = tuple(model.head)
    if not head_names:
        raise ValueError(
            "algorithm=anil needs a model that names its head (Model.head, the top-level "
            "parameter entries of the final layer); this model names none"
        )

    def head_loss(body):
        return lambda head, batch: model.loss_fn({**body, **head}, batch)

    def init(key, model_params):
        del key
        split_top_level(model_params, head_names)  # fail early if the head is missing
        return model_params

    def adapt_params(params, support, steps=num_steps):
        head, body = split_top_level(params, head_names)
        adapted_head = adapt(
            head_loss(body),
            head,
            support,
            inner_lr=inner_lr,
            num_steps=steps,
            first_order=first_order,
            remat=remat,
        )
        return {**params, **adapted_head}

    def task_grad(params, task: Task, progress):
        del progress

        def query_loss(p):
            return query_metrics(model, adapt_params(p, task.support), task)

        (_, metrics), grads = jax.value_and_grad(query_loss, has_aux=True)(params)
        return grads, metrics

    def evaluate(params, task: Task, steps):
        head, body = split_top_level(params, head_names)

        def trajectory(support, n):
            return adapt_trajectory(head_loss(body), head, support, inner_lr=inner_lr, num_steps=n)

        return evaluate_trajectory(
            model, trajectory, task, steps, to_model_params=lambda h: {**params, **h}
        )

    return MetaLearner(init, task_grad, evaluate, adapt_params)
