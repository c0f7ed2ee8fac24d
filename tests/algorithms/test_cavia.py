"""CAVIA: the context's inner loop, the query metrics and the meta-gradient against a network
written by hand (the FiLM spelled out, no interception) in float64, the meta-gradient against
central finite differences, first order, the FiLM folded by ``adapt``, and the refusals."""

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.algorithms.base import context
from metalearn.algorithms.cavia import CAVIAConfig, cavia
from metalearn.data.task import Task, supervised_objective
from metalearn.models.base import ModelParts, model_from_flax
from metalearn.models.mlp import MLP
from tests.algorithms.problems import to64

CONTEXT, LR, STEPS = 3, 0.3, 2


def mlp_model():
    return model_from_flax(MLP((6, 5), 1), (1,), ModelParts(head="head", embed="embed"))


def setup(first_order: bool = False):
    model = mlp_model()
    learner = cavia(
        supervised_objective(model, "regression"),
        num_context=CONTEXT,
        film_module="hidden_0",
        inner_lr=LR,
        inner_steps=STEPS,
        first_order=first_order,
    )
    params, state = model.init(jax.random.key(0))
    meta = to64(learner.init(jax.random.key(1), params))
    meta["film"]["bias"] = 0.1 * jnp.arange(12.0)  # a FiLM offset that is not zero
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.uniform(-5, 5, (16, 1)))
    y = jnp.asarray(np.sin(np.asarray(x)) * 2.0)
    task = Task((x[:8], y[:8]), (x[8:], y[8:]))
    return model, learner, meta, state, task


def by_hand(meta, phi, x):
    """The MLP 1-6-5-1 with ReLU and the FiLM of ``phi`` on its first layer's output."""
    p, film = meta["params"], meta["film"]
    gamma_beta = phi @ film["kernel"] + film["bias"]
    gamma, beta = gamma_beta[:6], gamma_beta[6:]
    h = x @ p["hidden_0"]["kernel"] + p["hidden_0"]["bias"]
    h = jax.nn.relu(h * (1 + gamma) + beta)
    h = jax.nn.relu(h @ p["hidden_1"]["kernel"] + p["hidden_1"]["bias"])
    return h @ p["head"]["kernel"] + p["head"]["bias"]


def mse(meta, phi, batch):
    return jnp.mean((by_hand(meta, phi, batch[0]) - batch[1]) ** 2)


def hand_context(meta, support, steps, stop=False):
    """The inner loop written out: ``phi <- phi - lr * d(support loss)/d(phi)`` from 0."""
    phi = jnp.zeros(CONTEXT)
    for _ in range(steps):
        step = jax.grad(mse, argnums=1)(meta, phi, support)
        phi = phi - LR * (jax.lax.stop_gradient(step) if stop else step)
    return phi


def hand_objective(meta, task, stop=False):
    return mse(meta, hand_context(meta, task.support, STEPS, stop), task.query)


def test_inner_loop_and_query_metrics_equal_the_network_written_by_hand():
    with jax.enable_x64(True):
        _, learner, meta, state, task = setup()
        evaluate = jax.jit(learner.evaluate, static_argnums=3)
        ours = evaluate(meta, task, context(state), (0, 1, 2, 5))["mse"]
        expected = jax.jit(  # one compiled program, not op by op
            lambda meta, task: [
                mse(meta, hand_context(meta, task.support, k), task.query) for k in (0, 1, 2, 5)
            ]
        )(meta, task)
    np.testing.assert_allclose(ours, expected, rtol=1e-12)
    assert expected[2] < expected[0]  # the context's steps do fit the task


def test_meta_gradient_equals_the_hand_network_and_finite_differences():
    with jax.enable_x64(True):
        _, learner, meta, state, task = setup()
        grads, aux = jax.jit(learner.task_grad)(meta, task, context(state))
        objective = jax.jit(hand_objective)  # compiled once, for the differences below too
        np.testing.assert_allclose(aux.metrics["mse"], objective(meta, task), rtol=1e-12)
        expected = jax.jit(jax.grad(hand_objective))(meta, task)
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13)
        flat, unravel = jax.flatten_util.ravel_pytree(meta)
        ours = jax.flatten_util.ravel_pytree(grads)[0]
        for seed in range(3):  # directional derivatives by central differences
            direction = jax.random.normal(jax.random.key(seed), flat.shape)
            h = 1e-6
            plus = objective(unravel(flat + h * direction), task)
            minus = objective(unravel(flat - h * direction), task)
            np.testing.assert_allclose(ours @ direction, (plus - minus) / (2 * h), rtol=1e-6)
        assert float(jnp.abs(grads["film"]["kernel"]).max()) > 0  # the context's path counts


def test_first_order_drops_the_inner_steps_second_derivatives():
    with jax.enable_x64(True):
        _, learner, meta, state, task = setup(first_order=True)
        grads, _ = jax.jit(learner.task_grad)(meta, task, context(state))
        expected = jax.jit(jax.grad(lambda m: hand_objective(m, task, stop=True)))(meta)
        second = jax.jit(jax.grad(hand_objective))(meta, task)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13)
    assert not np.allclose(
        grads["params"]["hidden_0"]["kernel"], second["params"]["hidden_0"]["kernel"]
    )


def test_adapt_folds_the_film_into_the_model_and_leaves_the_rest():
    """The model's ``apply`` on the adapted parameters predicts as the network with the
    adapted context; only the FiLM'd entry changed."""
    with jax.enable_x64(True):
        model, learner, meta, state, task = setup()
        # Eager: the identity checks below need adapt's own arrays.
        adapted = learner.adapt(meta, task.support, context(state), STEPS)
        predicted = jax.jit(model.apply)(adapted, state, None, task.query[0])[0]
        expected = jax.jit(  # one compiled program, not op by op
            lambda meta, task: by_hand(meta, hand_context(meta, task.support, STEPS), task.query[0])
        )(meta, task)
        np.testing.assert_allclose(predicted, expected, rtol=1e-12)
    for name in ("hidden_1", "head"):
        assert adapted[name] is meta["params"][name]


def test_refusals_are_one_line():
    model = mlp_model()
    objective = supervised_objective(model, "regression")
    params, _ = model.init(jax.random.key(0))
    with pytest.raises(
        ValueError, match=r"^algorithm.film_module=norms_2 is not a parameter entry"
    ):
        cavia(objective).init(jax.random.key(0), params)
    with pytest.raises(ValueError, match=r"^algorithm.num_context must be an integer >= 1, got 0"):
        CAVIAConfig(num_context=0)
    from metalearn.models.conv4 import Conv4

    conv = model_from_flax(
        Conv4(5, filters=4, norm_scale=False), (28, 28, 1), ModelParts(head="head")
    )
    learner = cavia(supervised_objective(conv, "classification"), num_context=2)
    # Refused while tracing: shapes suffice, nothing is compiled.
    conv_params, conv_state = jax.eval_shape(conv.init, jax.random.key(0))
    meta = jax.eval_shape(learner.init, jax.random.key(1), conv_params)
    support = (jnp.zeros((5, 28, 28, 1)), jnp.arange(5))
    with pytest.raises(ValueError, match="the output of norms_2 is not affine in its parameters"):
        jax.eval_shape(lambda m, s: learner.adapt(m, s, context(conv_state), 1), meta, support)


def test_a_context_that_would_reach_no_submodule_is_refused():
    """A parameter entry the model never calls as a submodule (here: a model of pure functions,
    no Flax modules to intercept) would leave the context unused: refused in one line."""
    from metalearn.models.base import stateless

    def apply(params, x):
        return jnp.tanh(x @ params["hidden_0"]["kernel"]) @ params["head"]["kernel"]

    def init(key):
        k1, k2 = jax.random.split(key)
        return {
            "hidden_0": {"kernel": jax.random.normal(k1, (1, 4))},
            "head": {"kernel": jax.random.normal(k2, (4, 1))},
        }

    model = stateless(init, apply)
    learner = cavia(
        supervised_objective(model, "regression"), num_context=2, film_module="hidden_0"
    )
    params, state = model.init(jax.random.key(0))
    meta = learner.init(jax.random.key(1), params)
    task = Task((jnp.ones((4, 1)), jnp.ones((4, 1))), (jnp.ones((4, 1)), jnp.ones((4, 1))))
    with pytest.raises(
        ValueError, match=r"^algorithm=cavia feeds the context through .* calls none"
    ):
        jax.jit(learner.task_grad)(meta, task, context(state))  # refused while tracing
