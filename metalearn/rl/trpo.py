"""TRPO's step (Schulman et al. 2015), as rllab's ``ConjugateGradientOptimizer`` takes it.

The natural-gradient direction solves ``(H + damping I) d = g`` by conjugate gradients, with
``H`` the Hessian of the mean KL divergence (metalearn's :func:`~metalearn.hvp`) and ``g`` the
surrogate's gradient; the step is scaled to the KL bound (``sqrt(2 max_kl / d^T H d)``) and
shrunk by a backtracking line search until the KL bound holds and the surrogate improves. If no
candidate passes, the parameters stay (rllab's ``accept_violation=False``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from metalearn.core.curvature import cg_solve, hvp

Params = Any


@dataclass(frozen=True)
class TRPOConfig:
    """rllab's defaults (Finn et al. use ``max_kl = 0.01``)."""

    max_kl: float = 0.01
    cg_iters: int = 10
    damping: float = 1e-5
    backtrack_ratio: float = 0.8
    max_backtracks: int = 15


class TRPOInfo(NamedTuple):
    """What the step did: surrogate before/after, KL of the accepted step, backtracks taken
    (``max_backtracks`` when nothing was accepted), the CG residual norm, and whether CG met a
    direction of non-positive curvature (the damped KL Hessian was not positive definite
    along its path; the step then goes along the iterate before it, zero at the first)."""

    surrogate_before: jax.Array
    surrogate_after: jax.Array
    kl: jax.Array
    backtracks: jax.Array
    accepted: jax.Array
    cg_residual: jax.Array
    cg_nonpositive_curvature: jax.Array


def _tree_dot(a: Params, b: Params) -> jax.Array:
    return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def fisher_vector_product(
    kl: Callable[[Params], jax.Array], params: Params, v: Params, damping: float = 0.0
) -> Params:
    """``(H_kl + damping I) v`` with ``H_kl`` the Hessian of ``kl`` at ``params``: the Fisher
    information times ``v`` when ``kl(p)`` is the mean KL from the policy at ``params`` to ``p``.

    >>> kl = lambda p: 0.5 * jnp.sum(p ** 2)
    >>> fisher_vector_product(kl, jnp.zeros(2), jnp.array([1.0, 2.0]))
    Array([1., 2.], dtype=float32)
    """
    hv = hvp(kl, params, v)
    return jax.tree.map(lambda h, x: h + damping * x, hv, v)


def trpo_step(
    surrogate: Callable[[Params], jax.Array],
    kl: Callable[[Params], jax.Array],
    params: Params,
    cfg: TRPOConfig = TRPOConfig(),
    kl_hvp: Callable[[Params], Params] | None = None,
    surrogate_value_and_grad: Callable[[Params], tuple[jax.Array, Params]] | None = None,
) -> tuple[Params, TRPOInfo]:
    """Maximise ``surrogate`` subject to ``kl(new) <= cfg.max_kl``; ``kl(params)`` must be 0.

    ``kl_hvp`` (optional) is ``v -> H_kl v`` at ``params`` in a cheaper form than
    :func:`metalearn.hvp` of ``kl`` (as :func:`metalearn.rl.estimators.post_kl_fisher`);
    ``surrogate_value_and_grad`` (optional) is ``jax.value_and_grad(surrogate)`` in a cheaper
    form (as :func:`metalearn.rl.maml_rl.surrogate_value_and_grad`).

    >>> import jax.numpy as jnp
    >>> surrogate = lambda p: -jnp.sum((p - 1.0) ** 2)
    >>> kl = lambda p: 0.5 * jnp.sum(p ** 2)
    >>> new, info = trpo_step(surrogate, kl, jnp.zeros(2))
    >>> bool(info.accepted), bool(info.kl <= 0.01 + 1e-6), bool(info.surrogate_after > -2.0)
    (True, True, True)
    """
    before, grads = (surrogate_value_and_grad or jax.value_and_grad(surrogate))(params)

    def fvp(v: Params) -> Params:
        if kl_hvp is None:
            return fisher_vector_product(kl, params, v, cfg.damping)
        return jax.tree.map(lambda h, x: h + cfg.damping * x, kl_hvp(v), v)

    solve = cg_solve(fvp, grads, max_iters=cfg.cg_iters, tol=1e-10)
    direction = solve.x
    # d^T A d as d^T (g - r): CG keeps its residual r = g - A d, so no further product is needed
    curvature = _tree_dot(direction, jax.tree.map(jnp.subtract, grads, solve.residual))
    scale = jnp.sqrt(2.0 * cfg.max_kl / (curvature + 1e-8))

    def candidate(k: jax.Array) -> Params:
        factor = scale * cfg.backtrack_ratio ** k.astype(jnp.float32)
        return jax.tree.map(lambda p, d: p + factor * d, params, direction)

    def evaluate(k: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        new = candidate(k)
        value, divergence = surrogate(new), kl(new)
        return value, divergence, (value > before) & (divergence <= cfg.max_kl)

    def cond(state):
        k, _, _, ok = state
        return (~ok) & (k < cfg.max_backtracks)

    def body(state):
        k = state[0] + 1
        return (k, *evaluate(k))

    start = jnp.asarray(0)
    k, value, divergence, ok = jax.lax.while_loop(cond, body, (start, *evaluate(start)))
    new_params = jax.tree.map(lambda n, p: jnp.where(ok, n, p), candidate(k), params)
    info = TRPOInfo(
        surrogate_before=before,
        surrogate_after=jnp.where(ok, value, before),
        kl=jnp.where(ok, divergence, 0.0),
        backtracks=k,
        accepted=ok,
        cg_residual=solve.residual_norm,
        cg_nonpositive_curvature=solve.nonpositive_curvature,
    )
    return new_params, info
