"""Meta-SGD (Li et al. 2017): meta-learn the initialisation and a learning rate per parameter.

The inner update is ``phi = theta - alpha * grad`` with ``alpha`` a pytree shaped like
``theta`` (element-wise rates, the paper's vector ``alpha``), learned by the outer loop along
with ``theta``. Rates are free (they may become negative, which the paper allows: ``alpha``
encodes a direction as well as a size).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

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
class MetaSGDConfig:
    name: str = "meta_sgd"
    inner_lr: float = 0.01
    num_steps: int = 1
    first_order: bool = False
    adapt_norm: bool = True  # False: normalisation parameters are meta-learned, not adapted


@ALGORITHMS.register("meta_sgd", MetaSGDConfig)
def meta_sgd(
    model: Model,
    *,
    inner_lr: float = 0.01,
    num_steps: int = 1,
    first_order: bool = False,
    adapt_norm: bool = True,
) -> MetaLearner:
    """Meta-SGD: meta-parameters ``{"params": theta, "inner_lr": alpha}``.

    ``alpha`` starts at ``inner_lr`` for every parameter entry. ``first_order=True`` stops
    gradients through the inner gradients; the rates still get a gradient (through the update
    ``-alpha * grad``). ``adapt_norm=False`` zeroes the rates of normalisation parameters (they
    are meta-learned only; :func:`metalearn.algorithms.base.inner_loop_mask`).

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.data.sinusoid import sinusoid
    >>> from metalearn.models.base import model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> model = model_from_flax(MLP((40, 40), 1), (1,), "regression")
    >>> learner = meta_sgd(model, inner_lr=0.01)
    >>> meta_params = learner.init(jax.random.key(0), model.init(jax.random.key(1)))
    >>> sorted(meta_params), meta_params["inner_lr"]["head"]["bias"]
    (['inner_lr', 'params'], Array([0.01], dtype=float32))
    >>> tasks = sinusoid()
    >>> task = tasks.sample(tasks.splits["train"], jax.random.key(2), 10)
    >>> grads, metrics = jax.jit(learner.task_grad)(meta_params, task, 0.0)
    >>> grads["inner_lr"]["head"]["kernel"].shape, sorted(metrics)
    ((40, 1), ['mse'])
    """
    check_inner_loop_settings(inner_lr, num_steps)

    def init(key, model_params):
        del key
        rates = jax.tree_util.tree_map(lambda p: jnp.full_like(p, inner_lr), model_params)
        return {"params": model_params, "inner_lr": rates}

    def rates(meta_params):
        return inner_rates(meta_params["params"], meta_params["inner_lr"], adapt_norm=adapt_norm)

    def adapt_params(meta_params, support, steps=num_steps):
        return adapt(
            model.loss_fn,
            meta_params["params"],
            support,
            inner_lr=rates(meta_params),
            num_steps=steps,
            first_order=first_order,
        )

    def task_grad(meta_params, task: Task, progress):
        del progress

        def query_loss(mp):
            return query_metrics(model, adapt_params(mp, task.support), task)

        (_, metrics), grads = jax.value_and_grad(query_loss, has_aux=True)(meta_params)
        return grads, metrics

    def evaluate(meta_params, task: Task, steps):
        trajectory = sgd_trajectory_fn(model, meta_params["params"], rates(meta_params))
        return evaluate_trajectory(model, trajectory, task, steps)

    return MetaLearner(init, task_grad, evaluate, adapt_params)
