"""Meta-SGD: learned per-parameter rates, gradients checked by finite differences."""

import chex
import jax
import numpy as np
import pytest
from jax.test_util import check_grads

from metalearn.algorithms.maml import maml
from metalearn.algorithms.meta_sgd import meta_sgd
from tests.algorithms.problems import (
    CTX,
    init_params,
    random_like,
    sine_task,
    small_sine_model,
    to64,
    tree_vdot,
)


def small_problem():
    model = small_sine_model()
    return model, init_params(model), sine_task(1)


def test_init_sets_every_rate_to_the_configured_value():
    model, params, _ = small_problem()
    meta = meta_sgd(model.objective, inner_lr=0.03).init(jax.random.key(0), params)
    chex.assert_trees_all_equal_shapes(meta["inner_lr"], params)
    for rate in jax.tree_util.tree_leaves(meta["inner_lr"]):
        np.testing.assert_allclose(rate, 0.03)


def test_rate_gradient_matches_finite_differences(num_steps=2):
    model, params, task = small_problem()
    with jax.enable_x64(True):
        learner = meta_sgd(model.objective, inner_lr=0.05, inner_steps=num_steps)
        meta = to64(learner.init(jax.random.key(0), params))
        task64 = to64(task)

        @jax.jit
        def query_loss_of_rates(rates):
            adapted = learner.adapt(
                {"params": meta["params"], "inner_lr": rates}, task64.support, CTX
            )
            return model.loss_fn(adapted, task64.query)

        check_grads(query_loss_of_rates, (meta["inner_lr"],), order=1, modes=["rev"])
        # task_grad returns that gradient: central differences along a random direction.
        grads, _ = jax.jit(learner.task_grad)(meta, task64, CTX)
        direction = random_like(meta["inner_lr"], jax.random.key(5))
        h = 1e-6
        shifted = lambda s: jax.tree_util.tree_map(  # noqa: E731
            lambda r, d: r + s * h * d, meta["inner_lr"], direction
        )
        numeric = (query_loss_of_rates(shifted(1)) - query_loss_of_rates(shifted(-1))) / (2 * h)
        np.testing.assert_allclose(tree_vdot(grads["inner_lr"], direction), numeric, rtol=1e-6)


def test_with_rates_fixed_the_params_gradient_is_maml():
    model, params, task = small_problem()
    learner = meta_sgd(model.objective, inner_lr=0.05, inner_steps=2)
    grads, _ = jax.jit(learner.task_grad)(learner.init(jax.random.key(0), params), task, CTX)
    want, _ = jax.jit(maml(model.objective, inner_lr=0.05, inner_steps=2).task_grad)(
        params, task, CTX
    )
    chex.assert_trees_all_close(grads["params"], want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "kwargs, key", [({"inner_lr": -0.01}, "inner_lr"), ({"inner_steps": 0}, "inner_steps")]
)
def test_bad_config_values_name_the_key(kwargs, key):
    model, _, _ = small_problem()
    with pytest.raises(ValueError, match=f"algorithm.{key}"):
        meta_sgd(model.objective, **kwargs)
