"""Second-order tools on pytrees: Hessian-vector products, Hessians, CG solves, top eigenvalue.

All of them work on arbitrary parameter pytrees and compose with ``jit`` and ``vmap``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from metalearn.core.checks import check_count

PyTree = Any


def _check_differentiable(fn: str, params: PyTree) -> None:
    """Refuse ``params`` with a leaf that is not floating point: gradients need float params."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        dtype = jnp.result_type(leaf)
        if not jnp.issubdtype(dtype, jnp.inexact):
            where = f" at params{jax.tree_util.keystr(path)}" if path else ""
            raise ValueError(
                f"{fn}: params must be floating point to be differentiated, got {dtype}{where} "
                "(convert it, e.g. with .astype(jnp.float32))"
            )


def _fit(fn: str, tree: PyTree, name: str, like: PyTree, like_name: str) -> PyTree:
    """``tree`` with the leaf dtypes of ``like``, refused unless it has its structure and shapes.

    A float64 ``tree`` for float32 ``like`` is rounded to float32 and a float32 one widened:
    the computation keeps the precision of ``like``, which is where its result lives.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    like_leaves, like_treedef = jax.tree_util.tree_flatten_with_path(like)
    if treedef != like_treedef:
        raise ValueError(
            f"{fn}: {name} must have the structure of {like_name}, {like_treedef}, got {treedef}"
        )
    fitted = []
    for leaf, (path, like_leaf) in zip(leaves, like_leaves, strict=True):
        where = jax.tree_util.keystr(path)
        if np.shape(leaf) != np.shape(like_leaf):
            raise ValueError(
                f"{fn}: {name}{where} has shape {np.shape(leaf)} where {like_name}{where} has "
                f"{np.shape(like_leaf)}"
            )
        dtype, like_dtype = jnp.result_type(leaf), jnp.result_type(like_leaf)
        real = jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating)
        if not (real or jnp.issubdtype(like_dtype, jnp.complexfloating)):
            raise ValueError(
                f"{fn}: {name}{where} must be real numbers, got {dtype} ({like_name}{where} is "
                f"{like_dtype})"
            )
        fitted.append(jnp.asarray(leaf).astype(like_dtype))
    return jax.tree_util.tree_unflatten(treedef, fitted)


def hvp(f: Callable[[PyTree], jax.Array], params: PyTree, v: PyTree) -> PyTree:
    """Hessian of scalar ``f`` at ``params`` times ``v``, forward-over-reverse.

    Computed as ``jvp(grad(f))``: the column-by-column construction of ``jacfwd(grad(f))``
    contracted with ``v``, without materialising the Hessian. Costs about one gradient.
    ``v`` has the structure and shapes of ``params`` and is taken in their dtypes (a float64
    ``v`` for float32 ``params`` is rounded), so the product has the dtypes of ``params``.

    >>> import jax.numpy as jnp
    >>> f = lambda x: jnp.sum(x ** 3)          # Hessian: diag(6 x)
    >>> hvp(f, jnp.array([1.0, 2.0]), jnp.array([1.0, 1.0]))
    Array([ 6., 12.], dtype=float32)
    """
    _check_differentiable("hvp", params)
    v = _fit("hvp", v, "v", params, "params")
    return jax.jvp(jax.grad(f), (params,), (v,))[1]


def hessian(f: Callable[[PyTree], jax.Array]) -> Callable[[PyTree], PyTree]:
    """The full Hessian of scalar ``f``, ``jacfwd(grad(f))``: for small problems only.

    >>> import jax.numpy as jnp
    >>> hessian(lambda x: x @ x)(jnp.array([1.0, 2.0]))
    Array([[2., 0.],
           [0., 2.]], dtype=float32)
    """
    return jax.jacfwd(jax.grad(f))


def _vdot(a: PyTree, b: PyTree) -> jax.Array:
    leaves = jax.tree_util.tree_map(lambda x, y: jnp.vdot(x, y), a, b)
    return sum(jax.tree_util.tree_leaves(leaves))


def _axpy(alpha: jax.Array, x: PyTree, y: PyTree) -> PyTree:
    """``alpha * x + y`` on pytrees, each leaf in its own dtype (``alpha`` may be wider)."""
    return jax.tree_util.tree_map(lambda a, b: alpha.astype(a.dtype) * a + b, x, y)


class CGResult(NamedTuple):
    """Solution of a conjugate-gradient solve, its residual norm, the iterations taken, and the
    residual ``b - A x`` itself (as CG's recursion keeps it: ``x^T A x = x^T (b - residual)``
    needs no further product).

    ``nonpositive_curvature`` is True when the solve stopped at a direction ``p`` with
    ``p^T A p <= 0`` (to rounding): ``A`` is not positive definite there (singular or
    indefinite). ``x`` is then the last iterate before that direction, and the residual norm
    says how far it is from solving the system."""

    x: PyTree
    residual_norm: jax.Array
    iterations: jax.Array
    residual: PyTree
    nonpositive_curvature: jax.Array


def _check_tol(tol: float | jax.Array) -> None:
    """One real number ``>= 0`` (a traced one, under ``jit``, cannot be checked and is not)."""
    if isinstance(tol, jax.core.Tracer):
        return
    numeric = isinstance(tol, (int, float, np.generic, np.ndarray, jax.Array))
    value = np.asarray(tol) if numeric else None
    if value is not None and value.ndim:
        raise ValueError(
            f"cg_solve: tol must be one number >= 0, got an array of shape {value.shape}"
        )
    real = value is not None and (
        np.issubdtype(value.dtype, np.integer) or np.issubdtype(value.dtype, np.floating)
    )
    if not real:  # a string, None, a bool or a complex number
        raise ValueError(f"cg_solve: tol must be one number >= 0, got {tol!r}")
    if not value >= 0:  # tol**2 made a negative tol a large one: x = 0 after no iteration
        raise ValueError(f"cg_solve: tol must be >= 0, got {value.item()!r}")


def cg_solve(
    matvec: Callable[[PyTree], PyTree],
    b: PyTree,
    *,
    x0: PyTree | None = None,
    max_iters: int = 20,
    tol: float = 1e-6,
) -> CGResult:
    """Solve ``A x = b`` for symmetric positive-definite ``A`` given only ``matvec(v) = A v``.

    ``b`` and ``x`` are pytrees, so ``A`` can be e.g. ``v -> v + hvp(f, params, v) / lam``
    (the implicit-MAML system). Stops after ``max_iters`` iterations, once the residual norm
    falls below ``tol * |b|``, or at a direction ``p`` along which ``A`` is not positive
    definite (``p^T A p <= 0``, ``CGResult.nonpositive_curvature``), returning the iterate
    before it: a finite ``x`` for finite inputs, never NaN. The solve runs in the dtypes of
    ``b``: ``matvec``'s results and ``x0`` are taken in them. Runs as a ``lax.while_loop``,
    under ``jit`` and ``vmap``.

    >>> import jax.numpy as jnp
    >>> A = jnp.array([[4.0, 1.0], [1.0, 3.0]])
    >>> x = cg_solve(lambda v: A @ v, jnp.array([1.0, 2.0]), max_iters=2).x
    >>> [round(float(xi), 4) for xi in x]      # exact: [1/11, 7/11]
    [0.0909, 0.6364]
    """
    if not isinstance(max_iters, jax.core.Tracer):  # 0.0 returned x = 0 after no iteration
        check_count("cg_solve: max_iters", max_iters)
    for leaf in jax.tree_util.tree_leaves(b):
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
            raise ValueError(
                f"cg_solve: b must be floating point, got {jnp.result_type(leaf)} (convert it, "
                "e.g. b.astype(jnp.float32))"
            )
    _check_tol(tol)
    b = jax.tree_util.tree_map(jnp.asarray, b)

    def product(v: PyTree) -> PyTree:  # A v in the dtypes of b, whatever matvec returns
        return _fit("cg_solve", matvec(v), "matvec(v)", b, "b")

    if x0 is None:  # r = b - A 0 without spending a product on it
        x, r = jax.tree_util.tree_map(jnp.zeros_like, b), b
    else:
        x = _fit("cg_solve", x0, "x0", b, "b")
        r = jax.tree_util.tree_map(jnp.subtract, b, product(x))
    rr = _vdot(r, r)
    threshold = (tol**2) * _vdot(b, b)
    # A cosine between p and A p below the rounding level of b's least precise leaf means
    # p^T A p <= 0 for all the arithmetic can tell.
    eps = max(float(jnp.finfo(leaf.dtype).eps) for leaf in jax.tree_util.tree_leaves(b))

    def cond(state):
        _, _, _, rr, i, stopped = state
        return (i < max_iters) & (rr > threshold) & ~stopped

    def body(state):
        x, r, p, rr, i, _ = state
        ap = product(p)
        pap = _vdot(p, ap)
        # Positive definite A has p^T A p > 0. Otherwise stop before dividing by it (NaN or
        # infinities at 0, a step up the quadratic below 0). Every step taken then has positive
        # curvature, so from x0 = 0 the x returned has x^T A x > 0 (up to rounding): TRPO
        # divides by its square root.
        curved = jnp.real(pap) > eps * jnp.sqrt(jnp.real(_vdot(p, p))) * jnp.sqrt(
            jnp.real(_vdot(ap, ap))
        )
        alpha = jnp.where(curved, rr / jnp.where(curved, pap, 1), 0)
        x = _axpy(alpha, p, x)
        r = _axpy(-alpha, ap, r)
        rr_new = _vdot(r, r)
        p = _axpy(rr_new / rr, p, r)
        return x, r, p, rr_new, i + curved.astype(i.dtype), ~curved

    start = (x, r, r, rr, jnp.asarray(0), jnp.asarray(False))
    x, r, _, rr, iters, stopped = jax.lax.while_loop(cond, body, start)
    return CGResult(x, jnp.sqrt(rr), iters, r, stopped)


def lanczos_eigenvalues(
    matvec: Callable[[jax.Array], jax.Array], v0: jax.Array, num_iters: int
) -> jax.Array:
    """Ritz values (ascending) of symmetric ``A`` from ``num_iters`` Lanczos steps on flat vectors.

    ``v0`` is the start vector (nonzero and finite; any direction not orthogonal to the
    eigenvectors sought); the iteration runs in its dtype, whatever ``matvec`` returns. Uses
    full reorthogonalisation, so it is stable for the small ``num_iters`` (tens) that curvature
    diagnostics need. The extreme Ritz values converge first to the extreme eigenvalues of
    ``A``.

    >>> import jax, jax.numpy as jnp
    >>> A = jnp.diag(jnp.array([1.0, 2.0, 5.0]))
    >>> [round(float(e), 4) for e in lanczos_eigenvalues(lambda v: A @ v, jnp.ones(3), 3)]
    [1.0, 2.0, 5.0]
    """
    num_iters = check_count("num_iters", num_iters)
    if getattr(v0, "ndim", None) != 1 or not jnp.issubdtype(v0.dtype, jnp.floating):
        shown = f"shape {v0.shape}, {v0.dtype}" if hasattr(v0, "dtype") else type(v0).__name__
        raise ValueError(f"v0 must be a 1-D floating-point array (flat vectors), got {shown}")
    if not isinstance(v0, jax.core.Tracer):  # under jit a zero v0 gives NaN: it cannot be checked
        norm = float(np.linalg.norm(np.asarray(v0)))
        if not (np.isfinite(norm) and norm > 0):
            raise ValueError(f"v0 must be a finite, nonzero start vector, got norm {norm}")
    n = v0.shape[0]
    num_iters = min(num_iters, n)
    basis = jnp.zeros((num_iters, n), v0.dtype)
    v = v0 / jnp.linalg.norm(v0)

    def orthogonalised(basis, w):  # twice, against every basis vector so far (rows > i are 0)
        w = w - basis.T @ (basis @ w)
        return w - basis.T @ (basis @ w)

    def body(i, state):
        basis, alphas, betas, v = state
        basis = basis.at[i].set(v)
        av = _fit("lanczos_eigenvalues", matvec(v), "matvec(v)", v, "v0")  # in v0's dtype
        alpha = jnp.vdot(v, av)
        w = orthogonalised(basis, av)
        beta = jnp.linalg.norm(w)
        # Breakdown: the basis spans an invariant subspace, whose Ritz values are exact. Going on
        # with zero vectors would add spurious zero eigenvalues; instead start again from a new
        # direction orthogonal to the basis, with zero coupling (A keeps the orthogonal
        # complement of an invariant subspace invariant), so every value is one of V^T A V.
        broke_down = beta <= 10 * jnp.finfo(v0.dtype).eps * jnp.linalg.norm(av)
        fresh = orthogonalised(basis, jax.random.normal(jax.random.key(i), (n,), v0.dtype))
        fresh = fresh / jnp.maximum(jnp.linalg.norm(fresh), 1e-30)
        v_next = jnp.where(broke_down, fresh, w / jnp.maximum(beta, 1e-30))
        beta = jnp.where(broke_down, 0.0, beta)
        return basis, alphas.at[i].set(alpha), betas.at[i].set(beta), v_next

    alphas = jnp.zeros(num_iters, v0.dtype)
    betas = jnp.zeros(num_iters, v0.dtype)
    _, alphas, betas, _ = jax.lax.fori_loop(0, num_iters, body, (basis, alphas, betas, v))
    tridiagonal = jnp.diag(alphas) + jnp.diag(betas[:-1], 1) + jnp.diag(betas[:-1], -1)
    return jnp.linalg.eigvalsh(tridiagonal)


def top_hessian_eigenvalue(
    f: Callable[[PyTree], jax.Array],
    params: PyTree,
    key: jax.Array,
    *,
    num_iters: int = 20,
) -> jax.Array:
    """Largest (algebraic) eigenvalue of the Hessian of scalar ``f`` at ``params``, by Lanczos.

    Only Hessian-vector products are used (:func:`hvp`), so it scales to network-sized
    parameter pytrees: a sharpness diagnostic for the meta-loss landscape.

    >>> import jax, jax.numpy as jnp
    >>> f = lambda p: 0.5 * (3.0 * p["a"] ** 2 + 7.0 * p["b"] ** 2)
    >>> params = {"a": jnp.array(1.0), "b": jnp.array(-1.0)}
    >>> round(float(top_hessian_eigenvalue(f, params, jax.random.key(0), num_iters=2)), 4)
    7.0
    """
    _check_differentiable("top_hessian_eigenvalue", params)
    flat, unravel = ravel_pytree(params)

    def flat_hvp(v: jax.Array) -> jax.Array:
        return ravel_pytree(hvp(f, params, unravel(v)))[0]

    v0 = jax.random.normal(key, flat.shape, flat.dtype)
    return lanczos_eigenvalues(flat_hvp, v0, num_iters)[-1]
