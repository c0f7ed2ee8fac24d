"""What the algorithms that fit a head on a model's declared embedding share (Prototypical
Networks, R2D2, MetaOptNet-SVM): their refusals, a batch's features, the meta-gradient and the
evaluation of the query classifier, and the Dense head their ``adapt`` writes the fitted
classifier into. Each check is static (shapes and dtypes): traced once, nothing in the
compiled step."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from metalearn.algorithms.base import gradient_of, split_top_level
from metalearn.data.task import (
    Aux,
    Objective,
    Task,
    apply_to_batch,
    describe,
    supervised_loss_and_metrics,
)
from metalearn.models.base import Model
from metalearn.models.weighted_losses import weighted_mean


def embedding_model(objective: Objective, name: str) -> Model:
    """The objective's model; ValueError (one line) unless it declares an embedding."""
    model = objective.model
    if model is None or model.embed is None:
        raise ValueError(
            f"algorithm={name} needs a model that declares an embedding (ModelParts(embed=...) "
            "where the model is registered); this model declares none"
        )
    return model


def check_classification(batch, name: str, why: str) -> None:
    """ValueError (one line) unless ``batch`` has integer class labels ``[examples]``; ``why``:
    what the algorithm does with the classes (``"to build prototypes from"``).

    >>> check_classification((jnp.zeros((2, 1)), jnp.zeros((2, 1))), "protonet", "to use")
    Traceback (most recent call last):
    ...
    ValueError: algorithm=protonet needs a classification task family (integer class labels ...
    """
    labels = batch[1]
    if not jnp.issubdtype(labels.dtype, jnp.integer) or labels.ndim != 1:
        raise ValueError(
            f"algorithm={name} needs a classification task family (integer class labels of "
            f"shape [examples]); got labels of dtype {labels.dtype} and shape {labels.shape} "
            f"(regression tasks such as sinusoid have no classes {why})"
        )


def features(model: Model, params, ctx, batch, stream: int, train: bool, name: str, use: str):
    """``(features [examples, dim], model state)`` of ``batch`` through ``model.embed``, its
    key ``fold_in(ctx.key, stream)``; ValueError (one line) for an embedding of another shape,
    ``use`` saying what the features are for (``"to average into prototypes"``)."""
    key = None if ctx.key is None else jax.random.fold_in(ctx.key, stream)
    found, state = apply_to_batch(model.embed, params, ctx.model_state, key, batch, train)
    if not (hasattr(found, "shape") and found.ndim == 2):
        raise ValueError(
            f"algorithm={name}: the model's embed (ModelParts(embed=...)) returned "
            f"{describe(found)}, not one array of features [examples, features] {use}: return "
            "the features alone, flattened per example; see docs/extending.md (a model)"
        )
    return found, state


def dense_head(model: Model, params, what: str) -> tuple[str, int]:
    """The name and the class count of the model's head, which must be one Dense entry
    (``kernel [dim, ways]``, ``bias [ways]``) for ``adapt`` to write a linear classifier into;
    ``what``: what the ``adapt`` writes (``"protonet's adapt writes the prototypes into the
    head"``)."""
    head, _ = split_top_level(params, tuple(model.head))
    entry = head[model.head[0]] if len(head) == 1 else None
    if entry is None or set(entry) != {"kernel", "bias"} or entry["kernel"].ndim != 2:
        raise ValueError(
            f"{what} and needs a head of one Dense entry with 'kernel' [dim, ways] and 'bias' "
            "[ways]"
        )
    return model.head[0], entry["kernel"].shape[1]


def smoothed_cross_entropy(logits, batch, present, smoothing: float) -> jax.Array:
    """The query cross-entropy against labels smoothed over the classes ``present`` in the
    task: ``1 - smoothing`` on the label, ``smoothing / (present - 1)`` on each other present
    class (MetaOptNet's reference code smooths over the episode's ways); a mean over the real
    examples of a padded batch.

    >>> logits = jnp.log(jnp.array([[0.5, 0.25, 0.25, 0.0]]))  # class 3 absent: logit -inf
    >>> present = jnp.array([True, True, True, False])
    >>> smoothed = smoothed_cross_entropy(logits, (None, jnp.array([0])), present, 0.2)
    >>> import math
    >>> round(float(smoothed), 4), round(-(0.8 * math.log(0.5) + 0.2 * math.log(0.25)), 4)
    (0.8318, 0.8318)
    """
    labels = batch[1]
    one_hot = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
    others = present.sum() - 1
    targets = (1 - smoothing) * one_hot + smoothing * present * (1 - one_hot) / others
    log_p = jax.nn.log_softmax(logits)
    per_example = -jnp.sum(jnp.where(targets > 0, targets * log_p, 0.0), axis=-1)
    weights = getattr(batch, "weights", None)
    return per_example.mean() if weights is None else weighted_mean(per_example, weights)


def query_classifier(logits_and_state, label_smoothing: float = 0.0):
    """``(task_grad, evaluate)`` of a learner without an inner loop whose query
    logits come from ``logits_and_state(meta, task, ctx, train) -> (logits, model state, extra
    metrics)``: the query cross-entropy (with ``label_smoothing``, that of
    :func:`smoothed_cross_entropy`; the metrics report the plain one) and its meta-gradient,
    and the same metrics for every step count."""

    def task_loss(meta, task: Task, ctx):
        logits, state, extra = logits_and_state(meta, task, ctx, True)
        loss, metrics = supervised_loss_and_metrics("classification", logits, task.query)
        if label_smoothing:
            classes = logits.shape[-1]
            present = jax.nn.one_hot(task.support[1], classes).sum(0) > 0
            loss = smoothed_cross_entropy(logits, task.query, present, label_smoothing)
        return loss, Aux(state, {**metrics, **extra})

    def evaluate(meta, task: Task, ctx, steps):
        logits, _, _ = logits_and_state(meta, task, ctx, False)
        _, metrics = supervised_loss_and_metrics("classification", logits, task.query)
        return {k: jnp.broadcast_to(v, (len(tuple(steps)),)) for k, v in metrics.items()}

    return gradient_of(task_loss), evaluate
