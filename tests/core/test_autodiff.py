"""per_example_grads, straight_through and stop_gradient semantics."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from metalearn import per_example_grads, straight_through


def mlp_loss(params, batch):
    x, y = batch
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def test_per_example_grads_equals_python_loop():
    k = jax.random.split(jax.random.key(0), 4)
    params = {
        "w1": jax.random.normal(k[0], (3, 8)),
        "b1": jnp.full(8, 0.1),
        "w2": jax.random.normal(k[1], (8, 1)),
    }
    batch = (jax.random.normal(k[2], (6, 3)), jax.random.normal(k[3], (6, 1)))
    got = per_example_grads(mlp_loss, params, batch)
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


def test_straight_through_round_has_round_value_and_unit_gradient():
    st_round = straight_through(jnp.round)
    x = jnp.array([0.2, 1.7, -2.6])
    np.testing.assert_array_equal(st_round(x), jnp.round(x))
    np.testing.assert_array_equal(jax.grad(lambda z: jnp.sum(st_round(z)))(x), jnp.ones(3))
    assert float(jax.grad(jnp.round)(1.7)) == 0.0  # the plain function would block gradients
