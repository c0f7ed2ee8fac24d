"""BOIL (Oh, Yoo, Kim and Yun 2021, "BOIL: Towards Representation Change for Few-shot
Learning"): adapt everything but the head in the inner loop.

The mirror of ANIL (:mod:`metalearn.algorithms.anil`), and the same implementation
(:func:`~metalearn.algorithms.anil.partial_inner_loop`): the inner loop runs MAML's SGD steps on
every top-level parameter entry except those the model declares as its head (``Model.head``),
which stay at their meta-values (the paper's "body only update": the head's inner learning rate
is 0); the outer loop differentiates the query loss with respect to everything, through the
inner loop."""

from __future__ import annotations

import dataclasses

from metalearn.algorithms.anil import ANILConfig, partial_inner_loop
from metalearn.algorithms.base import MetaLearner, with_config
from metalearn.data.task import Objective
from metalearn.registry import ALGORITHMS


@dataclasses.dataclass
class BOILConfig(ANILConfig):
    """ANIL's settings (the inner loop's, first order, remat), for the complementary entries."""

    name: str = "boil"


@ALGORITHMS.register("boil", BOILConfig)
def boil(objective: Objective, config: BOILConfig | None = None, **overrides) -> MetaLearner:
    """BOIL: MAML whose inner loop adapts every parameter entry except the model's declared
    head (``Model.head``), which keeps its meta-value until the outer update.

    The meta-parameters are the model parameters; ``adapt`` returns them with the body adapted
    and the head unchanged.

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.algorithms.base import context
    >>> from metalearn.data.sinusoid import sinusoid
    >>> from metalearn.data.task import family_objective
    >>> from metalearn.models.base import ModelParts, model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> tasks = sinusoid()
    >>> model = model_from_flax(MLP((40, 40), 1), (1,), ModelParts(head="head"))
    >>> learner = boil(family_objective(tasks, model), inner_lr=0.01)
    >>> params, state = model.init(jax.random.key(1))
    >>> meta_params, ctx = learner.init(jax.random.key(0), params), context(state)
    >>> task = tasks.sample(tasks.splits["train"], jax.random.key(2), 10)
    >>> adapted = learner.adapt(meta_params, task.support, ctx, 3)
    >>> bool(jnp.all(adapted["head"]["kernel"] == meta_params["head"]["kernel"]))
    True
    >>> grads, aux = jax.jit(learner.task_grad)(meta_params, task, ctx)
    >>> sorted(grads)
    ['head', 'hidden_0', 'hidden_1']
    """
    c = with_config(BOILConfig, config, overrides)
    head_names = tuple(objective.model.head) if objective.model is not None else ()
    if not head_names:
        raise ValueError(
            "algorithm=boil needs a model that declares its head (ModelParts(head=...) where "
            "the model is registered); this model declares none"
        )

    def body_entries(params):
        missing = [n for n in head_names if n not in params]
        if missing:
            raise ValueError(
                f"algorithm=boil: the declared head entries {missing} are not among the "
                f"parameters' top-level entries {list(params)}"
            )
        return tuple(k for k in params if k not in head_names)

    return partial_inner_loop(objective, c, body_entries)
