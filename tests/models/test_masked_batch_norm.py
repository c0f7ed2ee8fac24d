"""Batch norm in padded (variable-way / variable-shot) episodes: the padding never enters the
batch statistics, so a padded batch gives its real examples the outputs (and running
statistics) of the same batch without padding."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.algorithms.base import context
from metalearn.algorithms.protonet import protonet
from metalearn.data.episodes import episode_distribution
from metalearn.data.task import Task, WeightedBatch, supervised_objective
from metalearn.models.base import batch_moments, model_from_flax
from metalearn.models.conv4 import CONV4_PARTS, Conv4Config, conv4
from metalearn.models.resnet12 import RESNET12_PARTS, ResNet12Config, resnet12

REAL, PADDING = 6, 5


def padded(x: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``x`` with PADDING rows of large values inserted at random places, and the real mask."""
    rng = np.random.default_rng(seed)
    mask = np.zeros(len(x) + PADDING, bool)
    mask[rng.choice(len(mask), len(x), replace=False)] = True
    out = np.empty((len(mask), *x.shape[1:]), np.float32)
    out[mask] = x
    out[~mask] = rng.normal(50.0, 30.0, ((~mask).sum(), *x.shape[1:]))
    return out, mask


def test_batch_moments_match_numpy_over_the_real_examples():
    x = np.random.default_rng(1).normal(2.0, 3.0, (9, 4, 4, 3)).astype(np.float32)
    mask = np.array([1, 0, 1, 1, 0, 0, 1, 1, 0], bool)
    mean, var = batch_moments(jnp.asarray(x), jnp.asarray(mask))
    real = x[mask].reshape(-1, 3).astype(np.float64)
    np.testing.assert_allclose(mean, real.mean(0), rtol=1e-5)
    np.testing.assert_allclose(var, real.var(0), rtol=1e-5)


MODELS = {
    "conv4": lambda: model_from_flax(conv4(5, Conv4Config(filters=8)), (28, 28, 1), CONV4_PARTS),
    "resnet12": lambda: model_from_flax(
        resnet12(5, ResNet12Config(filters=(4, 4, 4, 4), drop_rate=0.0)),
        (16, 16, 3),
        RESNET12_PARTS,
    ),
}
SHAPES = {"conv4": (28, 28, 1), "resnet12": (16, 16, 3)}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("method", ["apply", "embed"])
def test_padded_batch_gives_the_unpadded_outputs_and_statistics(name, method):
    model = MODELS[name]()
    params, state = jax.jit(model.init)(jax.random.key(0))
    x = np.random.default_rng(2).uniform(0, 1, (REAL, *SHAPES[name])).astype(np.float32)
    x_pad, mask = padded(x)
    method_fn = getattr(model, method)
    # compiled programs, not op by op
    call = jax.jit(lambda x, mask=None: method_fn(params, state, None, x, True, mask=mask))
    expected, expected_state = call(jnp.asarray(x))
    out, new_state = call(jnp.asarray(x_pad), mask=jnp.asarray(mask))
    np.testing.assert_allclose(out[mask], expected, rtol=2e-4, atol=2e-5)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6),
        new_state,
        expected_state,
    )
    if state:  # the running statistics moved, so the comparison above compares something
        moved = jax.tree_util.tree_map(lambda a, b: bool(jnp.any(a != b)), new_state, state)
        assert any(jax.tree_util.tree_leaves(moved))


def test_without_the_mask_padding_would_change_the_outputs():
    # The comparison above can fail: the padding does move batch statistics when not masked.
    model = MODELS["conv4"]()
    params, state = jax.jit(model.init)(jax.random.key(0))
    x = np.random.default_rng(2).uniform(0, 1, (REAL, 28, 28, 1)).astype(np.float32)
    x_pad, mask = padded(x)
    apply = jax.jit(lambda x: model.apply(params, state, None, x, True))
    expected, _ = apply(jnp.asarray(x))
    unmasked, _ = apply(jnp.asarray(x_pad))
    assert not np.allclose(unmasked[mask], expected, rtol=1e-2, atol=1e-3)


def drop_padding(batch: WeightedBatch) -> WeightedBatch:
    """The real examples of ``batch`` alone (all of weight 1: absent classes stay masked)."""
    keep = np.asarray(batch.weights) > 0
    inputs, labels = np.asarray(batch.inputs)[keep], np.asarray(batch.labels)[keep]
    return WeightedBatch(jnp.asarray(inputs), jnp.asarray(labels), jnp.ones(len(labels)))


@pytest.fixture(scope="module")
def variable_episode():
    rng = np.random.default_rng(3)
    arrays = {
        s: rng.integers(0, 256, (8, 10, 28, 28, 1), dtype=np.uint8)
        for s in ("train", "val", "test")
    }
    family = episode_distribution(
        arrays, ways=5, num_queries=3, dataset="demo", ways_range=(2, 5), shots_range=(1, 4)
    )
    for seed in range(20):  # an episode with padding in both halves
        task = family.sample(family.splits["train"], jax.random.key(seed), 4)
        if min(task.support.weights) == 0 and min(task.query.weights) == 0:
            return task
    raise AssertionError("no padded episode drawn")


def test_maml_loss_of_a_padded_episode_is_that_of_the_unpadded_one(variable_episode):
    objective = supervised_objective(MODELS["conv4"](), "classification")
    params, state = jax.jit(objective.model.init)(jax.random.key(1))
    task = variable_episode
    loss_fn = jax.jit(lambda batch: objective.loss(params, state, None, batch))
    loss, aux = loss_fn(task.support)
    expected, expected_aux = loss_fn(drop_padding(task.support))
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    np.testing.assert_allclose(aux.metrics["accuracy"], expected_aux.metrics["accuracy"])


def test_protonet_on_a_padded_episode_matches_the_unpadded_one(variable_episode):
    objective = supervised_objective(MODELS["conv4"](), "classification")
    params, state = jax.jit(objective.model.init)(jax.random.key(1))
    learner = protonet(objective)
    task = variable_episode
    unpadded = Task(drop_padding(task.support), drop_padding(task.query))
    evaluate = jax.jit(learner.evaluate, static_argnums=3)
    metrics = evaluate(params, task, context(state), (0,))
    expected = evaluate(params, unpadded, context(state), (0,))
    np.testing.assert_allclose(metrics["loss"], expected["loss"], rtol=1e-4)
    np.testing.assert_allclose(metrics["accuracy"], expected["accuracy"])


class PlainBatchNorm(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = True):
        return nn.Dense(2)(nn.BatchNorm(use_running_average=not train)(x))


def test_a_batch_statistics_model_without_a_mask_is_refused():
    model = model_from_flax(PlainBatchNorm(), (3,))
    params, state = model.init(jax.random.key(0))
    with pytest.raises(ValueError, match="over the batch but its __call__ takes no mask"):
        model.apply(params, state, None, jnp.ones((4, 3)), True, mask=jnp.ones(4, bool))


def test_a_per_example_model_needs_no_mask():
    class Normed(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(2)(nn.LayerNorm()(x))

    model = model_from_flax(Normed(), (3,))
    params, state = model.init(jax.random.key(0))
    x = jnp.arange(12.0).reshape(4, 3)
    out, _ = model.apply(params, state, None, x, True, mask=jnp.array([True, False, True, True]))
    np.testing.assert_array_equal(out, model.apply(params, state, None, x, True)[0])
