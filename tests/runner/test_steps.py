"""Task batching: every strategy gives the same meta-step; the CPU default for conv models."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from metalearn.algorithms.maml import maml
from metalearn.data.episodes import episode_distribution
from metalearn.data.task import family_objective
from metalearn.models.base import model_from_flax, stateless
from metalearn.models.conv4 import CONV4_PARTS, Conv4Config, conv4
from metalearn.runner import steps
from metalearn.runner.steps import (
    TrainState,
    make_meta_step,
    make_meta_train_step,
    resolve_task_batching,
)


def tiny_conv_experiment(conv: str):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (12, 4, 28, 28, 1), dtype=np.uint8)
    tasks = episode_distribution(
        {"train": images, "val": images, "test": images}, ways=3, num_queries=2, dataset="toy"
    )
    module = conv4(tasks.num_outputs, Conv4Config(filters=4, conv=conv))
    model = model_from_flax(module, tasks.input_shape, CONV4_PARTS)
    return tasks, model, maml(family_objective(tasks, model), inner_lr=0.4, inner_steps=2)


@pytest.mark.parametrize("conv", ["im2col", pytest.param("xla", marks=pytest.mark.slow)])
def test_every_task_batching_gives_the_same_meta_step(conv):
    tasks, model, learner = tiny_conv_experiment(conv)
    optimizer = optax.sgd(1.0)  # the update is the meta-gradient itself
    params = learner.init(jax.random.key(1), model.init(jax.random.key(0))[0])
    # (inner rate 0.4 on this toy: other initialisations make the meta-step chaotic, and
    # float-level differences between strategies grow to percents)
    state = TrainState(jnp.asarray(0, jnp.int32), params, {}, optimizer.init(params))
    results = {}
    for strategy in ("vmap", "map", "map2", "unroll"):
        train_step = make_meta_train_step(
            learner, optimizer, meta_steps=10, strategy=strategy, key=jax.random.key(3)
        )
        step = make_meta_step(
            train_step, tasks, train_key=jax.random.key(2), meta_batch_size=4, shots=1
        )
        results[strategy] = jax.jit(step)(state, tasks.splits["train"])
    for strategy in ("map", "map2", "unroll"):
        for got, want in zip(
            jax.tree_util.tree_leaves(results[strategy]),
            jax.tree_util.tree_leaves(results["vmap"]),
            strict=True,
        ):
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-6)
    moved = jax.tree_util.tree_map(lambda a, b: jnp.abs(a - b).max(), results["map"][0], state)
    assert float(max(jax.tree_util.tree_leaves(moved.meta_params))) > 0  # a real step


def test_cpu_default_batching_is_map_for_conv_models_and_vmap_for_dense(monkeypatch):
    """The model declares whether it is convolutional; parameter shapes say nothing."""
    conv_params = stateless(lambda k: {"w": jnp.zeros((4, 4))}, None, is_convolutional=True)
    dense_params = stateless(lambda k: {"w": jnp.zeros((3, 3, 1, 4))}, None)
    monkeypatch.setattr(steps.jax, "default_backend", lambda: "cpu")
    assert resolve_task_batching("auto", conv_params) == "map"
    assert resolve_task_batching("auto", dense_params) == "vmap"
    assert resolve_task_batching("unroll", conv_params) == "unroll"
    monkeypatch.setattr(steps.jax, "default_backend", lambda: "gpu")
    assert resolve_task_batching("auto", conv_params) == "vmap"


def test_mean_over_tasks_handles_pytrees_and_integer_metrics():
    tasks = {"x": jnp.arange(12.0).reshape(4, 3), "n": jnp.arange(4)}

    def fn(task):
        return {"sum": jnp.sum(task["x"]), "n": task["n"]}, task["x"] * 2

    for strategy, in_carry in [("vmap", True), ("map", True), ("map", False), ("unroll", True)]:
        (metrics, doubled) = steps.mean_over_tasks(fn, tasks, strategy, in_carry=in_carry)
        assert float(metrics["sum"]) == pytest.approx(16.5)
        assert float(metrics["n"]) == pytest.approx(1.5)
        np.testing.assert_allclose(doubled, jnp.arange(12.0).reshape(4, 3).mean(0) * 2)
