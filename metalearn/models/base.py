"""The model bundle a meta-learner sees: pure functions, no Flax module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

PyTree = Any


def mse_loss(outputs: jax.Array, targets: jax.Array) -> jax.Array:
    return jnp.mean((outputs - targets) ** 2)


def cross_entropy_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def regression_metrics(outputs: jax.Array, targets: jax.Array) -> dict[str, jax.Array]:
    return {"mse": mse_loss(outputs, targets)}


def classification_metrics(logits: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
    return {
        "loss": cross_entropy_loss(logits, labels),
        "accuracy": jnp.mean(jnp.argmax(logits, -1) == labels),
    }


class Model(NamedTuple):
    """A model as pure functions of a parameter pytree.

    ``apply(params, x) -> outputs``; ``loss(outputs, y) -> scalar``; ``metrics(outputs, y) ->
    dict``. ``head`` names the top-level parameter entries of the final layer (ANIL adapts only
    those; Prototypical Networks drop them).
    """

    init: Callable[[jax.Array], PyTree]
    apply: Callable[[PyTree, jax.Array], jax.Array]
    loss: Callable[[jax.Array, jax.Array], jax.Array]
    metrics: Callable[[jax.Array, jax.Array], dict[str, jax.Array]]
    head: tuple[str, ...] = ()
    embed: Callable[[PyTree, jax.Array], jax.Array] | None = None

    def loss_fn(self, params: PyTree, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
        """``loss(apply(params, x), y)``: the ``(params, batch) -> scalar`` boundary of core."""
        x, y = batch
        return self.loss(self.apply(params, x), y)

    def metrics_fn(self, params: PyTree, batch: tuple[jax.Array, jax.Array]) -> dict:
        x, y = batch
        return self.metrics(self.apply(params, x), y)


def model_from_flax(
    module: nn.Module,
    input_shape: tuple[int, ...],
    kind: str,
    head: tuple[str, ...] = (),
    embed_method: str | None = None,
) -> Model:
    """Wrap a Flax module (with a ``params`` collection only) as a :class:`Model`.

    ``kind`` picks the loss: ``"regression"`` (mean squared error) or ``"classification"``
    (softmax cross-entropy with integer labels). ``embed_method`` names a module method that
    returns features before the head (used by Prototypical Networks).
    """
    if kind == "regression":
        loss, metrics = mse_loss, regression_metrics
    elif kind == "classification":
        loss, metrics = cross_entropy_loss, classification_metrics
    else:
        raise ValueError(f"unknown task kind {kind!r}; expected 'regression' or 'classification'")

    def init(key: jax.Array) -> PyTree:
        return module.init(key, jnp.zeros((1, *input_shape), jnp.float32))["params"]

    def apply(params: PyTree, x: jax.Array) -> jax.Array:
        return module.apply({"params": params}, x)

    embed = None
    if embed_method is not None:

        def embed(params: PyTree, x: jax.Array) -> jax.Array:
            return module.apply({"params": params}, x, method=embed_method)

    return Model(init, apply, loss, metrics, tuple(head), embed)
