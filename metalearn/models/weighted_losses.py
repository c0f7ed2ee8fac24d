"""Classification loss and accuracy over padded batches: per-example weights, weighted means.

Variable-way, variable-shot episodes (:mod:`metalearn.data.episodes`) pad every episode to the
maximum ways and shots and mark padding with weight 0 and label ``-1``. These helpers take the
weighted mean over examples, ``sum(w_i * f_i) / sum(w_i)``, so with 0/1 weights the result is
the plain mean over the real examples; padding never contributes, even where its per-example
value is not finite (a ``-inf`` logit, an out-of-range label), because it is selected out with
``jnp.where`` rather than multiplied by 0. With all-ones weights they equal the unweighted mean.

>>> import jax.numpy as jnp
>>> logits = jnp.array([[2.0, 0.0], [0.0, 2.0], [5.0, -5.0]])
>>> labels, weights = jnp.array([0, 0, -1]), jnp.array([1.0, 1.0, 0.0])
>>> round(float(weighted_accuracy(logits, labels, weights)), 3)
0.5
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def weighted_mean(values: jax.Array, weights: jax.Array) -> jax.Array:
    """``sum(w * v) / max(sum(w), tiny)`` over all entries, ignoring ``v`` where ``w == 0``.

    >>> float(weighted_mean(jnp.array([1.0, 3.0, jnp.nan]), jnp.array([1.0, 1.0, 0.0])))
    2.0
    """
    weights = weights.astype(values.dtype)
    total = jnp.sum(jnp.where(weights != 0, weights * values, 0.0))
    return total / jnp.maximum(jnp.sum(weights), jnp.finfo(values.dtype).tiny)


def weighted_cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
    """Weighted mean softmax cross-entropy of integer ``labels`` (any label where ``w == 0``).

    >>> logits = jnp.array([[0.0, 0.0], [9.0, -9.0]])
    >>> round(float(weighted_cross_entropy(logits, jnp.array([1, -1]), jnp.array([1.0, 0.0]))), 4)
    0.6931
    """
    safe = jnp.where(weights != 0, labels, 0)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    per_example = -jnp.take_along_axis(log_probs, safe[..., None], axis=-1)[..., 0]
    return weighted_mean(per_example, weights)


def weighted_accuracy(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
    """Weighted mean of ``argmax(logits) == labels``."""
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(logits.dtype)
    return weighted_mean(correct, weights)


def weighted_classification_metrics(
    logits: jax.Array, labels: jax.Array, weights: jax.Array
) -> dict[str, jax.Array]:
    """``{"loss", "accuracy"}`` over the weighted examples, as ``classification_metrics``."""
    return {
        "loss": weighted_cross_entropy(logits, labels, weights),
        "accuracy": weighted_accuracy(logits, labels, weights),
    }
