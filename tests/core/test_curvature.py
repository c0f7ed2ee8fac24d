"""hvp, hessian, cg_solve and the top-eigenvalue routine against explicit constructions."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn import cg_solve, hessian, hvp, lanczos_eigenvalues, top_hessian_eigenvalue


def nonquadratic(params):
    return jnp.sum(jnp.sin(params["a"]) * params["b"] ** 2) + jnp.sum(params["a"] ** 4)


def test_hvp_equals_full_hessian_times_vector():
    x = jax.random.normal(jax.random.key(0), (5,))
    v = jax.random.normal(jax.random.key(1), (5,))
    f = lambda z: jnp.sum(jnp.sin(z) * z**2) + (z @ z) ** 2  # noqa: E731
    np.testing.assert_allclose(hvp(f, x, v), hessian(f)(x) @ v, rtol=1e-5, atol=1e-5)


def test_hvp_on_pytree_matches_flattened_hessian():
    params = {"a": jnp.array([0.3, -1.2]), "b": jnp.array([0.7, 2.0])}
    v = {"a": jnp.array([1.0, -0.5]), "b": jnp.array([0.25, 2.0])}
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    full = jax.hessian(lambda z: nonquadratic(unravel(z)))(flat)
    want = full @ jax.flatten_util.ravel_pytree(v)[0]
    got = jax.flatten_util.ravel_pytree(hvp(nonquadratic, params, v))[0]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_hessian_of_squared_norm_is_twice_identity():
    np.testing.assert_allclose(hessian(lambda x: x @ x)(jnp.arange(4.0)), 2 * np.eye(4))


def test_lanczos_finds_top_eigenvalue_of_known_matrix():
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.normal(size=(30, 30)))
    eigenvalues = np.linspace(-2.0, 9.0, 30)
    a = jnp.asarray(q @ np.diag(eigenvalues) @ q.T, jnp.float32)
    ritz = lanczos_eigenvalues(lambda v: a @ v, jnp.ones(30), num_iters=30)
    np.testing.assert_allclose(ritz, eigenvalues, atol=1e-3)


def test_top_hessian_eigenvalue_on_pytree_quadratic():
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    h = jnp.asarray(q @ np.diag(np.arange(1.0, 13.0)) @ q.T, jnp.float32)

    def f(params):
        z = jnp.concatenate([params["w"].ravel(), params["b"]])
        return 0.5 * z @ h @ z

    params = {"w": jnp.ones((2, 5)), "b": jnp.zeros(2)}
    top = top_hessian_eigenvalue(f, params, jax.random.key(0), num_iters=12)
    np.testing.assert_allclose(top, 12.0, rtol=1e-4)


def test_cg_solves_known_spd_system():
    rng = np.random.default_rng(2)
    m = rng.normal(size=(20, 20))
    a = jnp.asarray(m @ m.T + 20 * np.eye(20), jnp.float32)
    b = jnp.asarray(rng.normal(size=20), jnp.float32)
    result = cg_solve(lambda v: a @ v, b, max_iters=50, tol=1e-7)
    np.testing.assert_allclose(result.x, np.linalg.solve(a, b), rtol=1e-4, atol=1e-5)
    assert int(result.iterations) <= 50


def test_cg_counts_its_products_and_keeps_the_residual_it_reports():
    # Stopped early (3 of 20 dimensions), the reported residual is b - A x (what TRPO uses for
    # x^T A x), and a solve from zero spends exactly one product per iteration.
    rng = np.random.default_rng(3)
    m = rng.normal(size=(20, 20))
    a = np.asarray(m @ m.T + 5 * np.eye(20), np.float64)
    b = rng.normal(size=20)
    products = []

    def matvec(v):
        products.append(1)
        return jnp.asarray(a, jnp.float32) @ v

    result = cg_solve(matvec, jnp.asarray(b, jnp.float32), max_iters=3, tol=0.0)
    assert int(result.iterations) == 3 and len(products) == 1  # traced once: the loop body
    x = np.asarray(result.x, np.float64)
    np.testing.assert_allclose(result.residual, b - a @ x, rtol=1e-4, atol=1e-4 * np.abs(b).max())
    np.testing.assert_allclose(result.residual_norm, np.linalg.norm(b - a @ x), rtol=1e-3)
    assert np.linalg.norm(b - a @ x) > 1e-2 * np.linalg.norm(b)  # really stopped early
    started = cg_solve(matvec, jnp.asarray(b, jnp.float32), x0=result.x, max_iters=1, tol=0.0)
    assert len(products) == 3  # from x0: one product for b - A x0, one in the loop
    assert float(started.residual_norm) < float(result.residual_norm)


def test_cg_with_hvp_on_pytree_solves_imaml_system():
    # (I + H / lam) x = g with H the Hessian of a pytree-valued quadratic.
    diag = {"a": jnp.array([1.0, 2.0]), "b": jnp.array([[3.0, 4.0]])}

    def f(p):
        return 0.5 * sum(jnp.sum(diag[name] * p[name] ** 2) for name in diag)

    params = {"a": jnp.ones(2), "b": jnp.ones((1, 2))}
    g = {"a": jnp.array([1.0, -1.0]), "b": jnp.array([[2.0, 0.5]])}
    lam = 2.0
    matvec = lambda v: jax.tree_util.tree_map(  # noqa: E731
        lambda vi, hvi: vi + hvi / lam, v, hvp(f, params, v)
    )
    got = cg_solve(matvec, g, max_iters=10).x
    want = jax.tree_util.tree_map(lambda gi, di: gi / (1 + di / lam), g, diag)
    chex.assert_trees_all_close(got, want, rtol=1e-5)


def test_curvature_tools_under_jit_and_vmap():
    xs = jax.random.normal(jax.random.key(3), (4, 3))
    vs = jax.random.normal(jax.random.key(4), (4, 3))
    f = lambda z: jnp.sum(z**3)  # noqa: E731
    batched = jax.jit(jax.vmap(lambda x, v: hvp(f, x, v)))(xs, vs)
    np.testing.assert_allclose(batched, 6 * xs * vs, rtol=1e-5)
    a = jnp.diag(jnp.array([2.0, 3.0, 4.0]))
    solve = jax.jit(jax.vmap(lambda b: cg_solve(lambda v: a @ v, b, max_iters=5).x))
    np.testing.assert_allclose(solve(xs), xs / jnp.array([2.0, 3.0, 4.0]), rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_iters": 0}, "max_iters must be an integer >= 1"),
        ({"max_iters": -1}, "max_iters must be an integer >= 1"),
        ({"tol": -1.0}, "tol must be >= 0"),  # squared, it stopped at once and returned 0
        ({"max_iters": 0.0}, "max_iters must be an integer >= 1"),  # returned x = 0
        ({"max_iters": None}, "max_iters must be an integer >= 1"),  # a TypeError in the loop
    ],
)
def test_cg_solve_refuses_settings_that_returned_zeros_silently(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cg_solve(lambda v: 2 * v, jnp.ones(3), **kwargs)


@pytest.mark.parametrize("num_iters", [0, -2])
def test_lanczos_refuses_a_step_count_below_one(num_iters):
    # 0 failed deep in JAX's indexing (IndexError), -2 in broadcast_in_dim (TypeError).
    with pytest.raises(ValueError, match="num_iters must be an integer >= 1"):
        lanczos_eigenvalues(lambda v: v, jnp.ones(3), num_iters)
    with pytest.raises(ValueError, match="num_iters must be an integer >= 1"):
        top_hessian_eigenvalue(
            lambda p: jnp.sum(p**2), jnp.ones(3), jax.random.key(0), num_iters=num_iters
        )


@pytest.mark.parametrize("v0", [jnp.zeros(3), jnp.array([1.0, jnp.nan, 0.0])])
def test_lanczos_refuses_a_start_vector_it_cannot_normalise(v0):
    # It returned NaN Ritz values: v0 / |v0| is 0 / 0 or carries the NaN.
    with pytest.raises(ValueError, match="v0 must be a finite, nonzero start vector"):
        lanczos_eigenvalues(lambda v: 2 * v, v0, 2)


def test_cg_solve_refuses_an_integer_right_hand_side():
    # It failed inside lax.while_loop: "carry input and carry output must have equal types".
    with pytest.raises(ValueError, match="b must be floating point, got int32"):
        cg_solve(lambda v: 2 * v, jnp.array([1, 2, 3]))


@pytest.mark.parametrize(
    "v0", [jnp.ones((2, 2)), jnp.array(1.0), [1.0, 2.0], {"a": jnp.ones(2)}, jnp.ones(3, int)]
)
def test_lanczos_refuses_a_start_vector_that_is_not_flat(v0):
    # Broadcasting, IndexError, AttributeError and TypeError from inside the loop before.
    with pytest.raises(ValueError, match="v0 must be a 1-D floating-point array"):
        lanczos_eigenvalues(lambda v: 2 * v, v0, 2)


def test_lanczos_asked_for_more_steps_than_dimensions_adds_no_spurious_value():
    # Past n steps the Krylov space is exhausted; padding the tridiagonal matrix with zero rows
    # would add a Ritz value 0, the top one for a negative-definite matrix.
    A = -jnp.diag(jnp.array([1.0, 2.0, 3.0]))
    ritz = lanczos_eigenvalues(lambda v: A @ v, jnp.array([1.0, 1.0, 1.0]), 10)
    np.testing.assert_allclose(ritz, [-3.0, -2.0, -1.0], rtol=1e-5)


def test_lanczos_stops_cleanly_when_the_start_vector_is_an_eigenvector():
    # After one step the residual is exactly 0: dividing by its norm gave NaN everywhere.
    A = 2.0 * jnp.eye(4)
    ritz = lanczos_eigenvalues(lambda v: A @ v, jnp.array([1.0, 0.5, -1.0, 2.0]), 3)
    np.testing.assert_allclose(ritz, [2.0, 2.0, 2.0], rtol=1e-6)  # no spurious 0 (was [0, 0, 2])


def test_after_a_breakdown_every_ritz_value_is_one_of_the_matrix():
    # The start vector spans an invariant subspace of fewer dimensions than the steps asked:
    # the steps after it contributed zero rows, hence Ritz values 0 that A does not have (the
    # top eigenvalue of -2 I came out as 0). Now each is a Ritz value of A on an orthonormal
    # basis, so Cauchy's interlacing bounds hold: the k-th smallest of m lies in
    # [lambda_k, lambda_{n-m+k}] of A's n eigenvalues (ascending).
    assert float(
        top_hessian_eigenvalue(lambda p: -jnp.sum(p**2), jnp.ones(50), jax.random.key(0))
    ) == pytest.approx(-2.0)
    A = jnp.diag(jnp.array([1.0, 1.0, 5.0]))
    ritz = lanczos_eigenvalues(lambda v: A @ v, jnp.ones(3), 3)
    np.testing.assert_allclose(ritz, [1, 1, 5], rtol=1e-5)
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    eigenvalues = np.array([-3.0, -3.0, -3.0, 0.5, 0.5, 2.0, 2.0, 2.0, 2.0, 4.0, 7.0, 7.0])
    M = jnp.asarray(q @ np.diag(eigenvalues) @ q.T)
    for v0, m in [(q[:, 3] + q[:, 10], 6), (q[:, 0] + q[:, 5] + q[:, 9], 8), (q[:, 11], 12)]:
        ritz = np.asarray(lanczos_eigenvalues(lambda v: M @ v, jnp.asarray(v0), m))
        n = len(eigenvalues)
        for k in range(m):
            assert eigenvalues[k] - 1e-4 <= ritz[k] <= eigenvalues[n - m + k] + 1e-4, (m, ritz)
    e1_e2 = jnp.zeros(10).at[0].set(1.0).at[1].set(1.0)
    D = jnp.diag(jnp.arange(1.0, 11.0))
    eager = lanczos_eigenvalues(lambda v: D @ v, e1_e2, 5)
    np.testing.assert_allclose(eager[:2], [1.0, 2.0], rtol=1e-5)  # the invariant subspace's
    assert float(eager.min()) >= 1.0 - 1e-5  # no 0 (was [0, 0, 0, 1, 2])
    jitted = jax.jit(lambda v0: lanczos_eigenvalues(lambda v: D @ v, v0, 5))(e1_e2)
    np.testing.assert_allclose(jitted, eager, rtol=1e-5)


def test_numpy_integers_are_step_counts():
    A = jnp.diag(jnp.array([1.0, 2.0, 5.0]))
    ritz = lanczos_eigenvalues(lambda v: A @ v, jnp.ones(3), np.int64(3))
    np.testing.assert_allclose(ritz, [1.0, 2.0, 5.0], rtol=1e-5)
