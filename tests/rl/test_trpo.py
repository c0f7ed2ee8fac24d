"""TRPO's pieces against explicit constructions: the Fisher matrix, the KL bound, the surrogate."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from metalearn.rl.envs import NAV2D, sample_goals
from metalearn.rl.estimators import (
    adapted_params,
    collect_task_batch,
    meta_surrogate,
    post_kl,
    post_kl_fisher,
)
from metalearn.rl.inner import InnerConfig
from metalearn.rl.policy import gaussian_kl, init_policy, policy_apply
from metalearn.rl.trpo import TRPOConfig, fisher_vector_product, trpo_step

INNER = InnerConfig(num_rollouts=4)


def explicit_fisher(params, obs: jax.Array) -> np.ndarray:
    """``mean_s J_s^T diag(1/sigma^2, 2) J_s``: the Fisher information of a diagonal Gaussian in
    (mean, log-std) pulled back through the Jacobian ``J_s`` of the policy at each state."""
    flat, unravel = ravel_pytree(params)

    def outputs(f, o):
        mean, log_std = policy_apply(unravel(f), o)
        return jnp.concatenate([mean, log_std])

    _, log_std = policy_apply(params, obs[0])
    gaussian = np.concatenate([np.exp(-2 * np.asarray(log_std)), np.full(log_std.shape, 2.0)])
    fisher = np.zeros((flat.size, flat.size))
    jacobian = jax.jit(jax.jacobian(outputs))  # compiled once, reused for every state
    for o in obs:
        jac = np.asarray(jacobian(flat, o), np.float64)
        fisher += jac.T @ (gaussian[:, None] * jac)
    return fisher / len(obs)


def _small_policy():
    params = init_policy(jax.random.key(0), 2, 2, hidden=(4,))
    params["log_std"] = jnp.array([0.3, -0.4])
    return params


def test_fisher_vector_product_equals_explicit_fisher_times_v():
    params = _small_policy()
    obs = jax.random.normal(jax.random.key(1), (6, 2))
    old_mean, old_log_std = policy_apply(params, obs)

    def kl(p):
        mean, log_std = policy_apply(p, obs)
        return jnp.mean(gaussian_kl(old_mean, old_log_std, mean, log_std))

    flat, unravel = ravel_pytree(params)
    v = jax.random.normal(jax.random.key(2), flat.shape)
    fvp = ravel_pytree(jax.jit(fisher_vector_product, static_argnums=0)(kl, params, unravel(v)))[0]
    np.testing.assert_allclose(
        fvp, explicit_fisher(params, obs) @ np.asarray(v), rtol=1e-4, atol=1e-5
    )


def _meta_batch(params, num_tasks=3, inner=INNER):
    goals = sample_goals(jax.random.key(5), num_tasks)
    keys = jax.random.split(jax.random.key(6), num_tasks)
    collect = lambda p, k, g: collect_task_batch(NAV2D, policy_apply, p, k, g, inner, 4)  # noqa: E731
    # one compiled program, not op by op
    return jax.jit(jax.vmap(collect, in_axes=(None, 0, 0)))(params, keys, goals)


def test_meta_kl_hessian_is_the_post_update_fisher_pulled_back_through_the_inner_step():
    # At the sampling parameters the KL's gradient vanishes, so its Hessian through the inner
    # update is J^T F J with J = d theta' / d theta and F the Fisher at theta' on post states.
    params = _small_policy()
    batch = jax.tree.map(lambda x: x[0], _meta_batch(params, 1))
    flat, unravel = ravel_pytree(params)
    adapted = lambda f: ravel_pytree(  # noqa: E731
        adapted_params(policy_apply, unravel(f), batch, INNER, "dice")[-1]
    )[0]
    jac = np.asarray(jax.jit(jax.jacobian(adapted))(flat), np.float64)
    theta_prime = unravel(jax.jit(adapted)(flat))
    valid = np.asarray(batch.post.mask).reshape(-1).astype(bool)
    states = np.asarray(batch.post.obs).reshape(-1, 2)[valid]
    expected = jac.T @ explicit_fisher(theta_prime, jnp.asarray(states)) @ jac
    v = jax.random.normal(jax.random.key(7), flat.shape)
    kl = lambda p: post_kl(policy_apply, p, batch, INNER)  # noqa: E731
    fvp = ravel_pytree(jax.jit(fisher_vector_product, static_argnums=0)(kl, params, unravel(v)))[0]
    reference = expected @ np.asarray(v)
    np.testing.assert_allclose(fvp, reference, rtol=2e-3, atol=2e-3 * np.abs(reference).max())


def test_trpo_step_satisfies_the_kl_bound_and_improves_the_meta_surrogate():
    params = init_policy(jax.random.key(0), 2, 2, hidden=(16, 16))
    batch = _meta_batch(params)

    def over_tasks(fn):
        return lambda p: jnp.mean(jax.vmap(lambda b: fn(policy_apply, p, b, INNER))(batch))

    surrogate, kl = over_tasks(meta_surrogate), over_tasks(post_kl)
    cfg = TRPOConfig(max_kl=0.01)
    new, info = jax.jit(lambda p: trpo_step(surrogate, kl, p, cfg))(params)
    assert bool(info.accepted)
    # Re-evaluated here, not read from the step's own report.
    surrogate, kl = jax.jit(surrogate), jax.jit(kl)
    assert float(kl(new)) <= cfg.max_kl * (1 + 1e-4)
    assert float(kl(new)) > 0.1 * cfg.max_kl  # a real step, not a vanishing one
    assert float(surrogate(new)) > float(surrogate(params))
    np.testing.assert_allclose(info.surrogate_after, surrogate(new), rtol=1e-4)


def test_trpo_step_on_a_quadratic_matches_the_analytic_natural_gradient_step():
    # surrogate g.x, KL 0.5 x^T A x: the step is sqrt(2 delta / g^T A^-1 g) A^-1 g, accepted
    # whole (the first candidate meets the bound and improves the linear surrogate).
    a = jnp.array([[3.0, 1.0], [1.0, 2.0]])
    g = jnp.array([1.0, -2.0])
    new, info = trpo_step(lambda x: g @ x, lambda x: 0.5 * x @ a @ x, jnp.zeros(2))
    direction = np.linalg.solve(np.asarray(a), np.asarray(g))
    expected = np.sqrt(2 * 0.01 / (np.asarray(g) @ direction)) * direction
    np.testing.assert_allclose(new, expected, rtol=1e-3)
    assert int(info.backtracks) == 0


def test_a_kl_hessian_that_is_not_positive_definite_is_said_and_the_step_is_refused():
    # KL 0.5 (x_1^2 - x_2^2) with no damping, surrogate gradient e_2: CG's first direction
    # e_2 has curvature -1, so CG stops at x = 0 and no step can improve the surrogate.
    params = jnp.array([0.5, -0.25])
    kl = lambda x: 0.5 * ((x - params)[0] ** 2 - (x - params)[1] ** 2)  # noqa: E731
    new, info = trpo_step(lambda x: x[1], kl, params, TRPOConfig(damping=0.0))
    assert bool(info.cg_nonpositive_curvature) and not bool(info.accepted)
    np.testing.assert_array_equal(new, params)
    definite = trpo_step(lambda x: x[1], lambda x: 0.5 * (x - params) @ (x - params), params)[1]
    assert not bool(definite.cg_nonpositive_curvature) and bool(definite.accepted)


@pytest.mark.parametrize(
    "inner",
    [
        INNER,
        InnerConfig(num_steps=2, lrs=(0.1, 0.05), num_rollouts=4),
        InnerConfig(num_steps=0, lrs=(), num_rollouts=4),
    ],
    ids=["one inner step", "two inner steps", "no inner step (pretraining)"],
)
def test_gauss_newton_kl_hvp_equals_metalearn_hvp_of_the_mean_kl(inner):
    # post_kl_fisher's J^T F J form (J^T applied as the inner steps' symmetric maps in reverse
    # order, F from the policy outputs' Jacobian) against hvp (forward-over-reverse) of the
    # task-mean KL, and the TRPO step taken with it against the step taken with hvp. In float64:
    # the two are equal in exact arithmetic, so they agree to rounding; in float32 the two inner
    # steps' rounding differences change with XLA's code generation.
    with jax.enable_x64(True):
        params = init_policy(jax.random.key(0), 2, 2, hidden=(16, 16))
        params["log_std"] = jnp.array([0.3, -0.4])  # float64 here, as init_policy's are
        batch = _meta_batch(params, inner=inner)
        v = jax.tree.map(
            lambda x: jnp.cos(jnp.arange(x.size, dtype=x.dtype).reshape(x.shape)), params
        )
        fvp = jax.jit(fisher_vector_product, static_argnums=0)
        for estimator in ("lvc", "dice", "maml"):

            def kl(p, estimator=estimator):
                per_task = jax.vmap(lambda b: post_kl(policy_apply, p, b, inner, estimator))(batch)
                return jnp.mean(per_task)

            expected = ravel_pytree(fvp(kl, params, v))[0]
            assert expected.dtype == jnp.float64
            # every way of batching the 3 tasks: vmap, one loop, three loops side by side
            for strategy in ("vmap", "map", "map3"):
                fisher = post_kl_fisher(policy_apply, params, batch, inner, estimator, strategy)
                got = ravel_pytree(jax.jit(fisher)(v))[0]
                scale = np.abs(expected).max()
                np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12 * scale)
        surrogate = lambda p: jnp.mean(  # noqa: E731
            jax.vmap(lambda b: meta_surrogate(policy_apply, p, b, inner, "maml"))(batch)
        )
        plain, info = jax.jit(lambda p: trpo_step(surrogate, kl, p))(params)
        fast, fast_info = jax.jit(lambda p: trpo_step(surrogate, kl, p, kl_hvp=fisher))(params)
        start = ravel_pytree(params)[0]
        step, fast_step = ravel_pytree(plain)[0] - start, ravel_pytree(fast)[0] - start
    assert int(info.backtracks) == int(fast_info.backtracks) and bool(fast_info.accepted)
    # CG (damping 1e-5) amplifies the products' rounding differences (to 2e-6 of the step
    # here): compare the steps on the scale of the step
    np.testing.assert_allclose(fast_step, step, atol=1e-4 * np.abs(step).max())


def test_each_tasks_kl_is_a_mean_over_its_own_valid_steps_in_the_fisher_product():
    # Tasks whose post-update batches have very different numbers of valid steps (one rollout
    # with none at all): each task's KL is a mean over its own valid steps, then the tasks are
    # averaged; the product under every task batching equals hvp of that mean.
    params = init_policy(jax.random.key(0), 2, 2, hidden=(8,))
    params["log_std"] = jnp.array([0.3, -0.4])
    batch = _meta_batch(params)
    horizon = batch.post.mask.shape[-1]
    ends = jnp.array([horizon, 37, 5])[:, None, None]  # valid steps per rollout, per task
    mask = batch.post.mask * (jnp.arange(horizon) < ends)
    mask = mask.at[2, 0].set(0.0)
    batch = batch._replace(post=batch.post._replace(mask=mask))
    assert len({float(n) for n in jnp.sum(mask, axis=(1, 2))}) == 3

    def kl(p):
        return jnp.mean(jax.vmap(lambda b: post_kl(policy_apply, p, b, INNER, "lvc"))(batch))

    v = jax.tree.map(lambda x: jnp.sin(jnp.arange(x.size, dtype=x.dtype).reshape(x.shape)), params)
    expected = ravel_pytree(jax.jit(fisher_vector_product, static_argnums=0)(kl, params, v))[0]
    for strategy in ("vmap", "map", "map2"):
        fisher = post_kl_fisher(policy_apply, params, batch, INNER, "lvc", strategy)
        got = ravel_pytree(jax.jit(fisher)(v))[0]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())
