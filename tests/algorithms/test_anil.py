"""ANIL against MAML with per-parameter inner rates that freeze the body."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.algorithms.anil import anil
from metalearn.core import maml_loss
from tests.algorithms.problems import CTX, init_params, sine_model, sine_task


def frozen_body_rates(params, inner_lr):
    """Per-parameter rates: ``inner_lr`` on the head, exactly 0 on the body."""
    return {
        name: jax.tree_util.tree_map(
            lambda p, n=name: jnp.full_like(p, inner_lr if n == "head" else 0.0), sub
        )
        for name, sub in params.items()
    }


@pytest.mark.parametrize("inner_steps, first_order", [(3, False), (2, True)])
def test_gradient_equals_maml_with_the_body_frozen(inner_steps, first_order):
    model = sine_model()
    params = init_params(model)
    task = sine_task(1)
    learner = anil(
        model.objective, inner_lr=0.005, inner_steps=inner_steps, first_order=first_order
    )
    got, aux = jax.jit(learner.task_grad)(params, task, CTX)
    reference = jax.jit(
        jax.grad(maml_loss, argnums=1),
        static_argnums=0,
        static_argnames=["num_steps", "first_order"],
    )
    want = reference(
        model.loss_fn,
        params,
        task.support,
        task.query,
        inner_lr=frozen_body_rates(params, 0.005),
        num_steps=inner_steps,
        first_order=first_order,
    )
    # Head and body gradients both match (the body's through the adapted head).
    chex.assert_trees_all_close(got, want, rtol=2e-4, atol=1e-6)
    assert float(jnp.abs(got["hidden_0"]["kernel"]).sum()) > 0
    adapted = jax.jit(learner.adapt)(params, task.support, CTX)
    np.testing.assert_allclose(aux.metrics["mse"], model.loss_fn(adapted, task.query), rtol=1e-5)


def test_adapt_changes_only_the_head():
    model = sine_model()
    params = init_params(model)
    task = sine_task(1)
    learner = anil(model.objective, inner_lr=0.005)
    adapted = jax.jit(learner.adapt, static_argnums=3)(params, task.support, CTX, 2)
    chex.assert_trees_all_equal(adapted["hidden_0"], params["hidden_0"])
    chex.assert_trees_all_equal(adapted["hidden_1"], params["hidden_1"])
    assert not np.allclose(adapted["head"]["kernel"], params["head"]["kernel"])


def test_model_without_a_declared_head_is_rejected():
    objective = sine_model().objective
    with pytest.raises(ValueError, match="head"):
        anil(objective._replace(model=objective.model._replace(head=())))
    misnamed = objective._replace(model=objective.model._replace(head=("output",)))
    with pytest.raises(ValueError, match="output"):
        anil(misnamed).init(jax.random.key(0), init_params(sine_model()))


@pytest.mark.parametrize(
    "kwargs, key", [({"inner_lr": 0.0}, "inner_lr"), ({"inner_steps": -1}, "inner_steps")]
)
def test_bad_config_values_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=f"algorithm.{key}"):
        anil(sine_model().objective, **kwargs)
