"""ANIL (Raghu et al. 2020, "Almost No Inner Loop"): adapt only the head in the inner loop.

The parameters are partitioned by their top-level entry: the model declares the entries of its
final layer (``Model.head``, from ``ModelParts(head=...)`` where the model is registered). The
inner loop runs MAML's SGD steps on those entries only, with the body held at the
meta-parameters; the outer loop differentiates the query loss with respect to everything (body
and head), through the inner loop."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

from metalearn.algorithms.base import (
    InnerLoopConfig,
    MetaLearner,
    evaluate_trajectory,
    hyperparameter_values,
    hyperparameters,
    inner_loss,
    query_gradient,
    split_top_level,
    with_config,
)
from metalearn.core import adapt, adapt_trajectory
from metalearn.data.task import Objective, Task
from metalearn.registry import ALGORITHMS


@dataclasses.dataclass
class ANILConfig(InnerLoopConfig):
    # Read in training only (metalearn.evaluate refuses them as overrides).
    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        **InnerLoopConfig.TRAINING_ONLY,
        "first_order": "",
        "remat": "",
    }

    name: str = "anil"
    first_order: bool = False
    remat: bool = False


@ALGORITHMS.register("anil", ANILConfig)
def anil(objective: Objective, config: ANILConfig | None = None, **overrides) -> MetaLearner:
    """ANIL: MAML whose inner loop adapts only the parameter entries the model declares as its
    head (``Model.head``).

    The meta-parameters are the model parameters (a dict whose top-level entries include
    the head); ``adapt`` returns the full model parameters with the head adapted.

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.algorithms.base import context
    >>> from metalearn.data.sinusoid import sinusoid
    >>> from metalearn.data.task import family_objective
    >>> from metalearn.models.base import ModelParts, model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> tasks = sinusoid()
    >>> model = model_from_flax(MLP((40, 40), 1), (1,), ModelParts(head="head"))
    >>> learner = anil(family_objective(tasks, model), inner_lr=0.01)
    >>> params, state = model.init(jax.random.key(1))
    >>> meta_params, ctx = learner.init(jax.random.key(0), params), context(state)
    >>> task = tasks.sample(tasks.splits["train"], jax.random.key(2), 10)
    >>> adapted = learner.adapt(meta_params, task.support, ctx, 3)
    >>> bool(jnp.all(adapted["hidden_0"]["kernel"] == meta_params["hidden_0"]["kernel"]))
    True
    >>> grads, aux = jax.jit(learner.task_grad)(meta_params, task, ctx)
    >>> evaluate = jax.jit(learner.evaluate, static_argnums=3)
    >>> sorted(grads), evaluate(meta_params, task, ctx, (0, 1, 5))["mse"].shape
    (['head', 'hidden_0', 'hidden_1'], (3,))
    """
    c = with_config(ANILConfig, config, overrides)
    head_names = tuple(objective.model.head)
    if not head_names:
        raise ValueError(
            "algorithm=anil needs a model that declares its head (ModelParts(head=...) where "
            "the model is registered); this model declares none"
        )
    return partial_inner_loop(objective, c, lambda params: head_names)


def partial_inner_loop(objective: Objective, c, adapted_entries) -> MetaLearner:
    """MAML whose inner loop adapts only some top-level parameter entries: those named by
    ``adapted_entries(params)``, a static tuple of names (ANIL: the head; BOIL: all but the
    head); the others are held at the meta-parameters in the inner loop. ``c`` is the
    algorithm's config (an :class:`InnerLoopConfig` with ``first_order`` and ``remat``). The
    outer loop differentiates the query loss with respect to every entry."""
    own = hyperparameters(c)

    def split(params):
        return split_top_level(params, adapted_entries(params))

    def partial_loss(fixed, ctx, train=True):
        loss_fn = inner_loss(objective, ctx, train)
        return lambda adapted, batch: loss_fn({**fixed, **adapted}, batch)

    def init(key, model_params):
        del key
        split(model_params)  # fail early if a named entry is missing
        return model_params

    def adapt_params(params, support, ctx, steps=c.inner_steps):
        adapted, fixed = split(params)
        new = adapt(
            partial_loss(fixed, ctx),
            adapted,
            support,
            inner_lr=hyperparameter_values(ctx, own).inner_lr,
            num_steps=steps,
            first_order=c.first_order,
            remat=c.remat,
        )
        return {**params, **new}

    task_grad = query_gradient(objective, adapt_params)

    def evaluate(params, task: Task, ctx, steps):
        adapted, fixed = split(params)
        loss_fn = partial_loss(fixed, ctx, train=False)
        inner_lr = hyperparameter_values(ctx, own).inner_lr

        def trajectory(support, n):
            return adapt_trajectory(loss_fn, adapted, support, inner_lr=inner_lr, num_steps=n)

        return evaluate_trajectory(
            objective, trajectory, task, ctx, steps, to_model_params=lambda a: {**params, **a}
        )

    return MetaLearner(init, task_grad, evaluate, adapt_params, hyper=own)
