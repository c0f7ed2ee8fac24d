"""Prototypical Networks (Snell, Swersky and Zemel 2017): classify by distance to class means.

Each class's prototype is the mean embedding (``model.embed``) of its support examples; a query
example's logits are the negative squared Euclidean distances to the prototypes. The outer loop
trains the embedding on the query cross-entropy. There is no inner loop: ``evaluate`` returns the
same metrics for every requested step count, and the head of the model is not used (its
meta-gradient is zero).

Needs a supervised classification task family (support and query sets of ``(inputs, labels)``
with integer labels ``0 .. ways-1``) and a model that declares an embedding (``Model.embed``).
The number of ways is not passed in: prototypes are computed for every label below the
support-set size (a static upper bound on the ways) and labels absent from the support set get
logit ``-inf``, which leaves the softmax, the cross-entropy and the accuracy exactly those of
the ``ways`` present classes. Padded episodes (a :class:`~metalearn.data.task.WeightedBatch`
support and query, label ``-1`` and weight 0 for padding) work as they are: padding has no
one-hot row, so it never enters a prototype, and the query loss and metrics are means over the
real queries (:func:`~metalearn.data.task.supervised_loss_and_metrics`)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from metalearn.algorithms.base import MetaLearner, with_config
from metalearn.algorithms.embedding import (
    check_classification,
    dense_head,
    embedding_model,
    features,
    query_classifier,
)
from metalearn.data.task import Objective, Task
from metalearn.registry import ALGORITHMS


@dataclasses.dataclass
class ProtoNetConfig:
    name: str = "protonet"


def class_prototypes(
    embeddings: jax.Array, labels: jax.Array, num_classes: int
) -> tuple[jax.Array, jax.Array]:
    """``(prototypes [num_classes, dim], counts [num_classes])``: per-class mean embeddings.

    A class with no example gets a zero prototype and count 0.

    >>> import jax.numpy as jnp
    >>> protos, counts = class_prototypes(jnp.array([[0.0], [2.0], [5.0]]), jnp.array([0, 0, 1]), 3)
    >>> protos.ravel().tolist(), counts.tolist()
    ([1.0, 5.0, 0.0], [2.0, 1.0, 0.0])
    """
    one_hot = jax.nn.one_hot(labels, num_classes, dtype=embeddings.dtype)
    counts = one_hot.sum(0)
    sums = one_hot.T @ embeddings
    return sums / jnp.maximum(counts, 1)[:, None], counts


def prototypical_logits(
    support_embeddings: jax.Array,
    support_labels: jax.Array,
    query_embeddings: jax.Array,
    num_classes: int,
) -> jax.Array:
    """Logits ``[num_queries, num_classes]``: ``-|query - prototype_c|^2``, ``-inf`` for absent c.

    >>> import jax.numpy as jnp
    >>> support, labels = jnp.array([[0.0], [2.0], [5.0]]), jnp.array([0, 0, 1])
    >>> prototypical_logits(support, labels, jnp.array([[2.0]]), 3).tolist()
    [[-1.0, -9.0, -inf]]
    """
    protos, counts = class_prototypes(support_embeddings, support_labels, num_classes)
    diff = query_embeddings[:, None, :] - protos[None, :, :]
    logits = -jnp.sum(diff**2, axis=-1)
    return jnp.where(counts[None, :] > 0, logits, -jnp.inf)


CLASSES = "to build prototypes from"  # what protonet does with a task's classes


@ALGORITHMS.register("protonet", ProtoNetConfig)
def protonet(
    objective: Objective, config: ProtoNetConfig | None = None, **overrides
) -> MetaLearner:
    """Prototypical Networks on the model's declared embedding; the meta-parameters are the model
    parameters.

    ``adapt`` returns the model parameters with the head replaced by the equivalent linear
    classifier (weights ``2 c``, bias ``-|c|^2`` per prototype ``c``, Snell et al. Sec. 2.4), so
    the model's ``apply`` on the adapted parameters predicts like the prototypes; this needs a
    declared head of one Dense entry (``kernel [dim, ways]``, ``bias [ways]``) fed by the
    embedding.

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.algorithms.base import context
    >>> from metalearn.data.task import Task, supervised_objective
    >>> from metalearn.models.base import ModelParts, model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> model = model_from_flax(MLP((32, 16), 3), (4,), ModelParts(head="head", embed="embed"))
    >>> learner = protonet(supervised_objective(model, "classification"))
    >>> params, state = model.init(jax.random.key(1))
    >>> params, ctx = learner.init(jax.random.key(0), params), context(state)
    >>> x = jax.random.normal(jax.random.key(2), (12, 4))
    >>> labels = jnp.tile(jnp.arange(3), 4)
    >>> task = Task(support=(x[:6], labels[:6]), query=(x[6:], labels[6:]))
    >>> grads, aux = jax.jit(learner.task_grad)(params, task, ctx)
    >>> evaluate = jax.jit(learner.evaluate, static_argnums=3)
    >>> sorted(aux.metrics), evaluate(params, task, ctx, (0, 1, 5))["accuracy"].shape
    (['accuracy', 'loss'], (3,))
    """
    with_config(ProtoNetConfig, config, overrides)
    model = embedding_model(objective, "protonet")

    def embed(params, ctx, batch, stream, train):
        return features(
            model, params, ctx, batch, stream, train, "protonet", "to average into prototypes"
        )

    def init(key, model_params):
        del key
        return model_params

    def logits_and_state(params, task: Task, ctx, train=True):
        check_classification(task.support, "protonet", CLASSES)
        check_classification(task.query, "protonet", CLASSES)
        support_y = task.support[1]
        num_classes = support_y.shape[0]  # static upper bound on the ways
        support_embeddings, _ = embed(params, ctx, task.support, 0, train)
        query_embeddings, state = embed(params, ctx, task.query, 1, train)
        logits = prototypical_logits(support_embeddings, support_y, query_embeddings, num_classes)
        return logits, state, {}

    task_grad, evaluate = query_classifier(logits_and_state)

    def adapt_params(params, support, ctx, inner_steps=0):
        del inner_steps  # no inner loop
        check_classification(support, "protonet", CLASSES)
        written = "protonet's adapt writes the prototypes into the head"
        head, num_classes = dense_head(model, params, written)
        support_embeddings, _ = embed(params, ctx, support, 0, False)
        protos, counts = class_prototypes(support_embeddings, support[1], num_classes)
        bias = jnp.where(counts > 0, -jnp.sum(protos**2, axis=-1), -jnp.inf)
        return {**params, head: {"kernel": 2.0 * protos.T, "bias": bias}}

    return MetaLearner(init, task_grad, evaluate, adapt_params)
