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


def _solve(a, b, **kwargs):
    a = jnp.asarray(a, jnp.float32)
    return cg_solve(lambda v: a @ v, jnp.asarray(b, jnp.float32), **kwargs)


@pytest.mark.parametrize(
    "a, b",
    [
        ([[1.0, 0.0], [0.0, -1.0]], [1.0, 1.0]),  # p^T A p = 0 at the first direction: was NaN
        ([[2.0, 0.0], [0.0, -1.0]], [1.0, 1.0]),  # negative at the second
        ([[1.0, 0.0], [0.0, 0.0]], [1.0, 1.0]),  # singular, b outside its range: was [nan, inf]
        ([[1.0, 1.0], [1.0, 1.0]], [1.0, 0.0]),  # singular, was [inf, -inf]
        ([[0.0, 0.0], [0.0, 0.0]], [1.0, 2.0]),  # zero operator: was [inf, inf]
    ],
)
def test_cg_stops_at_a_direction_of_nonpositive_curvature_and_says_so(a, b):
    # CG divided by p^T A p, zero or negative off the positive-definite operators it is for,
    # and returned NaN or infinities without a sign. Now it stops before such a direction and
    # returns the last iterate, every step of which had positive curvature, so x^T A x > 0
    # holds for the x it returns (TRPO scales its step by 1 / sqrt(x^T A x)).
    result = _solve(a, b, max_iters=10, tol=0.0)
    x = np.asarray(result.x, np.float64)
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.all(np.isfinite(x)) and bool(result.nonpositive_curvature)
    assert int(result.iterations) < 2  # the step it could not take is not counted
    np.testing.assert_allclose(result.residual, b64 - a64 @ x, atol=1e-6)  # what it reports
    np.testing.assert_allclose(result.residual_norm, np.linalg.norm(b64 - a64 @ x), atol=1e-6)
    assert x @ a64 @ x >= 0.0


def test_cg_solves_what_it_can_of_singular_and_indefinite_systems():
    # Singular positive semi-definite, b in its range: CG from 0 stays in the range and ends
    # at the least-norm solution, numpy's pinv(A) b.
    rng = np.random.default_rng(0)
    m = rng.normal(size=(5, 3))
    a = m @ m.T  # rank 3 of 5
    b = a @ rng.normal(size=5)
    result = _solve(a, b, max_iters=10, tol=1e-6)
    np.testing.assert_allclose(result.x, np.linalg.pinv(a) @ b, rtol=1e-3, atol=1e-3)
    assert not bool(result.nonpositive_curvature)
    # Indefinite, b in the span of the positive eigenvectors: numpy's solve.
    a = np.array([[2.0, 0.0], [0.0, -1.0]])
    result = _solve(a, [1.0, 0.0], max_iters=10)
    np.testing.assert_allclose(result.x, np.linalg.solve(a, [1.0, 0.0]), rtol=1e-6)
    assert not bool(result.nonpositive_curvature)


def test_a_breakdown_under_jit_and_vmap_stops_only_its_own_solve():
    a = jnp.array([[1.0, 0.0], [0.0, -1.0]])
    bs = jnp.array([[1.0, 1.0], [1.0, 0.0]])  # the first breaks down at once, the second solves
    result = jax.jit(jax.vmap(lambda b: cg_solve(lambda v: a @ v, b, max_iters=5)))(bs)
    np.testing.assert_allclose(result.x, [[0.0, 0.0], [1.0, 0.0]])
    np.testing.assert_array_equal(result.nonpositive_curvature, [True, False])


@pytest.mark.parametrize(
    "tol", [jnp.array(-1.0), np.float32(-1.0), np.array(-1e-3), jnp.array(jnp.nan)]
)
def test_cg_solve_refuses_a_negative_tolerance_of_any_type(tol):
    # Only Python numbers were checked: a negative array or NumPy tol, squared, stopped at once
    # and returned x = 0 with tol=-1.
    with pytest.raises(ValueError, match=r"^cg_solve: tol must be >= 0, got "):
        cg_solve(lambda v: 2 * v, jnp.ones(3), tol=tol)


@pytest.mark.parametrize("tol", [jnp.ones(3) * 1e-6, "1e-6", None])
def test_cg_solve_refuses_a_tolerance_that_is_not_one_number(tol):
    with pytest.raises(ValueError, match=r"^cg_solve: tol must be one number >= 0, got "):
        cg_solve(lambda v: 2 * v, jnp.ones(3), tol=tol)


def test_a_tolerance_given_as_an_array_or_traced_still_works():
    a = jnp.array([[4.0, 1.0], [1.0, 3.0]])
    b = jnp.array([1.0, 2.0])
    want = np.linalg.solve(np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(cg_solve(lambda v: a @ v, b, tol=jnp.array(1e-7)).x, want, 1e-5)
    solve = jax.jit(lambda tol: cg_solve(lambda v: a @ v, b, tol=tol).x)
    np.testing.assert_allclose(solve(jnp.array(1e-7)), want, rtol=1e-5)


F32, F64 = jnp.float32, jnp.float64
A_SPD = np.array([[4.0, 1.0], [1.0, 3.0]])


@pytest.mark.parametrize(
    "b_dtype, a_dtype, x0_dtype",
    [(F32, F64, None), (F64, F32, None), (F32, F32, F64), (F64, F64, F32)],
)
def test_cg_solves_in_the_dtype_of_b_whatever_the_operator_returns(b_dtype, a_dtype, x0_dtype):
    # An operator or start of another precision failed inside lax.while_loop ("carry input and
    # carry output must have equal types") when b was the narrower one.
    with jax.enable_x64(True):
        a = jnp.asarray(A_SPD, a_dtype)
        b = jnp.array([1.0, 2.0], b_dtype)
        x0 = None if x0_dtype is None else jnp.zeros(2, x0_dtype)
        result = cg_solve(lambda v: a @ v, b, x0=x0, max_iters=5)
        assert result.x.dtype == b_dtype and result.residual.dtype == b_dtype
        np.testing.assert_allclose(result.x, np.linalg.solve(A_SPD, [1.0, 2.0]), rtol=1e-5)


def test_cg_solves_a_pytree_of_mixed_precision_leaf_by_leaf():
    with jax.enable_x64(True):
        b = {"a": jnp.ones(2, F32), "b": jnp.ones(3, F64)}
        result = cg_solve(lambda v: jax.tree_util.tree_map(lambda x: 2 * x, v), b)
        assert (result.x["a"].dtype, result.x["b"].dtype) == (F32, F64)
        np.testing.assert_allclose(result.x["a"], [0.5, 0.5])
        np.testing.assert_allclose(result.x["b"], [0.5, 0.5, 0.5])


@pytest.mark.parametrize(
    "matvec, x0, message",
    [
        (lambda v: jnp.ones(3), None, r"matvec\(v\) has shape \(3,\) where b has \(2,\)"),
        (lambda v: (v, v), None, r"matvec\(v\) must have the structure of b, PyTreeDef\(\*\), "),
        (lambda v: v, jnp.zeros(3), r"x0 has shape \(3,\) where b has \(2,\)"),
    ],
)
def test_cg_solve_names_an_operator_or_start_that_does_not_fit_b(matvec, x0, message):
    with pytest.raises(ValueError, match=f"^cg_solve: {message}"):
        cg_solve(matvec, jnp.ones(2), x0=x0)


@pytest.mark.parametrize("v_dtype, a_dtype", [(F32, F64), (F64, F32)])
def test_lanczos_runs_in_the_dtype_of_its_start_vector(v_dtype, a_dtype):
    # A float64 operator on a float32 start vector failed inside fori_loop's carry.
    with jax.enable_x64(True):
        a = jnp.asarray(A_SPD, a_dtype)
        ritz = lanczos_eigenvalues(lambda v: a @ v, jnp.ones(2, v_dtype), 2)
        assert ritz.dtype == v_dtype
        np.testing.assert_allclose(ritz, np.linalg.eigvalsh(A_SPD), rtol=1e-5)


def test_lanczos_names_an_operator_that_does_not_return_a_flat_vector():
    message = r"^lanczos_eigenvalues: matvec\(v\) has shape \(3, 1\) where v0 has \(3,\)"
    with pytest.raises(ValueError, match=message):
        lanczos_eigenvalues(lambda v: jnp.ones((3, 1)), jnp.ones(3), 2)


@pytest.mark.parametrize("p_dtype, v_dtype", [(F32, F64), (F64, F32), (F32, jnp.int32)])
def test_hvp_takes_v_in_the_dtype_of_params(p_dtype, v_dtype):
    # jax.jvp refused a tangent of another dtype than its primal, a TypeError from inside it.
    with jax.enable_x64(True):
        got = hvp(lambda p: jnp.sum(p**3), jnp.array([1.0, 2.0], p_dtype), jnp.ones(2, v_dtype))
        assert got.dtype == p_dtype
        np.testing.assert_allclose(got, [6.0, 12.0])


@pytest.mark.parametrize(
    "v, message",
    [
        ({"a": jnp.ones(2)}, r"v must have the structure of params"),
        ([1.0, 1.0], r"v must have the structure of params"),
        (jnp.ones(3), r"v has shape \(3,\) where params has \(2,\)"),
        (jnp.ones(2, jnp.complex64), r"v must be real numbers, got complex64"),
    ],
)
def test_hvp_names_a_direction_that_does_not_fit_params(v, message):
    with pytest.raises(ValueError, match=f"^hvp: {message}"):
        hvp(lambda p: jnp.sum(p**3), jnp.array([1.0, 2.0]), v)


@pytest.mark.parametrize(
    "params", [jnp.array([1, 2]), {"w": jnp.ones(2), "n": jnp.array(3)}, jnp.array([True])]
)
def test_curvature_of_integer_params_is_one_line(params):
    # top_hessian_eigenvalue failed in jax.random.normal ("dtype argument to `normal` must be a
    # float or complex dtype"), hvp inside jax.jvp (a float0 tangent was expected).
    f = lambda p: sum(jnp.sum(x**2) for x in jax.tree_util.tree_leaves(p))  # noqa: E731
    with pytest.raises(
        ValueError, match=r"^top_hessian_eigenvalue: params must be floating point to be diff"
    ):
        top_hessian_eigenvalue(f, params, jax.random.key(0))
    with pytest.raises(ValueError, match=r"^hvp: params must be floating point to be diff"):
        hvp(f, params, params)
