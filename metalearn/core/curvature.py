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

PyTree = Any


def hvp(f: Callable[[PyTree], jax.Array], params: PyTree, v: PyTree) -> PyTree:
    """Hessian of scalar ``f`` at ``params`` times ``v``, forward-over-reverse.

    Computed as ``jvp(grad(f))``: the column-by-column construction of ``jacfwd(grad(f))``
    contracted with ``v``, without materialising the Hessian. Costs about one gradient.

    >>> import jax.numpy as jnp
    >>> f = lambda x: jnp.sum(x ** 3)          # Hessian: diag(6 x)
    >>> hvp(f, jnp.array([1.0, 2.0]), jnp.array([1.0, 1.0]))
    Array([ 6., 12.], dtype=float32)
    """
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
    """``alpha * x + y`` on pytrees."""
    return jax.tree_util.tree_map(lambda a, b: alpha * a + b, x, y)


class CGResult(NamedTuple):
    """Solution of a conjugate-gradient solve, its residual norm, the iterations taken, and the
    residual ``b - A x`` itself (as CG's recursion keeps it: ``x^T A x = x^T (b - residual)``
    needs no further product)."""

    x: PyTree
    residual_norm: jax.Array
    iterations: jax.Array
    residual: PyTree


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
    (the implicit-MAML system). Stops after ``max_iters`` iterations or once the residual norm
    falls below ``tol * |b|``. Runs as a ``lax.while_loop``, under ``jit`` and ``vmap``.

    >>> import jax.numpy as jnp
    >>> A = jnp.array([[4.0, 1.0], [1.0, 3.0]])
    >>> x = cg_solve(lambda v: A @ v, jnp.array([1.0, 2.0]), max_iters=2).x
    >>> [round(float(xi), 4) for xi in x]      # exact: [1/11, 7/11]
    [0.0909, 0.6364]
    """
    if not isinstance(max_iters, jax.core.Tracer) and (
        isinstance(max_iters, bool) or not isinstance(max_iters, (int, np.integer)) or max_iters < 1
    ):  # 0.0 returned x = 0 after no iteration; None failed inside the loop
        raise ValueError(f"cg_solve: max_iters must be an integer >= 1, got {max_iters!r}")
    for leaf in jax.tree_util.tree_leaves(b):
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
            raise ValueError(
                f"cg_solve: b must be floating point, got {jnp.result_type(leaf)} (convert it, "
                "e.g. b.astype(jnp.float32))"
            )
    if isinstance(tol, (int, float)) and not tol >= 0:  # tol**2 made a negative tol a large one
        raise ValueError(f"cg_solve: tol must be >= 0, got {tol}")
    if x0 is None:  # r = b - A 0 without spending a product on it
        x, r = jax.tree_util.tree_map(jnp.zeros_like, b), b
    else:
        x, r = x0, jax.tree_util.tree_map(jnp.subtract, b, matvec(x0))
    rr = _vdot(r, r)
    threshold = (tol**2) * _vdot(b, b)

    def cond(state):
        _, _, _, rr, i = state
        return (i < max_iters) & (rr > threshold)

    def body(state):
        x, r, p, rr, i = state
        ap = matvec(p)
        alpha = rr / _vdot(p, ap)
        x = _axpy(alpha, p, x)
        r = _axpy(-alpha, ap, r)
        rr_new = _vdot(r, r)
        p = _axpy(rr_new / rr, p, r)
        return x, r, p, rr_new, i + 1

    x, r, _, rr, iters = jax.lax.while_loop(cond, body, (x, r, r, rr, jnp.asarray(0)))
    return CGResult(x, jnp.sqrt(rr), iters, r)


def lanczos_eigenvalues(
    matvec: Callable[[jax.Array], jax.Array], v0: jax.Array, num_iters: int
) -> jax.Array:
    """Ritz values (ascending) of symmetric ``A`` from ``num_iters`` Lanczos steps on flat vectors.

    ``v0`` is the start vector (nonzero and finite; any direction not orthogonal to the
    eigenvectors sought). Uses full reorthogonalisation, so it is stable for the small
    ``num_iters`` (tens) that curvature diagnostics need. The extreme Ritz values converge
    first to the extreme eigenvalues of ``A``.

    >>> import jax, jax.numpy as jnp
    >>> A = jnp.diag(jnp.array([1.0, 2.0, 5.0]))
    >>> [round(float(e), 4) for e in lanczos_eigenvalues(lambda v: A @ v, jnp.ones(3), 3)]
    [1.0, 2.0, 5.0]
    """
    if isinstance(num_iters, bool) or not isinstance(num_iters, (int, np.integer)) or num_iters < 1:
        raise ValueError(f"num_iters must be an integer >= 1, got {num_iters!r}")
    if getattr(v0, "ndim", None) != 1 or not jnp.issubdtype(v0.dtype, jnp.floating):
        shown = f"shape {v0.shape}, {v0.dtype}" if hasattr(v0, "dtype") else type(v0).__name__
        raise ValueError(f"v0 must be a 1-D floating-point array (flat vectors), got {shown}")
    if not isinstance(v0, jax.core.Tracer):  # under jit a zero v0 gives NaN: it cannot be checked
        norm = float(np.linalg.norm(np.asarray(v0)))
        if not (np.isfinite(norm) and norm > 0):
            raise ValueError(f"v0 must be a finite, nonzero start vector, got norm {norm}")
    n = v0.shape[0]
    num_iters = min(int(num_iters), n)
    basis = jnp.zeros((num_iters, n), v0.dtype)
    v = v0 / jnp.linalg.norm(v0)

    def orthogonalised(basis, w):  # twice, against every basis vector so far (rows > i are 0)
        w = w - basis.T @ (basis @ w)
        return w - basis.T @ (basis @ w)

    def body(i, state):
        basis, alphas, betas, v = state
        basis = basis.at[i].set(v)
        av = matvec(v)
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
    flat, unravel = ravel_pytree(params)

    def flat_hvp(v: jax.Array) -> jax.Array:
        return ravel_pytree(hvp(f, params, unravel(v)))[0]

    v0 = jax.random.normal(key, flat.shape, flat.dtype)
    return lanczos_eigenvalues(flat_hvp, v0, num_iters)[-1]
