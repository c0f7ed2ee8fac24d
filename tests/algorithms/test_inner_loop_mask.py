"""Which parameters the inner loop adapts, and the reference code's inner-loss scale.

Checked against hand computations on a linear model, where the inner step, the adapted
parameters and the meta-gradient have closed forms.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.algorithms.base import context, inner_loop_mask, inner_rates
from metalearn.algorithms.maml import fomaml, maml
from metalearn.algorithms.meta_sgd import meta_sgd
from metalearn.data.task import Aux, Objective, Task, supervised_objective
from metalearn.models.base import model_from_flax, stateless
from metalearn.models.conv4 import Conv4Config, conv4
from metalearn.registry import MODELS


def linear_objective() -> Objective:
    """``x @ dense/kernel + norm/bias`` with half the mean squared error; the model declares
    ``norm/bias`` as its normalisation parameter."""
    model = stateless(
        lambda key: {"dense": {"kernel": jnp.zeros(3)}, "norm": {"bias": jnp.zeros(())}},
        lambda p, x: x @ p["dense"]["kernel"] + p["norm"]["bias"],
        norm_paths=frozenset({"norm/bias"}),
    )

    def loss(params, state, key, batch, train=True):
        x, y = batch
        out, state = model.apply(params, state, key, x, train)
        return 0.5 * jnp.mean((out - y) ** 2), Aux(state, {})

    return Objective(model, loss, "loss", False)


def linear_task():
    ks = jax.random.split(jax.random.key(0), 4)
    xs, xq = jax.random.normal(ks[0], (4, 3)), jax.random.normal(ks[1], (6, 3))
    ys, yq = jax.random.normal(ks[2], (4,)), jax.random.normal(ks[3], (6,))
    params = {"dense": {"kernel": jnp.array([0.3, -0.2, 0.5])}, "norm": {"bias": jnp.array(0.7)}}
    return params, Task(support=(xs, ys), query=(xq, yq))


def test_mask_marks_the_declared_normalisation_parameters_only():
    parts = MODELS.entry("conv4").info["parts"]
    model = model_from_flax(conv4(5, Conv4Config(norm_scale=False)), (28, 28, 1), parts)
    params, _ = jax.eval_shape(model.init, jax.random.key(0))  # the tree's paths only
    mask = inner_loop_mask(params, model.norm_paths, adapt_norm=False)
    flat = {jax.tree_util.keystr(p): m for p, m in jax.tree_util.tree_leaves_with_path(mask)}
    assert {k for k, m in flat.items() if not m} == {f"['norms_{i}']['bias']" for i in range(4)}
    assert all(jax.tree_util.tree_leaves(inner_loop_mask(params, model.norm_paths)))
    assert inner_rates(params, 0.4, model.norm_paths, adapt_norm=True) == 0.4
    # Names are not guessed: a parameter called "norm" that the model does not declare adapts.
    assert all(jax.tree_util.tree_leaves(inner_loop_mask(params, frozenset(), adapt_norm=False)))


@pytest.mark.parametrize("factory", [maml, fomaml, meta_sgd])
def test_inner_step_leaves_the_offsets_and_equals_the_hand_step(factory):
    params, task = linear_task()
    lr = 0.3
    learner = factory(linear_objective(), inner_lr=lr, adapt_norm=False)
    adapted = jax.jit(learner.adapt, static_argnums=3)(
        learner.init(jax.random.key(0), params), task.support, context(), 1
    )
    xs, ys = task.support
    w, b = params["dense"]["kernel"], params["norm"]["bias"]
    residual = xs @ w + b - ys
    expected_w = w - lr * xs.T @ residual / len(ys)  # gradient of 0.5 mean(r^2) in w
    np.testing.assert_allclose(adapted["dense"]["kernel"], expected_w, rtol=1e-6)
    assert float(adapted["norm"]["bias"]) == float(b)  # unchanged, exactly
    # Without the mask the offset moves by lr * mean(r).
    free = factory(linear_objective(), inner_lr=lr)
    moved = jax.jit(free.adapt, static_argnums=3)(
        free.init(jax.random.key(0), params), task.support, context(), 1
    )
    np.testing.assert_allclose(moved["norm"]["bias"], b - lr * residual.mean(), rtol=1e-6)


@pytest.mark.parametrize("first_order", [False, True])
def test_offsets_are_meta_learned_with_the_closed_form_meta_gradient(first_order):
    params, task = linear_task()
    lr = 0.3
    learner = maml(linear_objective(), inner_lr=lr, first_order=first_order, adapt_norm=False)
    grads, _ = jax.jit(learner.task_grad)(params, task, context())
    (xs, ys), (xq, yq) = task.support, task.query
    w, b = params["dense"]["kernel"], params["norm"]["bias"]
    w1 = w - lr * xs.T @ (xs @ w + b - ys) / len(ys)
    rq = xq @ w1 + b - yq
    dl_dw1 = xq.T @ rq / len(yq)
    # Adapted bias = bias, and w1 depends on b through the inner gradient (second order only).
    dw1_db = -lr * xs.mean(0)
    expected_b = rq.mean() + (0.0 if first_order else dl_dw1 @ dw1_db)
    np.testing.assert_allclose(grads["norm"]["bias"], expected_b, rtol=1e-5)
    assert abs(float(grads["norm"]["bias"])) > 1e-3  # it does get a meta-gradient


@pytest.mark.parametrize("ways, shots", [(5, 1), (20, 1), (5, 5)])
def test_reference_inner_loss_is_ways_times_the_mean(ways, shots):
    # Finn et al.'s xent: per-example softmax cross-entropy / shots per class, differentiated as a
    # vector (tf.gradients sums it). Its step at alpha equals metalearn's step on the mean
    # cross-entropy at ways * alpha. Closed form for linear logits z = x W:
    # d/dW sum_i CE_i / K = x^T (softmax(z) - onehot(y)) / K.
    alpha = 0.4
    n = ways * shots
    x = jax.random.normal(jax.random.key(1), (n, 7))
    y = jnp.repeat(jnp.arange(ways), shots)
    w = 0.1 * jax.random.normal(jax.random.key(2), (7, ways))

    @jax.jit  # one compiled program, not op by op
    def reference_step(w, x, y):
        probs = jax.nn.softmax(x @ w)
        return w - alpha * x.T @ (probs - jax.nn.one_hot(y, ways)) / shots

    model = stateless(lambda key: w, lambda p, inputs: inputs @ p)
    learner = maml(supervised_objective(model, "classification"), inner_lr=ways * alpha)
    ours = jax.jit(learner.adapt, static_argnums=3)(w, (x, y), context(), 1)
    np.testing.assert_allclose(ours, reference_step(w, x, y), rtol=1e-5, atol=1e-6)
