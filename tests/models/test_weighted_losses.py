"""Weighted (masked) cross-entropy and accuracy against means computed by hand."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metalearn.data.class_split import ClassSplit
from metalearn.data.episodes import episode_distribution
from metalearn.models.weighted_losses import (
    weighted_accuracy,
    weighted_classification_metrics,
    weighted_cross_entropy,
)


def by_hand(logits: np.ndarray, labels: np.ndarray, keep: np.ndarray) -> tuple[float, float]:
    """Mean cross-entropy and accuracy over the kept examples only, in float64 numpy."""
    z = logits[keep].astype(np.float64)
    log_probs = z - z.max(1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(1, keepdims=True))
    y = labels[keep]
    return float(-log_probs[np.arange(len(y)), y].mean()), float((z.argmax(1) == y).mean())


def test_masked_mean_is_the_mean_over_the_unmasked_examples():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(40, 7)).astype(np.float32) * 3
    labels = rng.integers(0, 7, 40)
    keep = rng.random(40) < 0.6
    labels = np.where(keep, labels, -1)  # padding as the sampler writes it
    logits[~keep] = np.where(rng.random((int((~keep).sum()), 7)) < 0.5, np.nan, -np.inf)
    weights = keep.astype(np.float32)
    loss, accuracy = by_hand(logits, labels, keep)
    np.testing.assert_allclose(float(weighted_cross_entropy(logits, labels, weights)), loss, 1e-5)
    np.testing.assert_allclose(float(weighted_accuracy(logits, labels, weights)), accuracy, 1e-6)


def test_all_ones_weights_give_the_unweighted_mean():
    rng = np.random.default_rng(1)
    logits, labels = rng.normal(size=(12, 5)).astype(np.float32), rng.integers(0, 5, 12)
    metrics = weighted_classification_metrics(logits, labels, np.ones(12, np.float32))
    plain = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    np.testing.assert_allclose(float(metrics["loss"]), float(plain), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["accuracy"]), np.mean(logits.argmax(1) == labels))


def test_padding_gets_a_zero_finite_gradient():
    logits = jnp.array([[1.0, 2.0, -jnp.inf], [3.0, -jnp.inf, 0.0], [0.5, 0.5, 0.5]])
    labels, weights = jnp.array([1, -1, 2]), jnp.array([1.0, 0.0, 1.0])
    grads = jax.grad(weighted_cross_entropy)(logits, labels, weights)
    assert np.isfinite(np.asarray(grads)).all()
    np.testing.assert_array_equal(grads[1], 0.0)
    softmax = jax.nn.softmax(logits[jnp.array([0, 2])], axis=-1)
    expected = (softmax - jax.nn.one_hot(jnp.array([1, 2]), 3)) / 2
    np.testing.assert_allclose(grads[jnp.array([0, 2])], expected, atol=1e-6)


def test_loss_of_a_variable_episode_equals_the_loss_on_its_real_examples():
    rng = np.random.default_rng(2)
    classes = [rng.integers(0, 256, (n, 2, 2, 1), dtype=np.uint8) for n in (9, 12, 8, 10, 9)]
    split = ClassSplit.from_classes(classes)
    tasks = episode_distribution(
        {"train": split, "val": split, "test": split},
        ways=3,
        ways_range=(2, 5),
        num_queries=3,
        dataset="random",
    )
    w = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)

    def loss_and_accuracy(batch):
        logits = batch.inputs.reshape(len(batch.inputs), -1) @ w
        return weighted_classification_metrics(logits, batch.labels, batch.weights), logits

    for seed in range(5):
        task = tasks.sample(tasks.splits["train"], jax.random.key(seed), (1, 4))
        for half in task:
            metrics, logits = jax.jit(loss_and_accuracy)(half)
            keep = np.asarray(half.weights) == 1
            loss, accuracy = by_hand(np.asarray(logits), np.asarray(half.labels), keep)
            np.testing.assert_allclose(float(metrics["loss"]), loss, rtol=1e-5)
            np.testing.assert_allclose(float(metrics["accuracy"]), accuracy, rtol=1e-6)
