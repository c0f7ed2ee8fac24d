"""Where metalearn's MAML-RL meta-iteration spends its time (``bench_rl.py --profile``).

Each part of :func:`metalearn.rl.maml_rl.make_meta_iteration` is jitted on its own from the
library's functions and timed (median of 3 calls after one warm-up): sampling every task's
rollouts and inner step (``collect_task_batch`` under ``vmap``), the meta-gradient, one
Fisher-vector product of the mean post-update KL (as ``metalearn.hvp`` of the KL through the
inner step, and in the Gauss-Newton form the iteration uses), the whole CG solve, one line-search
evaluation (surrogate and KL at a candidate), and the whole TRPO step.

:func:`compute_floor` bounds the meta-iteration from below: XLA's FLOP count of the meta-gradient,
the Fisher-vector products' linearisation, ``cg_iters`` products and one line-search
evaluation (sampling left out), over the best rate this machine reaches on the policy's
largest matrix product ([40,000 x 100] @ [100 x 100], timed here): the least time this
arithmetic takes on this machine, whoever runs it.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp

from metalearn.core.curvature import cg_solve
from metalearn.rl.envs import NAV2D
from metalearn.rl.estimators import post_kl_fisher
from metalearn.rl.maml_rl import (
    collect_meta_batch,
    outer_update,
    surrogate_value_and_grad,
    trpo_objectives,
)
from metalearn.rl.policy import policy_apply
from metalearn.rl.trpo import fisher_vector_product


def _median_ms(fn, *args) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(3):
        tic = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - tic)
    return 1e3 * statistics.median(times)


def _gflop(fn, *args) -> float:
    """XLA's FLOP count of ``jit(fn)(*args)``, in billions (``fn`` has no loops: XLA counts a
    loop's body once)."""
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return cost["flops"] / 1e9


def peak_gflops(rows: int = 40_000, width: int = 100, repeat: int = 20) -> float:
    """The best rate of ``[rows, width] @ [width, width]`` in float32 on this machine, GFLOP/s."""
    x = jax.random.normal(jax.random.key(0), (rows, width))
    w = jax.random.normal(jax.random.key(1), (width, width))
    product = jax.jit(lambda x, w: x @ w)
    jax.block_until_ready(product(x, w))
    best = float("inf")
    for _ in range(repeat):
        tic = time.perf_counter()
        jax.block_until_ready(product(x, w))
        best = min(best, time.perf_counter() - tic)
    return 2 * rows * width * width / best / 1e9


def compute_floor(params: Any, key: jax.Array, cfg) -> dict[str, float]:
    """GFLOP of the meta-iteration's parts at ``params`` and the time they need at
    :func:`peak_gflops`."""
    # XLA counts a loop's body once: count the program with the tasks under vmap
    cfg = dataclasses.replace(cfg, task_batching="vmap")
    inner, est, strategy = cfg.inner, cfg.estimator, cfg.strategy
    batch = _collector(cfg)(params, key)
    objectives = functools.partial(trpo_objectives, policy_apply, cfg)  # batch -> (surr., kl)
    v = jax.tree.map(jnp.ones_like, params)

    def products(count):  # linearise once, then `count` Fisher-vector products, unrolled
        def run(params, batch, v):
            fisher = post_kl_fisher(policy_apply, params, batch, inner, est, strategy)
            for _ in range(count):
                v = fisher(v)
            return v

        return run

    one, two = (_gflop(products(n), params, batch, v) for n in (1, 2))
    parts = {
        "meta-gradient": _gflop(lambda p, b: jax.grad(objectives(b)[0])(p), params, batch),
        "linearisation": 2 * one - two,
        "one FVP": two - one,
        "one line-search evaluation": _gflop(_line_search_evaluation(objectives), params, batch),
    }
    total = (
        parts["meta-gradient"]
        + parts["linearisation"]
        + cfg.trpo.cg_iters * parts["one FVP"]
        + parts["one line-search evaluation"]
    )
    peak = peak_gflops()
    return {
        **{f"{name} (GFLOP)": value for name, value in parts.items()},
        f"meta-gradient + TRPO step with {cfg.trpo.cg_iters} FVPs (GFLOP)": total,
        "best matrix-product rate (GFLOP/s)": peak,
        "floor: that work at that rate (ms)": 1e3 * total / peak,
    }


def _line_search_evaluation(objectives):
    """``(params, batch) -> (surrogate, kl)`` at ``params``: what one backtracking step computes."""

    def evaluate(params, batch):
        surrogate, kl = objectives(batch)
        return surrogate(params), kl(params)

    return evaluate


def _collector(cfg):
    """Jitted ``(params, key) -> batch``: every task's rollouts and inner step, as the
    meta-iteration samples them (:func:`metalearn.rl.maml_rl.collect_meta_batch`)."""

    def collect(params, key):
        tasks = NAV2D.sample_tasks(key, cfg.num_tasks)
        keys = jax.random.split(key, cfg.num_tasks)
        return collect_meta_batch(NAV2D, policy_apply, cfg, params, keys, tasks)

    return jax.jit(collect)


def profile_metalearn(params: Any, key: jax.Array, cfg) -> dict[str, float]:
    """Milliseconds of each jitted part of one meta-iteration at ``params``, the tasks batched
    as ``cfg.task_batching`` says."""
    inner, est, strategy = cfg.inner, cfg.estimator, cfg.strategy
    collect = _collector(cfg)

    objectives = functools.partial(trpo_objectives, policy_apply, cfg)  # batch -> (surr., kl)

    def grad(params, batch):  # as the meta-iteration takes it: each task's gradient, averaged
        return surrogate_value_and_grad(policy_apply, cfg, batch)(params)[1]

    def fvp_hvp(params, batch, v):  # metalearn.hvp of the KL, through the inner step
        return fisher_vector_product(objectives(batch)[1], params, v, cfg.trpo.damping)

    def fvp_gn(params, batch, v):  # J^T F J, what make_meta_iteration uses
        return post_kl_fisher(policy_apply, params, batch, inner, est, strategy)(v)

    def cg(params, batch, g):
        fisher = post_kl_fisher(policy_apply, params, batch, inner, est, strategy)
        matvec = lambda v: jax.tree.map(lambda h, x: h + cfg.trpo.damping * x, fisher(v), v)  # noqa: E731
        return cg_solve(matvec, g, max_iters=cfg.trpo.cg_iters, tol=1e-10).x

    evaluate = _line_search_evaluation(objectives)

    def step(params, batch):  # the meta-iteration's own outer step (TRPO: no optimizer)
        return outer_update(policy_apply, cfg, params, (), None, batch)[:2]

    batch = collect(params, key)
    g = jax.jit(grad)(params, batch)
    return {
        "sample (rollouts + inner step)": _median_ms(collect, params, key),
        "meta-gradient": _median_ms(jax.jit(grad), params, batch),
        "one FVP (hvp of the KL)": _median_ms(jax.jit(fvp_hvp), params, batch, g),
        "one FVP (J^T F J)": _median_ms(jax.jit(fvp_gn), params, batch, g),
        f"CG solve ({cfg.trpo.cg_iters} iterations)": _median_ms(jax.jit(cg), params, batch, g),
        "one line-search evaluation": _median_ms(jax.jit(evaluate), params, batch),
        "TRPO step (all of it)": _median_ms(jax.jit(step), params, batch),
    }
