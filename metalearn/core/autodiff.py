"""Autodiff helpers: per-example gradients and the straight-through estimator."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

PyTree = Any


@functools.partial(jax.jit, static_argnums=0)
def _per_example_grads_jit(loss_fn, params, batch):
    def single_example_loss(p, example):
        # Give loss_fn a batch of one, so it sees the same shapes as in training.
        return loss_fn(p, jax.tree_util.tree_map(lambda x: x[None], example))

    return jax.vmap(jax.grad(single_example_loss), in_axes=(None, 0))(params, batch)


def per_example_grads(
    loss_fn: Callable[[PyTree, PyTree], jax.Array], params: PyTree, batch: PyTree
) -> PyTree:
    """Gradient of ``loss_fn`` for each example of ``batch`` separately: ``jit(vmap(grad))``.

    ``params`` is shared (not batched); every leaf of ``batch`` has a leading batch axis, and
    ``loss_fn`` is called on a batch of one example. Each leaf of the result has the shape of
    the matching parameter leaf, with a leading batch axis. ``loss_fn`` is a static argument of
    a cached ``jit``: pass the same function object to avoid recompiling.

    >>> import jax.numpy as jnp
    >>> loss = lambda w, b: jnp.mean((b[0] @ w - b[1]) ** 2)
    >>> x, y = jnp.array([[1.0], [2.0]]), jnp.array([0.0, 0.0])
    >>> per_example_grads(loss, jnp.array([1.0]), (x, y))   # 2 x^2 w per example
    Array([[2.],
           [8.]], dtype=float32)
    """
    return _per_example_grads_jit(loss_fn, params, batch)


def straight_through(f: Callable[[jax.Array], jax.Array]) -> Callable[[jax.Array], jax.Array]:
    """Return ``g`` with the value of ``f`` and the gradient of the identity.

    ``g(x) = x + stop_gradient(f(x) - x)``: the straight-through estimator for
    non-differentiable maps such as rounding or quantisation.

    >>> import jax, jax.numpy as jnp
    >>> st_round = straight_through(jnp.round)
    >>> st_round(1.7), jax.grad(st_round)(1.7)
    (Array(2., dtype=float32, weak_type=True), Array(1., dtype=float32, weak_type=True))
    """

    def g(x: jax.Array) -> jax.Array:
        return x + jax.lax.stop_gradient(f(x) - x)

    return g
