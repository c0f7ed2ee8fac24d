"""Reptile's update against hand-computed inner steps on a quadratic."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from metalearn.algorithms.reptile import reptile
from tests.algorithms.problems import CTX, linear_model, linear_task, quadratic_terms


def hand_sgd(w, batch, lr, steps):
    a, b = quadratic_terms(batch)
    w = np.asarray(w, np.float64)
    for _ in range(steps):
        w = w - lr * (a @ w - b)
    return w


def hand_adam(w, batch, lr, steps, b1, b2=0.999, eps=1e-8):
    a, b = quadratic_terms(batch)
    w = np.asarray(w, np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t in range(1, steps + 1):
        g = a @ w - b
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        w = w - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return w


@pytest.mark.parametrize("steps", [1, 4])
def test_task_grad_is_theta_minus_hand_computed_sgd_iterate(steps):
    w, task = linear_task(seed=1)
    learner = reptile(linear_model(3).objective, inner_lr=0.3, inner_steps=steps)
    grad, _ = jax.jit(learner.task_grad)(w, task, CTX)
    phi = hand_sgd(w, task.support, 0.3, steps)
    np.testing.assert_allclose(grad, np.asarray(w, np.float64) - phi, rtol=1e-5, atol=1e-6)


def test_adam_inner_loop_matches_hand_computed_adam():
    w, task = linear_task(seed=2)
    learner = reptile(
        linear_model(3).objective, inner_lr=0.1, inner_steps=3, inner_optimizer="adam"
    )
    grad, _ = learner.task_grad(w, task, CTX)
    phi = hand_adam(w, task.support, 0.1, 3, b1=0.0)
    np.testing.assert_allclose(grad, np.asarray(w, np.float64) - phi, rtol=1e-4, atol=1e-5)


def test_outer_sgd_gives_the_batched_reptile_update():
    """theta <- theta + epsilon * mean_i(phi_i - theta), Nichol et al. Algorithm 2."""
    learner = reptile(linear_model(3).objective, inner_lr=0.2, inner_steps=3)
    tasks = [linear_task(seed=s)[1] for s in range(4)]
    theta = linear_task(seed=9)[0]
    batch = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *tasks)
    grads, _ = jax.vmap(learner.task_grad, in_axes=(None, 0, None))(theta, batch, CTX)
    epsilon = 0.25
    opt = optax.sgd(epsilon)
    updates, _ = opt.update(grads.mean(0), opt.init(theta), theta)
    got = optax.apply_updates(theta, updates)
    phis = [hand_sgd(theta, t.support, 0.2, 3) for t in tasks]
    theta64 = np.asarray(theta, np.float64)
    want = theta64 + epsilon * np.mean([phi - theta64 for phi in phis], axis=0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_no_gradient_flows_through_the_inner_loop():
    w, task = linear_task(seed=3)
    learner = reptile(linear_model(3).objective, inner_lr=0.3, inner_steps=2)
    # d/dw of sum(adapt(w)) would be prod(I - lr A)^T 1 if the loop were differentiated.
    grad = jax.grad(lambda p: jnp.sum(learner.adapt(p, task.support, CTX)))(w)
    np.testing.assert_array_equal(grad, np.zeros(3))


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"inner_lr": -0.1}, "inner_lr"),
        ({"inner_steps": 0}, "inner_steps"),
        ({"inner_optimizer": "rmsprop"}, "inner_optimizer"),
        ({"adam_b1": 1.0}, "adam_b1"),
    ],
)
def test_bad_config_values_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=f"algorithm.{key}"):
        reptile(linear_model(3).objective, **kwargs)
