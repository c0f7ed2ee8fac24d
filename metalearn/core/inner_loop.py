"""Differentiable inner-loop adaptation and the MAML meta-loss.

The only model boundary is ``loss_fn(params, batch) -> scalar``: ``params`` is any pytree
(nested dicts, Flax params) and ``batch`` any pytree, e.g. ``(x, y)``. Nothing here knows
about Flax modules, data or configs.

The inner loop is straight-line code or a ``jax.lax.scan`` over ``num_steps`` inner updates.
By default it is straight-line up to :data:`FULL_UNROLL_MAX_STEPS` steps (``unroll=True``, a
Python loop: the gradient of a meta-batch's mean loss then reaches the shared meta-parameters
outside any loop body, and XLA merges the tasks' products with them into larger ones, where a
fully unrolled scan kept one per task; experiments/benchmarks/README.md, section S) and a
rolled scan beyond: an unrolled loop's compile time grows faster than its length (on 2 CPU
cores, a sinusoid MLP's meta-gradient compiled in 15 s at 50 steps and 220 s at 200, against
0.6 s rolled, and ran slower too; experiments/benchmarks/README.md). Pass ``unroll`` to choose
(``True``, or ``k`` steps per iteration). ``remat=True`` recomputes each step's activations in
the backward pass instead of storing them (``jax.checkpoint``), trading compute for memory; it
implies a rolled loop (``unroll=1``) unless ``unroll`` is given, because XLA keeps the buffers
of an unrolled loop alive anyway (measured in experiments/benchmarks/: with a rolled loop, peak
memory stays flat in ``num_steps``; unrolled, remat saves nothing).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metalearn.core.checks import check_count

PyTree = Any
LossFn = Callable[[PyTree, PyTree], jax.Array]

# The longest inner loop that ``unroll=None`` unrolls fully; a longer one is a rolled loop.
# Measured on 2 CPU cores (experiments/benchmarks/README.md, section 4): unrolled was ~10%
# faster at 5-10 steps on sinusoid and no faster at 20; on Omniglot no faster at 5 and ~10%
# slower at 10; its compile time grew with the steps, the rolled loop's did not.
FULL_UNROLL_MAX_STEPS = 10


def _check_finite_rate(inner_lr: float | PyTree | None) -> None:
    """Refuse a NaN or infinite ``inner_lr`` given as a number or a concrete array (a traced one,
    e.g. Meta-SGD's learned rates under ``jit``, cannot be checked and is not)."""
    for leaf in jax.tree_util.tree_leaves(inner_lr):
        if isinstance(leaf, jax.core.Tracer):
            continue
        if isinstance(leaf, str) or not np.issubdtype(np.asarray(leaf).dtype, np.number):
            raise ValueError(f"inner_lr must be a number or an array of numbers, got {leaf!r}")
        if not np.all(np.isfinite(np.asarray(leaf))):  # numpy: jnp would trace under jit
            raise ValueError(f"inner_lr must be finite, got {leaf!r}")


def _check_rate_shapes(params: PyTree, inner_lr: float | PyTree | None) -> None:
    """Each rate is a scalar or has its parameter's shape: one array of rates for every leaf
    (one rate per layer, meant as a tree) was broadcast against each parameter silently."""
    if inner_lr is None:
        return
    if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(inner_lr)):
        shape = np.shape(inner_lr)
        param_shapes = [np.shape(p) for p in jax.tree_util.tree_leaves(params)]
        if shape != () and param_shapes != [shape]:
            raise ValueError(
                f"inner_lr of shape {shape} for parameters of shapes {param_shapes}: give one "
                "number, or a pytree like params whose leaves are numbers or of their "
                "parameter's shape (one rate per layer: a tree, not an array)"
            )
        return
    params_def = jax.tree_util.tree_structure(params)
    lr_def = jax.tree_util.tree_structure(inner_lr)
    if params_def != lr_def:
        raise ValueError(
            "a per-parameter inner_lr must have the same tree structure as params; "
            f"params: {params_def}, inner_lr: {lr_def}"
        )
    for path, p, lr in zip(
        jax.tree_util.tree_flatten_with_path(params)[0],
        jax.tree_util.tree_leaves(params),
        jax.tree_util.tree_leaves(inner_lr),
        strict=True,
    ):
        if np.shape(lr) not in ((), np.shape(p)):
            raise ValueError(
                f"inner_lr{jax.tree_util.keystr(path[0])} has shape {np.shape(lr)}, its "
                f"parameter {np.shape(p)}: give a number or an array of the parameter's shape"
            )


def _sgd_update(params: PyTree, grads: PyTree, inner_lr: float | PyTree) -> PyTree:
    """``params - inner_lr * grads``, with ``inner_lr`` a scalar or a pytree like ``params``;
    each parameter keeps its dtype (a float64 rate for float32 parameters under
    ``jax_enable_x64`` would change the loop's carry)."""

    def update(p, g, lr):
        new = p - lr * g
        return new if new.dtype == jnp.result_type(p) else new.astype(jnp.result_type(p))

    if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(inner_lr)):
        return jax.tree_util.tree_map(lambda p, g: update(p, g, inner_lr), params, grads)
    return jax.tree_util.tree_map(update, params, grads, inner_lr)


def inner_adam(
    learning_rate: float,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 1e-8,
) -> optax.GradientTransformation:
    """Adam that is safe to differentiate through, for use as ``adapt(..., optimizer=...)``.

    ``optax.adam`` defaults to ``eps_root=0``; then the second derivative of its update is
    NaN wherever a gradient entry is exactly zero (``sqrt`` at 0). A positive ``eps_root``
    (the default here) keeps the meta-gradient finite.

    >>> import jax, jax.numpy as jnp
    >>> loss = lambda w, b: jnp.sum((w * b) ** 2)
    >>> meta_grad = jax.grad(lambda w: maml_loss(
    ...     loss, w, jnp.array([1.0, 0.0]), jnp.array([1.0, 1.0]),
    ...     optimizer=inner_adam(0.1), num_steps=2))
    >>> bool(jnp.all(jnp.isfinite(meta_grad(jnp.array([1.0, 2.0])))))
    True
    """
    if not callable(learning_rate) and not (  # a schedule, or a finite number
        isinstance(learning_rate, numbers.Real) and math.isfinite(learning_rate)
    ):
        raise ValueError(f"inner_adam: learning_rate must be finite, got {learning_rate!r}")
    if not (eps_root > 0 and math.isfinite(eps_root)):
        raise ValueError(f"eps_root must be > 0 for a differentiable inner Adam, got {eps_root}")
    return optax.adam(learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root)


def _inner_step_fn(
    loss_fn: LossFn,
    support: PyTree,
    inner_lr: float | PyTree | None,
    optimizer: optax.GradientTransformation | None,
    first_order: bool,
) -> Callable[[tuple[PyTree, PyTree]], tuple[PyTree, PyTree]]:
    """One inner update ``(params, opt_state) -> (params, opt_state)``."""
    grad_fn = jax.grad(loss_fn)

    def step(carry: tuple[PyTree, PyTree]) -> tuple[PyTree, PyTree]:
        params, opt_state = carry
        grads = grad_fn(params, support)
        if first_order:
            grads = jax.lax.stop_gradient(grads)
        if optimizer is None:
            return _sgd_update(params, grads, inner_lr), opt_state
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return step


def _run_inner_loop(
    loss_fn: LossFn,
    params: PyTree,
    support: PyTree,
    *,
    inner_lr: float | PyTree | None,
    num_steps: int,
    first_order: bool,
    optimizer: optax.GradientTransformation | None,
    unroll: int | bool | None,
    remat: bool,
    keep_trajectory: bool,
) -> tuple[PyTree, PyTree | None]:
    num_steps = check_count("num_steps", num_steps)
    if unroll is None:
        unroll = 1 if remat or num_steps > FULL_UNROLL_MAX_STEPS else True
    if (inner_lr is None) == (optimizer is None):
        raise ValueError(
            "pass exactly one of inner_lr (plain SGD) or optimizer (an optax transform)"
        )
    if optimizer is not None and not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        raise ValueError(
            f"optimizer must be an optax GradientTransformation (inner_adam(0.1), "
            f"optax.sgd(0.1)), got {optimizer!r}; for plain SGD pass inner_lr instead"
        )
    _check_finite_rate(inner_lr)
    _check_rate_shapes(params, inner_lr)
    step = _inner_step_fn(loss_fn, support, inner_lr, optimizer, first_order)
    if remat:
        step = jax.checkpoint(step)

    def body(carry, _):
        new_carry = step(carry)
        return new_carry, (new_carry[0] if keep_trajectory else None)

    opt_state = optimizer.init(params) if optimizer is not None else None
    if unroll is True:  # straight-line code (the module docstring says why not a scan)
        carry, trajectory = (params, opt_state), []
        for _ in range(num_steps):
            carry = step(carry)
            trajectory.append(carry[0])
        if not keep_trajectory:
            return carry[0], None
        return carry[0], jax.tree_util.tree_map(lambda *steps: jnp.stack(steps), *trajectory)
    (adapted, _), trajectory = jax.lax.scan(
        body, (params, opt_state), None, length=num_steps, unroll=unroll
    )
    return adapted, trajectory


def adapt(
    loss_fn: LossFn,
    params: PyTree,
    support: PyTree,
    *,
    inner_lr: float | PyTree | None = None,
    num_steps: int = 1,
    first_order: bool = False,
    optimizer: optax.GradientTransformation | None = None,
    unroll: int | bool | None = None,
    remat: bool = False,
) -> PyTree:
    """Adapt ``params`` to ``support`` with ``num_steps`` differentiable inner steps.

    With ``inner_lr`` each step is plain SGD, ``params - inner_lr * grad``; ``inner_lr`` is a
    scalar or a pytree shaped like ``params`` (per-parameter rates, as in Meta-SGD). With
    ``optimizer`` (any optax ``GradientTransformation``, e.g. :func:`inner_adam`) each step
    applies its update instead. Exactly one of the two is given. A rate given as a number or a
    concrete array must be finite (ValueError); a negative one is taken as it is, an ascent step.

    ``first_order=True`` stops gradients through the inner gradients (first-order MAML).
    ``unroll``: ``True`` straight-line steps, ``k`` a ``lax.scan`` of ``k`` steps per iteration
    (default: ``True`` up to :data:`FULL_UNROLL_MAX_STEPS` steps, ``1`` beyond them or with
    ``remat=True``); ``remat``
    recomputes each step's activations in the backward pass (see the module docstring).

    >>> import jax.numpy as jnp
    >>> loss = lambda w, b: 0.5 * jnp.sum((w - b) ** 2)
    >>> adapt(loss, jnp.array(0.0), jnp.array(1.0), inner_lr=0.5, num_steps=2)
    Array(0.75, dtype=float32, weak_type=True)
    """
    adapted, _ = _run_inner_loop(
        loss_fn,
        params,
        support,
        inner_lr=inner_lr,
        num_steps=num_steps,
        first_order=first_order,
        optimizer=optimizer,
        unroll=unroll,
        remat=remat,
        keep_trajectory=False,
    )
    return adapted


def adapt_trajectory(
    loss_fn: LossFn,
    params: PyTree,
    support: PyTree,
    *,
    inner_lr: float | PyTree | None = None,
    num_steps: int = 1,
    first_order: bool = False,
    optimizer: optax.GradientTransformation | None = None,
    unroll: int | bool | None = None,
    remat: bool = False,
) -> PyTree:
    """Like :func:`adapt`, but return the parameters after every step, stacked.

    Leaf ``i`` of the result has a leading axis of length ``num_steps + 1``: index 0 holds the
    initial parameters and index ``k`` the parameters after ``k`` inner steps. Useful for
    evaluating after several step counts at once and for multi-step losses (MAML++).

    >>> import jax.numpy as jnp
    >>> loss = lambda w, b: 0.5 * jnp.sum((w - b) ** 2)
    >>> adapt_trajectory(loss, jnp.array(0.0), jnp.array(1.0), inner_lr=0.5, num_steps=2)
    Array([0.  , 0.5 , 0.75], dtype=float32)
    """
    _, trajectory = _run_inner_loop(
        loss_fn,
        params,
        support,
        inner_lr=inner_lr,
        num_steps=num_steps,
        first_order=first_order,
        optimizer=optimizer,
        unroll=unroll,
        remat=remat,
        keep_trajectory=True,
    )
    return jax.tree_util.tree_map(
        lambda p0, ps: jnp.concatenate([jnp.asarray(p0, ps.dtype)[None], ps]), params, trajectory
    )


def maml_loss(
    loss_fn: LossFn,
    params: PyTree,
    support: PyTree,
    query: PyTree,
    *,
    inner_lr: float | PyTree | None = None,
    num_steps: int = 1,
    first_order: bool = False,
    optimizer: optax.GradientTransformation | None = None,
    unroll: int | bool | None = None,
    remat: bool = False,
) -> jax.Array:
    """The MAML meta-loss: ``loss_fn(adapt(loss_fn, params, support, ...), query)``.

    ``jax.grad`` of it with respect to ``params`` (or to a per-parameter ``inner_lr``) is the
    MAML meta-gradient; with ``first_order=True`` it is the first-order approximation (FOMAML).
    Keyword arguments are those of :func:`adapt`.

    >>> import jax, jax.numpy as jnp
    >>> loss = lambda w, b: 0.5 * jnp.sum((w - b) ** 2)
    >>> # adapted w' = w + 0.5 (1 - w); query loss 0.5 (w' - 3)^2; d/dw = (w' - 3) * 0.5
    >>> jax.grad(lambda w: maml_loss(loss, w, 1.0, 3.0, inner_lr=0.5))(0.0)
    Array(-1.25, dtype=float32, weak_type=True)
    """
    adapted = adapt(
        loss_fn,
        params,
        support,
        inner_lr=inner_lr,
        num_steps=num_steps,
        first_order=first_order,
        optimizer=optimizer,
        unroll=unroll,
        remat=remat,
    )
    return loss_fn(adapted, query)
