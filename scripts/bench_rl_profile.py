"""Where metalearn's MAML-RL meta-iteration spends its time (``bench_rl.py --profile``).

Each part of :func:`metalearn.rl.maml_rl.make_meta_iteration` is jitted on its own from the
library's functions and timed (median of 3 calls after one warm-up): sampling every task's
rollouts and inner step (``collect_task_batch`` under ``vmap``), the meta-gradient, one
Fisher-vector product of the mean post-update KL (as ``metalearn.hvp`` of the KL through the
inner step, and in the Gauss-Newton form the iteration uses), the whole CG solve, one line-search
evaluation (surrogate and KL at a candidate), and the whole TRPO step.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp

from metalearn.core.curvature import cg_solve
from metalearn.rl.envs import NAV2D
from metalearn.rl.estimators import collect_task_batch, meta_surrogate, post_kl, post_kl_fisher
from metalearn.rl.policy import policy_apply
from metalearn.rl.trpo import fisher_vector_product, trpo_step


def _median_ms(fn, *args) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(3):
        tic = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - tic)
    return 1e3 * statistics.median(times)


def profile_metalearn(params: Any, key: jax.Array, cfg) -> dict[str, float]:
    """Milliseconds of each jitted part of one meta-iteration at ``params``."""
    inner, est = cfg.inner, cfg.estimator

    @jax.jit
    def collect(params, key):
        tasks = NAV2D.sample_tasks(key, cfg.num_tasks)
        keys = jax.random.split(key, cfg.num_tasks)
        return jax.vmap(
            lambda k, t: collect_task_batch(
                NAV2D, policy_apply, params, k, t, inner, cfg.num_post_rollouts
            )
        )(keys, tasks)

    def objectives(batch):  # as make_meta_iteration builds them
        def over_tasks(fn):
            return lambda p: jnp.mean(jax.vmap(lambda b: fn(p, b))(batch))

        surrogate = over_tasks(lambda p, b: meta_surrogate(policy_apply, p, b, inner, est))
        kl = over_tasks(lambda p, b: post_kl(policy_apply, p, b, inner, est))
        return surrogate, kl

    def grad(params, batch):
        return jax.grad(objectives(batch)[0])(params)

    def fvp_hvp(params, batch, v):  # metalearn.hvp of the KL, through the inner step
        return fisher_vector_product(objectives(batch)[1], params, v, cfg.trpo.damping)

    def fvp_gn(params, batch, v):  # J^T F J, what make_meta_iteration uses
        return post_kl_fisher(policy_apply, params, batch, inner, est)(v)

    def cg(params, batch, g):
        fisher = post_kl_fisher(policy_apply, params, batch, inner, est)
        matvec = lambda v: jax.tree.map(lambda h, x: h + cfg.trpo.damping * x, fisher(v), v)  # noqa: E731
        return cg_solve(matvec, g, max_iters=cfg.trpo.cg_iters, tol=1e-10).x

    def evaluate(params, batch):
        surrogate, kl = objectives(batch)
        return surrogate(params), kl(params)

    def step(params, batch):
        fisher = post_kl_fisher(policy_apply, params, batch, inner, est)
        return trpo_step(*objectives(batch), params, cfg.trpo, kl_hvp=fisher)

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
