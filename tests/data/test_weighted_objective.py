"""Padded (variable-way, variable-shot) episodes through the objective and the algorithms:
padding and absent classes never count."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.algorithms.base import context
from metalearn.algorithms.maml import maml
from metalearn.algorithms.protonet import protonet
from metalearn.data.class_split import ClassSplit
from metalearn.data.episodes import episode_distribution
from metalearn.data.task import Task, WeightedBatch, supervised_objective
from metalearn.models.base import ModelParts, model_from_flax
from metalearn.models.mlp import MLP

MAX_WAYS = 5


def padded_task(seed: int) -> Task:
    """A variable episode (2 to 5 ways, 1 to 3 shots) of flattened 2x2 images."""
    rng = np.random.default_rng(seed)
    classes = [rng.integers(0, 256, (n, 2, 2, 1), dtype=np.uint8) for n in (9, 12, 8, 10, 9, 7)]
    split = ClassSplit.from_classes(classes)
    tasks = episode_distribution(
        {"train": split, "val": split, "test": split},
        ways=MAX_WAYS,
        ways_range=(2, MAX_WAYS),
        shots_range=(1, 3),
        num_queries=3,
        dataset="random",
    )
    task = tasks.sample(tasks.splits["train"], jax.random.key(seed), 3)

    def flat(b):
        return WeightedBatch(b.inputs.reshape(len(b.inputs), -1), b.labels, b.weights)

    return Task(flat(task.support), flat(task.query))


def strip(batch: WeightedBatch) -> WeightedBatch:
    """The real examples only (all weights 1): the same episode without padding."""
    keep = np.asarray(batch.weights) > 0
    return WeightedBatch(batch.inputs[keep], batch.labels[keep], batch.weights[keep])


def model(parts: ModelParts | None = None):
    return model_from_flax(MLP((16, 8), MAX_WAYS), (4,), parts)


@pytest.mark.parametrize("seed", range(4))
def test_weighted_objective_is_the_mean_over_real_examples_of_present_classes(seed):
    task = padded_task(seed)
    m = model()
    objective = supervised_objective(m, "classification")
    params, state = jax.jit(m.init)(jax.random.key(seed))
    key = jax.random.key(9)

    # independent: gather the real rows, keep the present classes' columns
    real = strip(task.query)
    present = np.unique(np.asarray(real.labels))
    targets = np.searchsorted(present, np.asarray(real.labels))

    def by_slicing(p):
        logits = m.apply(p, state, key, real.inputs, True)[0][:, present]
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(log_probs[jnp.arange(len(targets)), targets]), jnp.mean(
            jnp.argmax(logits, -1) == targets
        )

    # compiled programs, not op by op
    (loss, aux), grads = jax.jit(jax.value_and_grad(objective.loss, has_aux=True))(
        params, state, key, task.query
    )
    (expected, accuracy), expected_grads = jax.jit(jax.value_and_grad(by_slicing, has_aux=True))(
        params
    )
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5)
    np.testing.assert_allclose(float(aux.metrics["loss"]), float(expected), rtol=1e-5)
    np.testing.assert_allclose(float(aux.metrics["accuracy"]), float(accuracy))
    for g, e in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-4, atol=1e-6)


def test_weighted_regression_is_the_mean_over_real_examples():
    m = model_from_flax(MLP((8,), 2), (3,))
    objective = supervised_objective(m, "regression")
    params, state = jax.jit(m.init)(jax.random.key(0))
    x, y = (
        jax.random.normal(jax.random.key(1), (6, 3)),
        jax.random.normal(jax.random.key(2), (6, 2)),
    )
    weights = jnp.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    loss, aux = jax.jit(objective.loss)(
        params, state, jax.random.key(3), WeightedBatch(x, y, weights)
    )
    keep = np.asarray(weights) > 0
    apply = jax.jit(m.apply, static_argnums=4)
    outputs = np.asarray(apply(params, state, jax.random.key(3), x, True)[0])
    expected = np.mean((outputs[keep] - np.asarray(y)[keep]) ** 2)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    np.testing.assert_allclose(float(aux.metrics["mse"]), expected, rtol=1e-5)


@pytest.mark.parametrize("algorithm", ["maml", "protonet"])
def test_padding_changes_neither_the_meta_gradient_nor_the_evaluation(algorithm):
    m = model(ModelParts(head="head", embed="embed"))
    objective = supervised_objective(m, "classification")
    learner = maml(objective, inner_lr=0.3, inner_steps=2) if algorithm == "maml" else None
    learner = learner or protonet(objective)
    params, state = jax.jit(m.init)(jax.random.key(1))
    meta_params, ctx = learner.init(jax.random.key(0), params), context(state)
    # compiled programs, not op by op
    task_grad, evaluate = jax.jit(learner.task_grad), jax.jit(learner.evaluate, static_argnums=3)
    padded = 0
    for seed in range(3):
        task = padded_task(seed)
        unpadded = Task(strip(task.support), strip(task.query))
        padded += len(unpadded.support.labels) < len(task.support.labels)
        grads, aux = task_grad(meta_params, task, ctx)
        grads_u, aux_u = task_grad(meta_params, unpadded, ctx)
        for g, e in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_u), strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-4, atol=1e-6)
        for name in ("loss", "accuracy"):
            np.testing.assert_allclose(aux.metrics[name], aux_u.metrics[name], rtol=1e-5)
        evaluated = evaluate(meta_params, task, ctx, (0, 1))
        evaluated_u = evaluate(meta_params, unpadded, ctx, (0, 1))
        np.testing.assert_allclose(evaluated["loss"], evaluated_u["loss"], rtol=1e-5)
    assert padded >= 2  # the comparison is not vacuous
