"""Meta-SGD (Li et al. 2017): meta-learn the initialisation and a learning rate per parameter.

The inner update is ``phi = theta - alpha * grad`` with ``alpha`` a pytree shaped like
``theta`` (element-wise rates, the paper's vector ``alpha``), learned by the outer loop along
with ``theta``. Rates are free (they may become negative, which the paper allows: ``alpha``
encodes a direction as well as a size).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp

from metalearn.algorithms.base import (
    InnerLoopConfig,
    MetaLearner,
    declared_norm_paths,
    evaluate_trajectory,
    hyperparameters,
    inner_loss,
    inner_rates,
    query_gradient,
    sgd_trajectory_fn,
    with_config,
)
from metalearn.core import adapt
from metalearn.data.task import Objective, Task
from metalearn.registry import ALGORITHMS


@dataclasses.dataclass
class MetaSGDConfig(InnerLoopConfig):
    # Read in training only (metalearn.evaluate refuses them as overrides).
    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        **InnerLoopConfig.TRAINING_ONLY,
        "inner_lr": "it initialises the learned rates; the evaluation adapts with the checkpoint's",
        "first_order": "",
    }

    name: str = "meta_sgd"
    first_order: bool = False
    adapt_norm: bool = True  # False: normalisation parameters are meta-learned, not adapted


@ALGORITHMS.register("meta_sgd", MetaSGDConfig)
def meta_sgd(objective: Objective, config: MetaSGDConfig | None = None, **overrides) -> MetaLearner:
    """Meta-SGD: meta-parameters ``{"params": theta, "inner_lr": alpha}``.

    ``alpha`` starts at ``inner_lr`` for every parameter entry. ``first_order=True`` stops
    gradients through the inner gradients; the rates still get a gradient (through the update
    ``-alpha * grad``). ``adapt_norm=False`` zeroes the rates of the model's normalisation
    parameters (they are meta-learned only; :func:`metalearn.algorithms.base.inner_loop_mask`).

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.algorithms.base import context
    >>> from metalearn.data.sinusoid import sinusoid
    >>> from metalearn.data.task import family_objective
    >>> from metalearn.models.base import model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> tasks = sinusoid()
    >>> model = model_from_flax(MLP((40, 40), 1), (1,))
    >>> learner = meta_sgd(family_objective(tasks, model), inner_lr=0.01)
    >>> params, state = model.init(jax.random.key(1))
    >>> meta_params = learner.init(jax.random.key(0), params)
    >>> sorted(meta_params), meta_params["inner_lr"]["head"]["bias"]
    (['inner_lr', 'params'], Array([0.01], dtype=float32))
    >>> task = tasks.sample(tasks.splits["train"], jax.random.key(2), 10)
    >>> grads, aux = jax.jit(learner.task_grad)(meta_params, task, context(state))
    >>> grads["inner_lr"]["head"]["kernel"].shape, sorted(aux.metrics)
    ((40, 1), ['mse'])
    """
    c = with_config(MetaSGDConfig, config, overrides)  # inner_lr: the learned rates' start

    def init(key, model_params):
        del key
        rates = jax.tree_util.tree_map(lambda p: jnp.full_like(p, c.inner_lr), model_params)
        return {"params": model_params, "inner_lr": rates}

    norm_paths = declared_norm_paths(objective)

    def rates(meta_params):
        return inner_rates(
            meta_params["params"], meta_params["inner_lr"], norm_paths, adapt_norm=c.adapt_norm
        )

    def adapt_params(meta_params, support, ctx, steps=c.inner_steps):
        return adapt(
            inner_loss(objective, ctx),
            meta_params["params"],
            support,
            inner_lr=rates(meta_params),
            num_steps=steps,
            first_order=c.first_order,
        )

    task_grad = query_gradient(objective, adapt_params)

    def evaluate(meta_params, task: Task, ctx, steps):
        trajectory = sgd_trajectory_fn(objective, meta_params["params"], rates(meta_params), ctx)
        return evaluate_trajectory(objective, trajectory, task, ctx, steps)

    return MetaLearner(init, task_grad, evaluate, adapt_params, hyper=hyperparameters(c))
