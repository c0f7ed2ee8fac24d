"""CAVIA (Zintgraf, Shiarlis, Kurin, Hofmann and Whiteson 2019, "Fast Context Adaptation via
Meta-Learning"): the inner loop adapts only a context vector fed to the network; the network's
weights are meta-learned.

Each task starts from the context ``phi = 0`` (``num_context`` entries) and takes
``inner_steps`` SGD steps on it at ``inner_lr``; the network's parameters stay at their
meta-values. The context enters the network as FiLM (the paper's conditioning for its image
networks): ``gamma, beta = phi @ W + b``, and the output ``h`` of one submodule
(``film_module``, a parameter entry such as Conv4's ``norms_2``, the third block's batch norm, or
the MLP's ``hidden_0``) becomes ``h * (1 + gamma) + beta``, per channel (its last axis). The
outer loop differentiates the query loss after the inner steps with respect to the network
and ``W, b`` (second order; ``first_order`` drops the inner steps' second derivatives).

Any registered Flax model works as it is: the FiLM is applied by intercepting the submodule's
call (``flax.linen.intercept_methods``), so no model is written with a context input. Where the
paper concatenates the context to a sinusoid network's input, FiLM on the first hidden layer
does the same and more (an added ``beta`` before the activation, plus a scale). ``W`` starts as
PyTorch's ``nn.Linear`` does (uniform in ``+-1/sqrt(num_context)``) and ``b`` at 0, so a task's
network starts as the meta-learned one.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from metalearn.algorithms.base import (
    InnerLoopConfig,
    MetaLearner,
    check_count,
    gradient_of,
    hyperparameter,
    hyperparameter_values,
    hyperparameters,
    inner_loss,
    metrics_at_steps,
    query_loss,
    query_metrics,
    with_config,
)
from metalearn.core import adapt, adapt_trajectory
from metalearn.data.task import Aux, Objective, Task
from metalearn.registry import ALGORITHMS


@dataclasses.dataclass
class CAVIAConfig(InnerLoopConfig):
    """CAVIA's settings, the paper's for its image networks: 100 context parameters, 2 inner
    steps at rate 1.0 in training; FiLM on the output of the parameter entry ``film_module``."""

    # Read in training only (metalearn.evaluate refuses them as overrides).
    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        **InnerLoopConfig.TRAINING_ONLY,
        "first_order": "",
        "remat": "",
    }

    name: str = "cavia"
    inner_lr: float = hyperparameter(1.0)
    inner_steps: int = 2
    num_context: int = 100
    film_module: str = "norms_2"  # Conv4's third block, after batch norm (the paper's third)
    first_order: bool = False
    remat: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_count("num_context", self.num_context)
        if not self.film_module:
            raise ValueError("algorithm.film_module must name a parameter entry of the model")


def _entry(params: Mapping, path: str):
    """The parameter entry at ``path`` (``"blocks_0/conv"``), or None."""
    entry = params
    for part in path.split("/"):
        if not isinstance(entry, Mapping) or part not in entry:
            return None
        entry = entry[part]
    return entry


@ALGORITHMS.register("cavia", CAVIAConfig)
def cavia(objective: Objective, config: CAVIAConfig | None = None, **overrides) -> MetaLearner:
    """CAVIA on any Flax model: meta-parameters ``{"params": model parameters, "film":
    {"kernel" [num_context, 2 x channels], "bias" [2 x channels]}}``; the inner loop adapts a
    per-task context from 0.

    ``adapt`` folds the adapted FiLM into the model's parameters where the FiLM'd entry is
    affine in its output (a ``kernel`` or ``scale`` and a ``bias``: Dense, Conv, batch norm
    with a scale), so the model's ``apply`` predicts as the adapted network.

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.algorithms.base import context
    >>> from metalearn.data.sinusoid import sinusoid
    >>> from metalearn.data.task import family_objective
    >>> from metalearn.models.base import ModelParts, model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> tasks = sinusoid()
    >>> model = model_from_flax(MLP((40, 40), 1), (1,), ModelParts(head="head"))
    >>> learner = cavia(family_objective(tasks, model), num_context=2, film_module="hidden_0")
    >>> params, state = model.init(jax.random.key(1))
    >>> meta_params, ctx = learner.init(jax.random.key(0), params), context(state)
    >>> meta_params["film"]["kernel"].shape
    (2, 80)
    >>> task = tasks.sample(tasks.splits["train"], jax.random.key(2), 10)
    >>> grads, aux = jax.jit(learner.task_grad)(meta_params, task, ctx)
    >>> evaluate = jax.jit(learner.evaluate, static_argnums=3)
    >>> sorted(grads), evaluate(meta_params, task, ctx, (0, 1, 5))["mse"].shape
    (['film', 'params'], (3,))
    """
    c = with_config(CAVIAConfig, config, overrides)
    own = hyperparameters(c)
    target = tuple(c.film_module.split("/"))
    if objective.model is None:
        raise ValueError("algorithm=cavia needs a model (it feeds the context to one)")

    def channels(model_params) -> int:
        entry = _entry(model_params, c.film_module)
        leaves = jax.tree_util.tree_leaves(entry) if isinstance(entry, Mapping) else []
        if not leaves:
            raise ValueError(
                f"algorithm.film_module={c.film_module} is not a parameter entry of the model "
                f"(its top-level entries: {', '.join(model_params)}); name the submodule whose "
                "output the context modulates"
            )
        return int(leaves[0].shape[-1])  # a bias's or a kernel's output channels

    def init(key, model_params):
        width = channels(model_params)
        bound = 1.0 / jnp.sqrt(c.num_context)
        kernel = jax.random.uniform(key, (c.num_context, 2 * width), minval=-bound, maxval=bound)
        return {"params": model_params, "film": {"kernel": kernel, "bias": jnp.zeros(2 * width)}}

    def film(meta, phi):
        out = phi @ meta["film"]["kernel"] + meta["film"]["bias"]
        return jnp.split(out, 2)  # gamma, beta

    @contextlib.contextmanager
    def conditioned(meta, phi):
        """The model's calls, inside, have the FiLM of ``phi`` on ``film_module``'s output."""
        gamma, beta = film(meta, phi)
        seen = []

        def interceptor(next_fun, args, kwargs, context):
            out = next_fun(*args, **kwargs)
            if context.method_name != "__call__":
                return out
            seen.append("/".join(context.module.path))
            if tuple(context.module.path) == target:
                return out * (1 + gamma) + beta
            return out

        with nn.intercept_methods(interceptor):
            yield
        called = list(dict.fromkeys(s for s in seen if s))
        if c.film_module not in called:  # else the context would silently go nowhere
            raise ValueError(
                f"algorithm.film_module={c.film_module}: the model never calls a submodule of "
                f"that name; it calls {', '.join(called)}"
                if called
                else "algorithm=cavia feeds the context through the model's Flax submodules, "
                "and this model calls none (not a Flax module): register a Flax model"
            )

    def context_loss(meta, ctx, train=True):
        loss_fn = inner_loss(objective, ctx, train)

        def loss(phi, batch):
            with conditioned(meta, phi):
                return loss_fn(meta["params"], batch)

        return loss

    def start(meta):
        return jnp.zeros(c.num_context, meta["film"]["kernel"].dtype)

    def adapted_context(meta, support, ctx, steps=c.inner_steps):
        return adapt(
            context_loss(meta, ctx),
            start(meta),
            support,
            inner_lr=hyperparameter_values(ctx, own).inner_lr,
            num_steps=steps,
            first_order=c.first_order,
            remat=c.remat,
        )

    def task_loss(meta, task: Task, ctx):
        phi = adapted_context(meta, task.support, ctx)
        with conditioned(meta, phi):
            value, aux = query_loss(objective, meta["params"], ctx, task.query)
        return value, Aux(aux.model_state, aux.metrics)

    def evaluate(meta, task: Task, ctx, steps):
        loss_fn = context_loss(meta, ctx, train=False)
        inner_lr = hyperparameter_values(ctx, own).inner_lr
        trajectory = adapt_trajectory(
            loss_fn, start(meta), task.support, inner_lr=inner_lr, num_steps=max(max(steps), 1)
        )

        def metrics(phi):
            with conditioned(meta, phi):
                return query_metrics(objective, meta["params"], ctx, task.query)

        return metrics_at_steps(trajectory, steps, metrics)

    def adapt_params(meta, support, ctx, inner_steps=c.inner_steps):
        gamma, beta = film(meta, adapted_context(meta, support, ctx, inner_steps))
        params = meta["params"]
        entry = dict(_entry(params, c.film_module))
        weight = "kernel" if "kernel" in entry else "scale"
        if weight not in entry or "bias" not in entry:
            raise ValueError(
                f"algorithm=cavia: the output of {c.film_module} is not affine in its "
                f"parameters (it has {', '.join(entry)}), so the adapted context cannot be "
                "written into the model's parameters; use learner.evaluate"
            )
        entry[weight] = entry[weight] * (1 + gamma)
        entry["bias"] = entry["bias"] * (1 + gamma) + beta
        folded = dict(params)
        node = folded
        for part in target[:-1]:
            node[part] = dict(node[part])
            node = node[part]
        node[target[-1]] = entry
        return folded

    return MetaLearner(init, gradient_of(task_loss), evaluate, adapt_params, hyper=own)
