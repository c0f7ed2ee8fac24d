"""per_example_grads, straight_through and stop_gradient semantics."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn import per_example_grads, straight_through


def mlp_loss(params, batch):
    x, y = batch
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def test_per_example_grads_batch_of_one_equals_python_loop():
    # A loss written for batches (a mean over rows) sees a batch of one with batch_of_one=True.
    k = jax.random.split(jax.random.key(0), 4)
    params = {
        "w1": jax.random.normal(k[0], (3, 8)),
        "b1": jnp.full(8, 0.1),
        "w2": jax.random.normal(k[1], (8, 1)),
    }
    batch = (jax.random.normal(k[2], (6, 3)), jax.random.normal(k[3], (6, 1)))
    got = per_example_grads(mlp_loss, params, batch, batch_of_one=True)
    for i in range(6):
        example = (batch[0][i : i + 1], batch[1][i : i + 1])
        want = jax.grad(mlp_loss)(params, example)
        chex.assert_trees_all_close(
            jax.tree_util.tree_map(lambda g: g[i], got),  # noqa: B023
            want,
            rtol=1e-5,
            atol=1e-6,
        )
    # Averaging per-example gradients recovers the batch gradient.
    chex.assert_trees_all_close(
        jax.tree_util.tree_map(lambda g: g.mean(0), got),
        jax.grad(mlp_loss)(params, batch),
        rtol=1e-5,
        atol=1e-6,
    )


# The JAX docs' TD(0) example ("Stopping gradients", advanced autodiff), written literally:
# a loss on ONE transition, batched with vmap(grad(td_loss), in_axes=(None, 0, 0, 0)).
value_fn = lambda theta, state: jnp.dot(theta, state)  # noqa: E731


def td_loss(theta, s_tm1, r_t, s_t):
    v_tm1 = value_fn(theta, s_tm1)
    target = r_t + value_fn(theta, s_t)
    return -0.5 * ((jax.lax.stop_gradient(target) - v_tm1) ** 2)


def td_batch(n=5):
    k = jax.random.split(jax.random.key(3), 3)
    return (
        jax.random.normal(k[0], (n, 3)),
        jax.random.normal(k[1], (n,)),
        jax.random.normal(k[2], (n, 3)),
    )


def test_per_example_grads_td0_as_in_the_jax_docs():
    theta = jnp.array([0.1, -0.1, 0.0])
    s_tm1, r_t, s_t = td_batch()
    got = jax.jit(lambda th, *b: per_example_grads(td_loss, th, *b))(theta, s_tm1, r_t, s_t)
    loop = jnp.stack([jax.grad(td_loss)(theta, s_tm1[i], r_t[i], s_t[i]) for i in range(5)])
    np.testing.assert_allclose(got, loop, rtol=1e-6)
    # The TD(0) update in closed form: (r + v(s_t) - v(s_tm1)) * s_tm1, per transition.
    td_error = r_t + s_t @ theta - s_tm1 @ theta
    np.testing.assert_allclose(got, td_error[:, None] * s_tm1, rtol=1e-5, atol=1e-7)
    # The docs' own transition and result.
    one = per_example_grads(
        td_loss,
        theta,
        jnp.array([[1.0, 2.0, -1.0]]),
        jnp.array([1.0]),
        jnp.array([[2.0, 1.0, 0.0]]),
    )
    np.testing.assert_allclose(one, [[1.2, 2.4, -1.2]], rtol=1e-6)
    # Same as the docs' idiom spelled out, with the same in_axes.
    docs = jax.jit(jax.vmap(jax.grad(td_loss), in_axes=(None, 0, 0, 0)))
    np.testing.assert_allclose(got, docs(theta, s_tm1, r_t, s_t), rtol=1e-6)


def test_per_example_grads_in_axes_shared_argument_and_other_axis():
    theta = jnp.array([0.1, -0.1, 0.0])
    s_tm1, r_t, s_t = td_batch()
    # One shared next state for every transition (in_axes None), states stored column-wise.
    shared = s_t[0]
    got = per_example_grads(td_loss, theta, s_tm1.T, r_t, shared, in_axes=(None, 1, 0, None))
    loop = jnp.stack([jax.grad(td_loss)(theta, s_tm1[i], r_t[i], shared) for i in range(5)])
    np.testing.assert_allclose(got, loop, rtol=1e-6)
    with pytest.raises(ValueError, match="in_axes has 3 entries for 4 arguments"):
        per_example_grads(td_loss, theta, s_tm1, r_t, s_t, in_axes=(None, 0, 0))


def test_per_example_grads_batch_of_one_keeps_the_mapped_axis():
    # batch_of_one re-inserts the axis vmap removed, at its own position; shared args untouched.
    seen = []

    def loss(w, x, y):
        seen.append((x.shape, y.shape))
        return jnp.sum((x.T @ w - y) ** 2)

    x, y = jnp.ones((3, 4)), jnp.ones((1,))  # 4 examples stored column-wise, y shared
    got = per_example_grads(loss, jnp.ones(3), x, y, in_axes=(None, 1, None), batch_of_one=True)
    assert seen == [((3, 1), (1,))]
    assert got.shape == (4, 3)


def test_per_example_grads_adds_no_hidden_jit():
    # No jit inside: a caller's jaxpr holds the vmapped gradient itself, no nested jit keyed on
    # the loss object, so every new lambda is just traced as part of the caller.
    for scale in (1.0, 2.0):
        loss = lambda w, x: scale * jnp.sum(w * x)  # noqa: E731, B023
        jaxpr = jax.make_jaxpr(lambda w, x: per_example_grads(loss, w, x))(  # noqa: B023
            jnp.ones(3), jnp.ones((2, 3))
        )
        assert {e.primitive.name for e in jaxpr.eqns}.isdisjoint({"jit", "pjit"})


def test_straight_through_round_has_round_value_and_unit_gradient():
    st_round = straight_through(jnp.round)
    x = jnp.array([0.2, 1.7, -2.6])
    np.testing.assert_array_equal(st_round(x), jnp.round(x))
    np.testing.assert_array_equal(jax.grad(lambda z: jnp.sum(st_round(z)))(x), jnp.ones(3))
    assert float(jax.grad(jnp.round)(1.7)) == 0.0  # the plain function would block gradients


@pytest.mark.parametrize(
    "args, in_axes, message",
    [
        ((), None, r"only params was given, so there are no examples"),
        ((jnp.ones(3),), (None, None), r"in_axes=\(None, None\) maps no argument"),
        ((jnp.ones(3), (jnp.ones(3),)), [None, None, (None,)], r"in_axes=.* maps no argument"),
    ],
)
def test_per_example_grads_without_a_batched_argument_is_one_line(args, in_axes, message):
    # vmap's own "vmap must have at least one non-None value in in_axes" named neither the
    # function nor what to pass.
    loss = lambda p, *rest: jnp.sum(p**2)  # noqa: E731
    with pytest.raises(ValueError, match=f"^per_example_grads: {message}"):
        per_example_grads(loss, jnp.ones(3), *args, in_axes=in_axes)
