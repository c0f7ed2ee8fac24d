"""adapt / maml_loss against closed forms, finite differences and jit."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.test_util import check_grads

from metalearn import adapt, adapt_trajectory, inner_adam, maml_loss
from metalearn.core.inner_loop import FULL_UNROLL_MAX_STEPS


def linear_loss(w, batch):
    x, y = batch
    return 0.5 * jnp.mean((x @ w - y) ** 2)


def linear_problem(seed=0, n=8, d=3):
    rng = np.random.default_rng(seed)
    xs, ys = rng.normal(size=(n, d)), rng.normal(size=n)
    xq, yq = rng.normal(size=(n, d)), rng.normal(size=n)
    w = rng.normal(size=d)
    as32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    return as32(w), (as32(xs), as32(ys)), (as32(xq), as32(yq))


def closed_form_meta_grad(w, support, query, lrs, num_steps, first_order):
    """Meta-gradient of the linear model with squared loss, computed by hand in float64.

    Inner step: w <- w - A (H w - b) with H = X^T X / n, b = X^T y / n and A = diag(lr).
    So dw_k/dw_{k-1} = I - A H, and the meta-gradient is prod_k (I - A H)^T grad_query(w_K).
    """
    xs, ys = (np.asarray(a, np.float64) for a in support)
    xq, yq = (np.asarray(a, np.float64) for a in query)
    n = xs.shape[0]
    h_support, b_support = xs.T @ xs / n, xs.T @ ys / n
    a = np.diag(np.broadcast_to(np.asarray(lrs, np.float64), w.shape))
    wk = np.asarray(w, np.float64)
    for _ in range(num_steps):
        wk = wk - a @ (h_support @ wk - b_support)
    query_grad = xq.T @ (xq @ wk - yq) / xq.shape[0]
    if first_order:
        return query_grad
    jac = np.linalg.matrix_power(np.eye(len(wk)) - a @ h_support, num_steps)
    return jac.T @ query_grad


@pytest.mark.parametrize("num_steps", [1, 3])
@pytest.mark.parametrize("per_parameter", [False, True])
@pytest.mark.parametrize("first_order", [False, True])
def test_maml_gradient_matches_closed_form(num_steps, per_parameter, first_order):
    w, support, query = linear_problem()
    lrs = jnp.array([0.1, 0.3, 0.05]) if per_parameter else 0.2
    got = jax.grad(maml_loss, argnums=1)(
        linear_loss, w, support, query, inner_lr=lrs, num_steps=num_steps, first_order=first_order
    )
    want = closed_form_meta_grad(w, support, query, lrs, num_steps, first_order)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


def test_first_order_drops_exactly_the_jacobian_product():
    w, support, query = linear_problem(seed=3)
    second = jax.grad(lambda p: maml_loss(linear_loss, p, support, query, inner_lr=0.3))(w)
    first = jax.grad(
        lambda p: maml_loss(linear_loss, p, support, query, inner_lr=0.3, first_order=True)
    )(w)
    adapted = adapt(linear_loss, w, support, inner_lr=0.3)
    np.testing.assert_allclose(first, jax.grad(linear_loss)(adapted, query), rtol=1e-6)
    assert not np.allclose(first, second)


def mlp_loss(params, batch):
    x, y = batch
    h = jnp.tanh(x @ params["layer1"]["w"] + params["layer1"]["b"])
    return jnp.mean((h @ params["layer2"]["w"] - y) ** 2)


def small_mlp_problem():
    k = jax.random.split(jax.random.key(0), 5)
    params = {
        "layer1": {"w": jax.random.normal(k[0], (2, 4)), "b": jnp.zeros(4)},
        "layer2": {"w": jax.random.normal(k[1], (4, 1))},
    }
    support = (jax.random.normal(k[2], (5, 2)), jax.random.normal(k[3], (5, 1)))
    query = (jax.random.normal(k[4], (5, 2)), jnp.ones((5, 1)))
    return params, support, query


def test_maml_loss_check_grads_through_nonlinear_net():
    params, support, query = small_mlp_problem()
    with jax.enable_x64(True):
        params64 = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), params)
        support64 = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), support)
        query64 = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), query)
        fn = lambda p: maml_loss(mlp_loss, p, support64, query64, inner_lr=0.1, num_steps=2)  # noqa: E731
        check_grads(fn, (params64,), order=2, modes=["rev"])


def test_gradient_wrt_per_parameter_rates_matches_finite_differences():
    params, support, query = small_mlp_problem()
    rates = jax.tree_util.tree_map(lambda p: jnp.full_like(p, 0.05), params)
    with jax.enable_x64(True):
        cast = lambda t: jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), t)  # noqa: E731
        fn = lambda r: maml_loss(  # noqa: E731
            mlp_loss, cast(params), cast(support), cast(query), inner_lr=r, num_steps=2
        )
        check_grads(fn, (cast(rates),), order=1, modes=["rev"])


def test_adapt_on_nested_dict_pytree_with_per_parameter_rates():
    params, support, _ = small_mlp_problem()
    rates = jax.tree_util.tree_map(lambda p: jnp.full_like(p, 0.1), params)
    rates["layer2"]["w"] = jnp.zeros_like(params["layer2"]["w"])  # freeze the head
    adapted = adapt(mlp_loss, params, support, inner_lr=rates)
    np.testing.assert_array_equal(adapted["layer2"]["w"], params["layer2"]["w"])
    grads = jax.grad(mlp_loss)(params, support)
    np.testing.assert_allclose(
        adapted["layer1"]["w"], params["layer1"]["w"] - 0.1 * grads["layer1"]["w"], rtol=1e-6
    )


def test_rate_tree_with_wrong_structure_is_rejected():
    params, support, _ = small_mlp_problem()
    with pytest.raises(ValueError, match="same tree structure"):
        adapt(mlp_loss, params, support, inner_lr={"layer1": 0.1})


@pytest.mark.parametrize("bad_steps", [0, -1, 1.5])
def test_num_steps_must_be_positive_integer(bad_steps):
    params, support, _ = small_mlp_problem()
    with pytest.raises(ValueError, match="num_steps"):
        adapt(mlp_loss, params, support, inner_lr=0.1, num_steps=bad_steps)


@pytest.mark.parametrize("bad_rate", [float("nan"), float("inf"), jnp.array(jnp.nan)])
def test_a_non_finite_rate_is_refused(bad_rate):
    # Accepted before: every adapted parameter came back NaN.
    params, support, _ = small_mlp_problem()
    with pytest.raises(ValueError, match="inner_lr must be finite"):
        adapt(mlp_loss, params, support, inner_lr=bad_rate)
    per_parameter = jax.tree.map(lambda p: jnp.full(p.shape, bad_rate), params)
    with pytest.raises(ValueError, match="inner_lr must be finite"):
        maml_loss(mlp_loss, params, support, support, inner_lr=per_parameter)


def test_a_rate_that_is_not_a_number_is_refused():
    params, support, _ = small_mlp_problem()  # "0.1" was numpy's "ufunc 'isfinite' not supported"
    with pytest.raises(ValueError, match="inner_lr must be a number or an array of numbers"):
        adapt(mlp_loss, params, support, inner_lr="0.1")


def test_a_negative_rate_is_an_ascent_step():
    loss = lambda w, b: 0.5 * jnp.sum((w - b) ** 2)  # noqa: E731
    assert float(adapt(loss, jnp.array(0.0), jnp.array(1.0), inner_lr=-0.5)) == -0.5


def test_exactly_one_of_rate_and_optimizer():
    params, support, _ = small_mlp_problem()
    with pytest.raises(ValueError, match="exactly one"):
        adapt(mlp_loss, params, support)
    with pytest.raises(ValueError, match="exactly one"):
        adapt(mlp_loss, params, support, inner_lr=0.1, optimizer=optax.sgd(0.1))


def test_optax_sgd_inner_optimizer_equals_plain_sgd():
    params, support, query = small_mlp_problem()
    plain = jax.grad(lambda p: maml_loss(mlp_loss, p, support, query, inner_lr=0.1, num_steps=3))
    with_optax = jax.grad(
        lambda p: maml_loss(mlp_loss, p, support, query, optimizer=optax.sgd(0.1), num_steps=3)
    )
    chex.assert_trees_all_close(plain(params), with_optax(params), rtol=1e-5)


def test_inner_adam_second_derivative_is_finite_at_zero_gradient():
    # One coordinate of the support gradient is exactly zero: optax.adam's default eps_root=0
    # gives a NaN meta-gradient there, inner_adam's positive default does not.
    loss = lambda w, b: jnp.sum((w * b) ** 2)  # noqa: E731
    support, query, w = jnp.array([1.0, 0.0]), jnp.array([1.0, 1.0]), jnp.array([1.0, 2.0])

    def meta_grad(opt):
        return jax.grad(lambda p: maml_loss(loss, p, support, query, optimizer=opt, num_steps=2))(w)

    assert np.all(np.isnan(meta_grad(optax.adam(0.1))[1:]))
    assert np.all(np.isfinite(meta_grad(inner_adam(0.1))))
    with pytest.raises(ValueError, match="eps_root"):
        inner_adam(0.1, eps_root=0.0)


def test_trajectory_matches_adapt_at_every_step():
    params, support, _ = small_mlp_problem()
    traj = adapt_trajectory(mlp_loss, params, support, inner_lr=0.1, num_steps=4)
    for k in range(5):
        at_k = jax.tree_util.tree_map(lambda t: t[k], traj)  # noqa: B023
        want = params if k == 0 else adapt(mlp_loss, params, support, inner_lr=0.1, num_steps=k)
        chex.assert_trees_all_close(at_k, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("options", [{"unroll": 1}, {"remat": True}, {"unroll": 2, "remat": True}])
def test_loop_options_do_not_change_the_meta_gradient(options):
    params, support, query = small_mlp_problem()
    grad = lambda **kw: jax.grad(  # noqa: E731
        lambda p: maml_loss(mlp_loss, p, support, query, inner_lr=0.1, num_steps=4, **kw)
    )(params)
    chex.assert_trees_all_close(grad(), grad(**options), rtol=1e-5, atol=1e-6)


def test_jit_and_eager_agree_and_jit_traces_once():
    params, support, query = small_mlp_problem()

    @jax.jit
    @chex.assert_max_traces(n=1)
    def meta_grad(p, s, q):
        return jax.grad(lambda p_: maml_loss(mlp_loss, p_, s, q, inner_lr=0.1, num_steps=2))(p)

    eager = jax.grad(lambda p: maml_loss(mlp_loss, p, support, query, inner_lr=0.1, num_steps=2))
    chex.assert_trees_all_close(
        meta_grad(params, support, query), eager(params), rtol=1e-5, atol=1e-6
    )
    shifted = jax.tree_util.tree_map(lambda a: a + 0.1, params)
    chex.assert_trees_all_close(
        meta_grad(shifted, support, query), eager(shifted), rtol=1e-5, atol=1e-6
    )


def test_vmap_over_tasks_equals_loop_over_tasks():
    params, support, query = small_mlp_problem()
    supports = jax.tree_util.tree_map(lambda a: jnp.stack([a, a * 0.5, a + 1.0]), support)
    queries = jax.tree_util.tree_map(lambda a: jnp.stack([a, a - 1.0, a * 2.0]), query)
    grad = jax.grad(lambda p, s, q: maml_loss(mlp_loss, p, s, q, inner_lr=0.1))
    batched = jax.vmap(grad, in_axes=(None, 0, 0))(params, supports, queries)
    for i in range(3):
        pick = lambda t: jax.tree_util.tree_map(lambda a: a[i], t)  # noqa: E731, B023
        chex.assert_trees_all_close(
            pick(batched), grad(params, pick(supports), pick(queries)), rtol=1e-5, atol=1e-6
        )


def test_remat_rolls_the_inner_loop_and_keeps_memory_flat():
    """``remat=True`` defaults to a rolled loop, where checkpointing actually frees memory:
    XLA's temporaries for 10 inner steps of a 256-wide MLP on 1024 points (compile-time
    figures, not timings)."""

    def loss(p, batch):
        x, y = batch
        h = jnp.tanh(jnp.tanh(x @ p["w1"]) @ p["w2"])
        return jnp.mean((h @ p["w3"] - y) ** 2)

    keys = jax.random.split(jax.random.key(0), 4)
    params = {
        "w1": 0.3 * jax.random.normal(keys[0], (8, 256)),
        "w2": 0.06 * jax.random.normal(keys[1], (256, 256)),
        "w3": 0.06 * jax.random.normal(keys[2], (256, 1)),
    }
    batch = (jax.random.normal(keys[3], (1024, 8)), jnp.zeros((1024, 1)))

    def temp_mb(**options):
        meta_grad = jax.grad(
            lambda p: maml_loss(loss, p, batch, batch, inner_lr=0.1, num_steps=10, **options)
        )
        analysis = jax.jit(meta_grad).lower(params).compile().memory_analysis()
        return analysis.temp_size_in_bytes / 2**20

    def scan_unroll(**options):
        jaxpr = jax.make_jaxpr(
            lambda p: adapt(loss, p, batch, inner_lr=0.1, num_steps=10, **options)
        )(params)
        return [e.params["unroll"] for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]

    # [] : straight-line steps, no scan
    assert scan_unroll() == [] and scan_unroll(remat=True) == [1]
    assert scan_unroll(remat=True, unroll=True) == []
    plain, rolled_remat = temp_mb(), temp_mb(remat=True)
    assert rolled_remat < 0.5 * plain, (plain, rolled_remat)  # measured: 67.6 -> 13.1 MB
    assert rolled_remat < 0.5 * temp_mb(remat=True, unroll=True)  # unrolled remat: 47.6 MB


@pytest.mark.parametrize("num_steps", [1, FULL_UNROLL_MAX_STEPS, FULL_UNROLL_MAX_STEPS + 1, 1000])
def test_a_long_inner_loop_is_rolled_by_default(num_steps):
    """Unrolled, 200 steps of a sinusoid MLP's meta-gradient compiled for minutes; the default
    unrolls only up to FULL_UNROLL_MAX_STEPS, and ``unroll`` still chooses."""
    loss = lambda w, b: 0.5 * jnp.sum((w - b) ** 2)  # noqa: E731

    def scan_unroll(**options):
        jaxpr = jax.make_jaxpr(
            lambda w: adapt(loss, w, 1.0, inner_lr=0.1, num_steps=num_steps, **options)
        )(0.0)
        return [e.params["unroll"] for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]

    # [] : straight-line steps (a Python loop), no scan
    assert scan_unroll() == ([] if num_steps <= FULL_UNROLL_MAX_STEPS else [1])
    assert scan_unroll(unroll=True) == [] and scan_unroll(unroll=4) == [4]
    rolled = adapt(loss, 0.0, 1.0, inner_lr=0.1, num_steps=num_steps, unroll=1)
    unrolled = adapt(loss, 0.0, 1.0, inner_lr=0.1, num_steps=num_steps, unroll=4)
    straight = adapt(loss, 0.0, 1.0, inner_lr=0.1, num_steps=num_steps, unroll=True)
    np.testing.assert_allclose(rolled, 1 - 0.9**num_steps, rtol=1e-5)
    np.testing.assert_allclose(unrolled, rolled, rtol=1e-6)
    np.testing.assert_allclose(straight, rolled, rtol=1e-6)


def test_rates_that_vary_within_a_parameter_apply_entry_by_entry():
    # The per-parameter test above gives each leaf one rate everywhere, which a rate averaged
    # over the leaf also passes.
    params, support, _ = small_mlp_problem()
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.key(3), len(leaves))
    uniform = lambda k, p: jax.random.uniform(k, p.shape, minval=0.0, maxval=0.2)  # noqa: E731
    rates = treedef.unflatten([uniform(k, p) for k, p in zip(keys, leaves, strict=True)])
    adapted = adapt(mlp_loss, params, support, inner_lr=rates)
    grads = jax.grad(mlp_loss)(params, support)
    expected = jax.tree_util.tree_map(lambda p, r, g: p - r * g, params, rates, grads)
    chex.assert_trees_all_close(adapted, expected, rtol=1e-6)


def test_an_inner_optimizer_keeps_its_state_from_step_to_step():
    # optax.sgd, the only optimizer compared so far, has no state to carry.
    params, support, _ = small_mlp_problem()
    optimizer = inner_adam(0.05)
    state, expected = optimizer.init(params), params
    for _ in range(3):
        updates, state = optimizer.update(jax.grad(mlp_loss)(expected, support), state, expected)
        expected = optax.apply_updates(expected, updates)
    adapted = adapt(mlp_loss, params, support, optimizer=optimizer, num_steps=3)
    chex.assert_trees_all_close(adapted, expected, rtol=1e-5, atol=1e-7)


def _two_layer_loss(p, b):
    return jnp.sum((p["body"] - b) ** 2) + jnp.sum((p["head"] - b) ** 2)


TWO_LAYERS = {"body": jnp.zeros(2), "head": jnp.zeros(2)}


@pytest.mark.parametrize(
    "rate, message",
    [
        # One array for "one rate per layer" was broadcast against every parameter: the body,
        # meant to stay frozen at rate 0, was adapted as [0, 0.2].
        (jnp.array([0.0, 0.1]), r"inner_lr of shape \(2,\) for parameters of shapes"),
        ({"body": jnp.ones((2, 2)), "head": 0.1}, r"inner_lr\['body'\] has shape \(2, 2\)"),
        ({"body": jnp.ones(3), "head": 0.1}, r"inner_lr\['body'\] has shape \(3,\)"),
    ],
)
def test_a_rate_of_another_shape_than_its_parameter_is_refused(rate, message):
    with pytest.raises(ValueError, match=message):
        adapt(_two_layer_loss, TWO_LAYERS, jnp.ones(2), inner_lr=rate)
    # A tree of per-layer numbers says what was meant: the body stays where it was.
    adapted = adapt(_two_layer_loss, TWO_LAYERS, jnp.ones(2), inner_lr={"body": 0.0, "head": 0.1})
    np.testing.assert_allclose(adapted["body"], [0.0, 0.0])
    np.testing.assert_allclose(adapted["head"], [0.2, 0.2])


def test_numpy_integer_step_counts_are_accepted():
    loss = lambda w, b: 0.5 * jnp.sum((w - b) ** 2)  # noqa: E731
    for steps in np.arange(1, 3):  # np.int64: refused as "not an integer" before
        exact = 1.0 - 0.5 ** int(steps)
        assert float(
            adapt(loss, jnp.array(0.0), jnp.array(1.0), inner_lr=0.5, num_steps=steps)
        ) == (pytest.approx(exact))


@pytest.mark.parametrize("optimizer", [0.1, optax.adam])  # a rate; the factory, not called
def test_an_optimizer_that_is_not_a_transformation_is_named(optimizer):
    with pytest.raises(ValueError, match="optimizer must be an optax GradientTransformation"):
        adapt(_two_layer_loss, TWO_LAYERS, jnp.ones(2), optimizer=optimizer)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"learning_rate": float("nan")}, "learning_rate must be finite, got nan"),
        ({"learning_rate": 0.1, "eps_root": float("nan")}, "eps_root must be > 0 .* got nan"),
    ],
)
def test_inner_adam_refuses_non_finite_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):  # NaN parameters would come back silently
        inner_adam(**kwargs)


def test_a_float64_rate_keeps_float32_parameters_float32():
    # Under jax_enable_x64 a float64 rate made the scan's carry float64: a JAX carry error.
    with jax.enable_x64(True):
        loss = lambda w, b: jnp.sum((w - b) ** 2)  # noqa: E731
        w = jnp.zeros(1, jnp.float32)
        adapted = adapt(loss, w, jnp.ones(1, jnp.float32), inner_lr=np.float64(0.25))
        assert adapted.dtype == jnp.float32
        np.testing.assert_allclose(adapted, [0.5])
