"""BOIL against a hand-written inner loop on the body alone, its meta-gradient against finite
differences, and the head held at its meta-value by ``adapt``."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.algorithms.boil import boil
from tests.algorithms.problems import (
    CTX,
    init_params,
    random_like,
    sine_model,
    sine_task,
    small_sine_model,
    to64,
    tree_vdot,
)


def hand_boil_loss(loss_fn, params, support, query, inner_lr, steps, first_order=False):
    """The query loss after ``steps`` SGD steps on every entry but ``"head"``, written out: the
    body's gradient by ``jax.grad`` of a function of the body alone, the head a constant of
    the inner loop (but not of the outer one)."""
    head = params["head"]
    body = {k: v for k, v in params.items() if k != "head"}
    for _ in range(steps):
        g = jax.grad(lambda b: loss_fn({**b, "head": head}, support))(body)
        if first_order:
            g = jax.lax.stop_gradient(g)
        body = jax.tree_util.tree_map(lambda p, d: p - inner_lr * d, body, g)
    return loss_fn({**body, "head": head}, query)


@pytest.mark.parametrize("inner_steps, first_order", [(3, False), (2, True)])
def test_gradient_equals_a_hand_written_body_only_inner_loop(inner_steps, first_order):
    model = sine_model()
    params = init_params(model)
    task = sine_task(1)
    learner = boil(
        model.objective, inner_lr=0.005, inner_steps=inner_steps, first_order=first_order
    )
    got, aux = jax.jit(learner.task_grad)(params, task, CTX)
    want = jax.jit(
        jax.grad(
            lambda p: hand_boil_loss(
                model.loss_fn, p, task.support, task.query, 0.005, inner_steps, first_order
            )
        )
    )(params)
    chex.assert_trees_all_close(got, want, rtol=2e-4, atol=1e-6)
    # the head's outer gradient is there (the outer loop trains it) and so is the body's
    assert float(jnp.abs(got["head"]["kernel"]).sum()) > 0
    assert float(jnp.abs(got["hidden_0"]["kernel"]).sum()) > 0
    adapted = jax.jit(learner.adapt)(params, task.support, CTX)
    np.testing.assert_allclose(aux.metrics["mse"], model.loss_fn(adapted, task.query), rtol=1e-5)


def test_adapt_changes_everything_but_the_head():
    model = sine_model()
    params = init_params(model)
    task = sine_task(1)
    learner = boil(model.objective, inner_lr=0.005)
    adapted = jax.jit(learner.adapt, static_argnums=3)(params, task.support, CTX, 2)
    chex.assert_trees_all_equal(adapted["head"], params["head"])
    for name in ("hidden_0", "hidden_1"):
        assert not np.allclose(adapted[name]["kernel"], params[name]["kernel"])
    evaluated = jax.jit(learner.evaluate, static_argnums=3)(params, task, CTX, (0, 2))
    np.testing.assert_allclose(
        evaluated["mse"],
        [model.loss_fn(params, task.query), model.loss_fn(adapted, task.query)],
        rtol=1e-5,
    )


def test_meta_gradient_equals_finite_differences_in_float64():
    model = small_sine_model()
    with jax.enable_x64(True):
        params = to64(init_params(model))
        task = to64(sine_task(2))
        learner = boil(model.objective, inner_lr=0.1, inner_steps=2)
        grads, _ = learner.task_grad(params, task, CTX)
        loss = lambda p: learner.task_grad(p, task, CTX)[1].metrics["mse"]  # noqa: E731
        eps = 1e-6
        for part in ("head", "hidden_0"):  # the frozen head and an adapted entry, each alone
            direction = {
                k: random_like(v, jax.random.key(3))
                if k == part
                else jax.tree_util.tree_map(jnp.zeros_like, v)
                for k, v in params.items()
            }

            def moved(s, d=direction):
                return jax.tree_util.tree_map(lambda p, v: p + s * v, params, d)  # noqa: B023

            numeric = (loss(moved(eps)) - loss(moved(-eps))) / (2 * eps)
            analytic = tree_vdot(grads, direction)
            np.testing.assert_allclose(analytic, numeric, rtol=1e-6)
            assert abs(float(numeric)) > 1e-6


def test_model_without_a_declared_head_is_rejected():
    objective = sine_model().objective
    with pytest.raises(ValueError, match=r"^algorithm=boil needs a model that declares its head"):
        boil(objective._replace(model=objective.model._replace(head=())))
    misnamed = objective._replace(model=objective.model._replace(head=("output",)))
    with pytest.raises(
        ValueError, match=r"^algorithm=boil: the declared head entries \['output'\]"
    ):
        boil(misnamed).init(jax.random.key(0), init_params(sine_model()))


@pytest.mark.parametrize(
    "kwargs, key", [({"inner_lr": 0.0}, "inner_lr"), ({"inner_steps": -1}, "inner_steps")]
)
def test_bad_config_values_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=f"algorithm.{key}"):
        boil(sine_model().objective, **kwargs)
