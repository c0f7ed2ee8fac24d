"""MAML (Finn et al. 2017) and first-order MAML, from :func:`metalearn.core.adapt`."""

from __future__ import annotations

import dataclasses

import jax

from metalearn.algorithms.base import (
    MetaLearner,
    check_inner_loop_settings,
    evaluate_trajectory,
    inner_rates,
    query_metrics,
    sgd_trajectory_fn,
)
from metalearn.core import adapt
from metalearn.data.task import Task
from metalearn.models.base import Model
from metalearn.registry import ALGORITHMS


@dataclasses.dataclass
class MAMLConfig:
    name: str = "maml"
    inner_lr: float = 0.01
    num_steps: int = 1
    first_order: bool = False
    remat: bool = False
    adapt_norm: bool = True  # False: normalisation parameters are meta-learned, not adapted


@dataclasses.dataclass
class FOMAMLConfig(MAMLConfig):
    name: str = "fomaml"
    first_order: bool = True


@ALGORITHMS.register("maml", MAMLConfig)
def maml(
    model: Model,
    *,
    inner_lr: float = 0.01,
    num_steps: int = 1,
    first_order: bool = False,
    remat: bool = False,
    adapt_norm: bool = True,
) -> MetaLearner:
    """MAML: meta-learn an initialisation that adapts in ``num_steps`` SGD steps.

    The meta-parameters are the model parameters. ``first_order=True`` is FOMAML.
    ``adapt_norm=False`` holds the normalisation parameters fixed in the inner loop (they are
    meta-learned only), as Finn et al.'s code does with batch norm
    (:func:`metalearn.algorithms.base.inner_loop_mask`).

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.data.sinusoid import sinusoid
    >>> from metalearn.models.base import model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> model = model_from_flax(MLP((40, 40), 1), (1,), "regression")
    >>> learner = maml(model, inner_lr=0.01)
    >>> meta_params = learner.init(jax.random.key(0), model.init(jax.random.key(1)))
    >>> tasks = sinusoid()
    >>> task = tasks.sample(tasks.splits["train"], jax.random.key(2), 10)
    >>> grads, metrics = learner.task_grad(meta_params, task, 0.0)
    >>> sorted(metrics), learner.evaluate(meta_params, task, (0, 1, 5))["mse"].shape
    (['mse'], (3,))
    """
    check_inner_loop_settings(inner_lr, num_steps)

    def init(key, model_params):
        del key
        return model_params

    def adapt_params(params, support, steps=num_steps):
        return adapt(
            model.loss_fn,
            params,
            support,
            inner_lr=inner_rates(params, inner_lr, adapt_norm=adapt_norm),
            num_steps=steps,
            first_order=first_order,
            remat=remat,
        )

    def task_grad(params, task: Task, progress):
        del progress

        def query_loss(p):
            return query_metrics(model, adapt_params(p, task.support), task)

        (_, metrics), grads = jax.value_and_grad(query_loss, has_aux=True)(params)
        return grads, metrics

    def evaluate(params, task: Task, steps):
        rates = inner_rates(params, inner_lr, adapt_norm=adapt_norm)
        return evaluate_trajectory(model, sgd_trajectory_fn(model, params, rates), task, steps)

    return MetaLearner(init, task_grad, evaluate, adapt_params)


@ALGORITHMS.register("fomaml", FOMAMLConfig)
def fomaml(
    model: Model,
    *,
    inner_lr=0.01,
    num_steps=1,
    first_order=True,
    remat=False,
    adapt_norm=True,
):
    """First-order MAML: :func:`maml` with gradients stopped through the inner gradients.

    The meta-gradient is the query-loss gradient at the adapted parameters.

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.models.base import Model
    >>> model = Model(init=lambda key: jnp.zeros(2), apply=lambda w, x: x @ w,
    ...               loss=lambda out, y: 0.5 * jnp.mean((out - y) ** 2),
    ...               metrics=lambda out, y: {})
    >>> task = Task(support=(jnp.eye(2), jnp.ones(2)), query=(jnp.eye(2), 3 * jnp.ones(2)))
    >>> grads, _ = fomaml(model, inner_lr=1.0).task_grad(jnp.zeros(2), task, 0.0)
    >>> grads   # adapted w = [0.5, 0.5]; d/dw 0.5 mean((w - 3)^2) = (w - 3) / 2
    Array([-1.25, -1.25], dtype=float32)
    """
    if not first_order:
        raise ValueError("algorithm=fomaml is first order; use algorithm=maml for second order")
    return maml(
        model,
        inner_lr=inner_lr,
        num_steps=num_steps,
        first_order=True,
        remat=remat,
        adapt_norm=adapt_norm,
    )
