"""Prototypical Networks: logits against a hand computation, the linear-head equivalence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.algorithms.protonet import protonet, prototypical_logits
from metalearn.data.task import Task
from tests.algorithms.problems import (
    CTX,
    WAYS,
    cluster_model,
    cluster_task,
    init_params,
    sine_model,
    sine_task,
)


def test_logits_equal_a_hand_computation():
    rng = np.random.default_rng(0)
    support, query = rng.normal(size=(7, 4)), rng.normal(size=(5, 4))
    labels = np.array([0, 2, 1, 2, 0, 0, 1])
    got = prototypical_logits(jnp.asarray(support), jnp.asarray(labels), jnp.asarray(query), 3)
    want = np.zeros((5, 3))
    for c in range(3):
        members = [support[i] for i in range(7) if labels[i] == c]
        prototype = sum(members) / len(members)
        for q in range(5):
            want[q, c] = -sum((query[q, d] - prototype[d]) ** 2 for d in range(4))
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_learner_uses_the_embedding_and_masks_absent_classes():
    model = cluster_model()
    params = init_params(model)
    task = cluster_task(jax.random.key(1), shots=2, queries=3)
    learner = protonet(model.objective)
    grads, aux = jax.jit(learner.task_grad)(params, task, CTX)
    metrics = aux.metrics
    emb = lambda x: model.model.embed(params, {}, None, x, True)[0]  # noqa: E731
    logits = prototypical_logits(emb(task.support[0]), task.support[1], emb(task.query[0]), WAYS)
    np.testing.assert_allclose(metrics["loss"], model.loss(logits, task.query[1]), rtol=1e-5)
    # The learner builds prototypes for as many classes as support examples; the extra ones are
    # absent, get -inf and change nothing; every gradient stays finite.
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads))
    np.testing.assert_array_equal(grads["head"]["kernel"], 0.0)
    evaluated = jax.jit(learner.evaluate, static_argnums=3)(params, task, CTX, (0, 1, 10))
    np.testing.assert_allclose(evaluated["accuracy"], [metrics["accuracy"]] * 3)


def test_adapted_head_predicts_like_the_prototypes():
    model = cluster_model()
    params = init_params(model)
    task = cluster_task(jax.random.key(2), shots=3, queries=4)
    learner = protonet(model.objective)
    adapted = jax.jit(learner.adapt, static_argnums=3)(params, task.support, CTX, 0)
    emb = lambda x: model.model.embed(params, {}, None, x, True)[0]  # noqa: E731
    logits = prototypical_logits(emb(task.support[0]), task.support[1], emb(task.query[0]), WAYS)
    head_logits = model.apply(adapted, task.query[0])
    np.testing.assert_allclose(
        jax.nn.softmax(head_logits), jax.nn.softmax(logits), rtol=1e-4, atol=1e-6
    )


def test_needs_an_embedding_and_classification_tasks():
    model = sine_model()
    with pytest.raises(ValueError, match="embed"):
        protonet(model.objective._replace(model=model.model._replace(embed=None)))
    learner = protonet(model.objective)
    task = sine_task(1)
    with pytest.raises(ValueError, match="classification"):
        learner.task_grad(init_params(model), task, CTX)
    with pytest.raises(ValueError, match="classification"):
        learner.evaluate(init_params(model), task, CTX, (0,))


def test_float_labels_are_rejected_even_for_a_classifier():
    model = cluster_model()
    task = cluster_task(jax.random.key(0))
    floats = Task(
        (task.support[0], task.support[1].astype(jnp.float32)),
        (task.query[0], task.query[1].astype(jnp.float32)),
    )
    with pytest.raises(ValueError, match="integer class labels"):
        protonet(model.objective).task_grad(init_params(model), floats, CTX)
