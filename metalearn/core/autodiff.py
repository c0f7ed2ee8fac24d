"""Autodiff helpers: per-example gradients and the straight-through estimator."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


def _is_none(x: Any) -> bool:
    return x is None


def _add_batch_axis(axes: Any, arg: PyTree) -> PyTree:
    """Give every mapped leaf of ``arg`` (``axes`` is its ``vmap`` in_axes prefix) an axis of 1."""

    def expand(axis: int | None, subtree: PyTree) -> PyTree:
        if axis is None:
            return subtree
        return jax.tree_util.tree_map(lambda x: jnp.expand_dims(x, axis), subtree)

    return jax.tree_util.tree_map(expand, axes, arg, is_leaf=_is_none)


def per_example_grads(
    loss_fn: Callable[..., jax.Array],
    params: PyTree,
    *args: PyTree,
    in_axes: int | None | Sequence[Any] = None,
    batch_of_one: bool = False,
) -> PyTree:
    """Gradient of ``loss_fn`` with respect to ``params`` for each example separately.

    This is the JAX documentation's idiom ``vmap(grad(loss_fn), in_axes=(None, 0, ...))``:
    ``loss_fn(params, *example)`` is written for ONE example (one row of each batched
    argument), and any number of batched arguments may follow ``params``. ``in_axes`` is
    ``jax.vmap``'s, over the whole argument list ``(params, *args)``; the default ``None``
    means ``(None, 0, 0, ...)``: ``params`` shared, every other argument batched along its
    leading axis. Each leaf of the result has the shape of the matching parameter leaf, with
    a leading batch axis.

    With ``batch_of_one=True``, every mapped leaf of the batched arguments gets back its batch
    axis, with size 1, before ``loss_fn`` sees it (``params`` never does): for a loss written
    for batches (a model with a batch dimension, a ``mean`` over examples), which then sees
    the shapes it sees in training.

    Nothing is compiled here: wrap the caller in ``jax.jit`` (the docs' ``jit(vmap(grad))``),
    so a new ``lambda`` costs one trace of the caller, never a hidden cache entry.

    >>> import jax.numpy as jnp
    >>> def td_loss(theta, s_tm1, r_t, s_t):          # one transition, as in the JAX docs
    ...     target = r_t + jnp.dot(theta, s_t)
    ...     return -0.5 * (jax.lax.stop_gradient(target) - jnp.dot(theta, s_tm1)) ** 2
    >>> theta = jnp.array([0.1, -0.1, 0.0])
    >>> s_tm1, s_t = jnp.array([[1.0, 2.0, -1.0]]), jnp.array([[2.0, 1.0, 0.0]])
    >>> r_t = jnp.array([1.0])
    >>> per_example_grads(td_loss, theta, s_tm1, r_t, s_t)  # (r + v(s_t) - v(s_tm1)) s_tm1
    Array([[ 1.2,  2.4, -1.2]], dtype=float32)
    >>> batch_loss = lambda w, batch: jnp.mean((batch[0] @ w - batch[1]) ** 2)
    >>> x, y = jnp.array([[1.0], [2.0]]), jnp.array([0.0, 0.0])
    >>> per_example_grads(batch_loss, jnp.array([1.0]), (x, y), batch_of_one=True)  # 2 x^2 w
    Array([[2.],
           [8.]], dtype=float32)
    """
    if in_axes is None:
        in_axes = (None,) + (0,) * len(args)
    elif not isinstance(in_axes, int):
        in_axes = tuple(in_axes)
        if len(in_axes) != 1 + len(args):
            raise ValueError(
                f"in_axes has {len(in_axes)} entries for {1 + len(args)} arguments "
                "(params and each batched argument)"
            )
    axes = (in_axes,) * (1 + len(args)) if isinstance(in_axes, int) else in_axes
    if not jax.tree_util.tree_leaves(axes):  # None leaves are no leaves: nothing is mapped
        if not args:
            raise ValueError(
                "per_example_grads: only params was given, so there are no examples to take "
                "gradients of: pass them after params, e.g. "
                "per_example_grads(loss_fn, params, x, y)"
            )
        raise ValueError(
            f"per_example_grads: in_axes={in_axes!r} maps no argument: give the axis of the "
            f"examples in each batched argument, e.g. in_axes={(None,) + (0,) * len(args)!r}"
        )

    if batch_of_one:

        def example_loss(p: PyTree, *example: PyTree) -> jax.Array:
            batched = [_add_batch_axis(ax, a) for ax, a in zip(axes[1:], example, strict=True)]
            return loss_fn(p, *batched)  # params are shared or per-example, never batched

    else:
        example_loss = loss_fn

    return jax.vmap(jax.grad(example_loss), in_axes=in_axes)(params, *args)


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
