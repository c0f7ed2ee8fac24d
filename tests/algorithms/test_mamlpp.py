"""MAML++ against MAML, FOMAML and hand-built multi-step losses; per-step norm parameters."""

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from metalearn.algorithms.base import context
from metalearn.algorithms.maml import maml
from metalearn.algorithms.mamlpp import mamlpp, multi_step_loss_weights
from metalearn.config import to_objects
from metalearn.core import maml_loss
from metalearn.data.task import supervised_objective
from metalearn.models.base import ModelParts, model_from_flax
from metalearn.runner.experiment import learning_rate
from tests.algorithms.problems import (
    CTX,
    init_params,
    problem,
    random_like,
    sine_task,
    small_sine_model,
    to64,
    tree_vdot,
)
from tests.conftest import compose_config

ONE_TASK = sine_task(1)


small_model = small_sine_model


def at(progress: float):
    """The context of step ``progress * 1000`` of a 1,000-step run."""
    return context(step=round(progress * 1000), meta_steps=1000)


def norm_net():
    return problem(model_from_flax(NormNet(), (1,), ModelParts(head="head")), "regression")


class NormNet(nn.Module):
    """Dense -> LayerNorm (learnable scale/bias, current-batch statistics) -> tanh -> head."""

    @nn.compact
    def __call__(self, x):
        x = jnp.tanh(nn.LayerNorm(name="LayerNorm_0")(nn.Dense(8, name="hidden_0")(x)))
        return nn.Dense(1, name="head")(x)


@pytest.mark.parametrize("num_steps", [1, 3, 6])
@pytest.mark.parametrize("progress", [0.0, 0.03, 0.06, 0.2, 1.0])
def test_loss_weights_sum_to_one_and_end_on_the_last_step(num_steps, progress):
    w = np.asarray(multi_step_loss_weights(progress, num_steps, 0.1))
    np.testing.assert_allclose(w.sum(), 1.0, rtol=1e-6)
    assert np.all(w >= 0) and w[-1] == w.max()
    if progress >= 0.1:
        np.testing.assert_array_equal(w, np.eye(num_steps)[-1])
    if progress == 0.0:
        np.testing.assert_allclose(w, np.full(num_steps, 1 / num_steps), rtol=1e-6)


def test_gradient_is_the_weighted_maml_gradient_with_order_and_weights_following_progress():
    """One compiled step, three phases of training (msl_fraction 0.1, first_order_fraction 0.02):
    progress 0.01, multi-step loss, first order; 0.04, multi-step loss, second order; 0.5, all
    weight on the last step, second order: exactly MAML, since the LSLR rates all equal the
    scalar. The reference is sum_k w_k grad maml_loss(k steps), from core."""
    model = small_model()
    params = init_params(model)
    learner = mamlpp(
        model.objective, inner_lr=0.05, inner_steps=3, msl_fraction=0.1, first_order_fraction=0.02
    )
    meta = learner.init(jax.random.key(0), params)
    step = jax.jit(learner.task_grad)

    @functools.partial(jax.jit, static_argnums=2)
    def reference(p, weights, first_order):
        def weighted(q):
            losses = [
                maml_loss(
                    model.loss_fn,
                    q,
                    ONE_TASK.support,
                    ONE_TASK.query,
                    inner_lr=0.05,
                    num_steps=k,
                    first_order=first_order,
                )
                for k in (1, 2, 3)
            ]
            return sum(w * loss for w, loss in zip(weights, losses, strict=True))

        return jax.grad(weighted)(p)

    for progress, first_order in [(0.01, True), (0.04, False), (0.5, False)]:
        weights = multi_step_loss_weights(progress, 3, 0.1)
        got, aux = step(meta, ONE_TASK, at(progress))
        want = reference(params, weights, first_order)
        chex.assert_trees_all_close(got["params"], want, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(weights, [0.0, 0.0, 1.0])
    maml_grad, maml_aux = jax.jit(maml(model.objective, inner_lr=0.05, inner_steps=3).task_grad)(
        params, ONE_TASK, CTX
    )
    chex.assert_trees_all_close(got["params"], maml_grad, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(aux.metrics["mse"], maml_aux.metrics["mse"], rtol=1e-6)
    assert step._cache_size() == 1


def test_per_step_rate_gradient_matches_finite_differences():
    model = small_model()
    progress = 0.05
    with jax.enable_x64(True):
        learner = mamlpp(model.objective, inner_lr=0.05, inner_steps=2, first_order_fraction=0)
        meta = to64(learner.init(jax.random.key(0), init_params(model)))
        task = to64(ONE_TASK)
        grads, _ = jax.jit(learner.task_grad)(meta, task, at(progress))

        @jax.jit
        def loss_of_rates(rates):  # the multi-step loss, built from adapt for 1 and 2 steps
            mp = {**meta, "inner_lr_scale": rates}
            w = multi_step_loss_weights(progress, 2, 0.1)
            traj = [learner.adapt(mp, task.support, CTX, k) for k in (1, 2)]
            return sum(wk * model.loss_fn(p, task.query) for wk, p in zip(w, traj, strict=True))

        check_grads(loss_of_rates, (meta["inner_lr_scale"],), order=1, modes=["rev"])
        direction = random_like(meta["inner_lr_scale"], jax.random.key(3))
        h = 1e-6
        bumped = lambda s: jax.tree_util.tree_map(  # noqa: E731
            lambda r, d: r + s * h * d, meta["inner_lr_scale"], direction
        )
        numeric = (loss_of_rates(bumped(1)) - loss_of_rates(bumped(-1))) / (2 * h)
        np.testing.assert_allclose(
            tree_vdot(grads["inner_lr_scale"], direction), numeric, rtol=1e-6
        )


def test_per_step_norm_copies_are_swapped_in_and_add_up_to_the_maml_gradient():
    model = norm_net()
    params = init_params(model)
    learner = mamlpp(
        model.objective, inner_lr=0.05, inner_steps=2, msl_fraction=0, first_order_fraction=0
    )
    meta = learner.init(jax.random.key(0), params)
    assert sorted(meta["norm"]) == ["LayerNorm_0/bias", "LayerNorm_0/scale"]
    assert "LayerNorm_0/scale" not in meta["inner_lr_scale"]
    assert meta["norm"]["LayerNorm_0/scale"].shape == (2, 8)

    # Norm parameters are not adapted; after k steps the forward pass uses copy k.
    marked = {
        **meta,
        "norm": {**meta["norm"], "LayerNorm_0/bias": jnp.array([[1.0] * 8, [2.0] * 8])},
    }
    adapted = jax.jit(learner.adapt, static_argnums=3)(marked, ONE_TASK.support, CTX, 2)
    np.testing.assert_array_equal(adapted["LayerNorm_0"]["bias"], np.full(8, 2.0))

    # With all copies equal (as at init), the gradients of a norm parameter and of its copies add
    # up to MAML's gradient for it with a zero inner rate on it (chain rule).
    grads, _ = jax.jit(learner.task_grad)(meta, ONE_TASK, at(0.5))
    rates = {
        name: jax.tree_util.tree_map(
            lambda p, n=name: jnp.full_like(p, 0.0 if "Norm" in n else 0.05), sub
        )
        for name, sub in params.items()
    }
    want = jax.jit(jax.grad(maml_loss, argnums=1), static_argnums=0, static_argnames="num_steps")(
        model.loss_fn, params, ONE_TASK.support, ONE_TASK.query, inner_lr=rates, num_steps=2
    )
    for leaf in ("bias", "scale"):
        total = grads["params"]["LayerNorm_0"][leaf] + grads["norm"][f"LayerNorm_0/{leaf}"].sum(0)
        np.testing.assert_allclose(total, want["LayerNorm_0"][leaf], rtol=1e-4, atol=1e-7)
    chex.assert_trees_all_close(grads["params"]["head"], want["head"], rtol=1e-4, atol=1e-7)
    chex.assert_trees_all_close(grads["params"]["hidden_0"], want["hidden_0"], rtol=1e-4, atol=1e-7)


def test_evaluating_past_inner_steps_reuses_the_last_rates_and_norm_copy():
    model = norm_net()
    learner = mamlpp(model.objective, inner_lr=0.05, inner_steps=2)
    meta = learner.init(jax.random.key(0), init_params(model))
    evaluated = jax.jit(learner.evaluate, static_argnums=3)(meta, ONE_TASK, CTX, (0, 2, 4))
    adapt = jax.jit(learner.adapt, static_argnums=3)
    for i, k in enumerate((0, 2, 4)):
        adapted = adapt(meta, ONE_TASK.support, CTX, k)
        np.testing.assert_allclose(
            evaluated["mse"][i], model.loss_fn(adapted, ONE_TASK.query), rtol=1e-5
        )


def test_conv4_batch_norm_parameters_get_per_step_copies():
    from metalearn.models.conv4 import CONV4_PARTS, Conv4

    model = model_from_flax(Conv4(5, filters=4), (28, 28, 1), CONV4_PARTS)
    learner = mamlpp(supervised_objective(model, "classification"), inner_steps=3)
    meta = jax.eval_shape(lambda k: learner.init(k, model.init(k)[0]), jax.random.key(0))
    assert sorted(meta["norm"]) == [f"norms_{i}/{p}" for i in range(4) for p in ("bias", "scale")]
    assert meta["norm"]["norms_0/scale"].shape == (3, 4)
    assert sorted(meta["inner_lr_scale"]) == sorted(
        [f"convs_{i}/{p}" for i in range(4) for p in ("bias", "kernel")]
        + ["head/bias", "head/kernel"]
    )


def test_cosine_meta_learning_rate_is_recommended_and_the_experiment_decides():
    """conf/algorithm/mamlpp.yaml asks for a cosine outer schedule in optimizer.*, its one home;
    the command line (or an experiment) overrides it, and no other algorithm touches it."""
    cfg = to_objects(compose_config(["algorithm=mamlpp", "optimizer.lr=1e-3"]))
    assert (cfg.optimizer.schedule, cfg.optimizer.final_lr_fraction) == ("cosine", 0.01)
    schedule = learning_rate(cfg.optimizer, 1000)
    np.testing.assert_allclose(
        [schedule(0), schedule(500), schedule(1000)], [1e-3, 5.05e-4, 1e-5], rtol=1e-5
    )
    overridden = compose_config(["algorithm=mamlpp", "optimizer.schedule=constant"])
    assert to_objects(overridden).optimizer.schedule == "constant"
    warm = compose_config(["algorithm=mamlpp", "optimizer.warmup_steps=10"])
    assert to_objects(warm).optimizer.warmup_steps == 10
    assert to_objects(compose_config(["algorithm=maml"])).optimizer.schedule == "constant"


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"inner_lr": -1.0}, "inner_lr"),
        ({"inner_steps": 0}, "inner_steps"),
        ({"msl_fraction": 1.5}, "msl_fraction"),
        ({"first_order_fraction": -0.1}, "first_order_fraction"),
    ],
)
def test_bad_config_values_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=f"algorithm.{key}"):
        mamlpp(small_model(), **kwargs)
