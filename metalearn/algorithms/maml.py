"""MAML (Finn et al. 2017) and first-order MAML, from :func:`metalearn.core.adapt`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

from metalearn.algorithms.base import (
    InnerLoopConfig,
    MetaLearner,
    check_count,
    declared_norm_paths,
    evaluate_trajectory,
    hyperparameter_values,
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
class MAMLConfig(InnerLoopConfig):
    # Read in training only (metalearn.evaluate refuses them as overrides).
    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        **InnerLoopConfig.TRAINING_ONLY,
        "first_order": "",
        "remat": "",
    }

    name: str = "maml"
    first_order: bool = False
    remat: bool = False  # rematerialise each inner step in the backward pass (jax.checkpoint)
    unroll: int | None = None  # None: core.adapt's default; k: a lax.scan, k steps per iteration
    adapt_norm: bool = True  # False: normalisation parameters are meta-learned, not adapted

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        super().__post_init__()
        if self.unroll is not None:
            check_count("unroll", self.unroll)


@dataclasses.dataclass
class FOMAMLConfig(MAMLConfig):
    name: str = "fomaml"
    first_order: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.first_order:
            raise ValueError("algorithm=fomaml is first order; use algorithm=maml for second order")


@ALGORITHMS.register("maml", MAMLConfig)
def maml(objective: Objective, config: MAMLConfig | None = None, **overrides) -> MetaLearner:
    """MAML: meta-learn an initialisation that adapts in ``inner_steps`` SGD steps.

    The meta-parameters are the model parameters. ``first_order=True`` is FOMAML. Settings
    come from ``config`` (default :class:`MAMLConfig`) with ``overrides`` applied.
    ``adapt_norm=False`` holds the model's normalisation parameters fixed in the inner loop (they
    are meta-learned only), as Finn et al.'s code does with batch norm
    (:func:`metalearn.algorithms.base.inner_loop_mask`).

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.algorithms.base import context
    >>> from metalearn.data.sinusoid import sinusoid
    >>> from metalearn.data.task import family_objective
    >>> from metalearn.models.base import model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> tasks = sinusoid()
    >>> objective = family_objective(tasks, model_from_flax(MLP((40, 40), 1), (1,)))
    >>> learner = maml(objective, inner_lr=0.01)
    >>> params, state = objective.model.init(jax.random.key(1))
    >>> meta_params = learner.init(jax.random.key(0), params)
    >>> task = tasks.sample(tasks.splits["train"], jax.random.key(2), 10)
    >>> grads, aux = learner.task_grad(meta_params, task, context(state))
    >>> sorted(aux.metrics), learner.evaluate(meta_params, task, context(state), (0, 1, 5))[
    ...     "mse"].shape
    (['mse'], (3,))
    """
    c = with_config(MAMLConfig, config, overrides)
    norm_paths = declared_norm_paths(objective)
    own = hyperparameters(c)

    def rates(params, ctx):
        inner_lr = hyperparameter_values(ctx, own).inner_lr
        return inner_rates(params, inner_lr, norm_paths, adapt_norm=c.adapt_norm)

    def init(key, model_params):
        del key
        return model_params

    def adapt_params(params, support, ctx, steps=c.inner_steps):
        return adapt(
            inner_loss(objective, ctx),
            params,
            support,
            inner_lr=rates(params, ctx),
            num_steps=steps,
            first_order=c.first_order,
            remat=c.remat,
            unroll=c.unroll,
        )

    task_grad = query_gradient(objective, adapt_params)

    def evaluate(params, task: Task, ctx, steps):
        trajectory = sgd_trajectory_fn(objective, params, rates(params, ctx), ctx)
        return evaluate_trajectory(objective, trajectory, task, ctx, steps)

    return MetaLearner(init, task_grad, evaluate, adapt_params, hyper=own)


@ALGORITHMS.register("fomaml", FOMAMLConfig)
def fomaml(objective: Objective, config: FOMAMLConfig | None = None, **overrides) -> MetaLearner:
    """First-order MAML: :func:`maml` with gradients stopped through the inner gradients.

    The meta-gradient is the query-loss gradient at the adapted parameters.

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.algorithms.base import context
    >>> from metalearn.data.task import Aux, Objective
    >>> def loss(w, state, key, batch, train=True):
    ...     x, y = batch
    ...     return 0.5 * jnp.mean((x @ w - y) ** 2), Aux(state, {})
    >>> objective = Objective(None, loss, "loss", False)
    >>> task = Task(support=(jnp.eye(2), jnp.ones(2)), query=(jnp.eye(2), 3 * jnp.ones(2)))
    >>> grads, _ = fomaml(objective, inner_lr=1.0).task_grad(jnp.zeros(2), task, context())
    >>> grads   # adapted w = [0.5, 0.5]; d/dw 0.5 mean((w - 3)^2) = (w - 3) / 2
    Array([-1.25, -1.25], dtype=float32)
    """
    c = with_config(FOMAMLConfig, config, overrides)
    return maml(objective, MAMLConfig(**{**dataclasses.asdict(c), "name": "maml"}))
