"""Small problems the algorithm tests share: a linear model, sinusoid and Gaussian-cluster tasks,
and a jitted meta-training loop built on the library's ``meta_train_step``."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from metalearn.algorithms.base import context
from metalearn.data.sinusoid import sample_sinusoid_task
from metalearn.data.task import (
    Aux,
    Objective,
    Task,
    classification_metrics,
    cross_entropy_loss,
    mse_loss,
    regression_metrics,
    supervised_objective,
)
from metalearn.models.base import ModelParts, model_from_flax, stateless
from metalearn.models.mlp import MLP
from metalearn.runner.steps import TrainState, make_meta_train_step

CTX = context()  # stateless models, no randomness, step 0


class Problem(NamedTuple):
    """A supervised model the tests drive directly: ``objective`` for the learners, and the
    pieces of its loss for the independent computations (``init(key) -> params``,
    ``apply(params, x)``, ``loss(outputs, y)``, ``loss_fn(params, (x, y))``)."""

    objective: Objective
    init: Any
    apply: Any
    loss: Any
    metrics: Any

    def loss_fn(self, params, batch):
        x, y = batch
        return self.loss(self.apply(params, x), y)

    @property
    def model(self):
        return self.objective.model


def problem(model, kind: str) -> Problem:
    """A :class:`Problem` from a stateless :class:`~metalearn.models.base.Model`."""
    loss, metrics = (
        (mse_loss, regression_metrics)
        if kind == "regression"
        else (cross_entropy_loss, classification_metrics)
    )
    return Problem(
        supervised_objective(model, kind),
        lambda key: model.init(key)[0],
        lambda params, x: model.apply(params, {}, None, x, False)[0],
        loss,
        metrics,
    )


def to64(tree):
    """Every leaf as float64 (inside ``jax.enable_x64``)."""
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), tree)


def random_like(tree, key: jax.Array):
    """A standard-normal pytree shaped like ``tree``."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = jax.random.split(key, len(leaves))
    return treedef.unflatten(
        [jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)]
    )


def tree_vdot(a, b) -> jax.Array:
    pairs = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    return sum(jnp.vdot(x, y) for x, y in pairs)


def linear_model(dim: int, activation=None) -> Problem:
    """``apply(w, x) = x @ w`` with loss ``0.5 * mean((x w - y)^2)``: a quadratic in ``w``
    (``activation(x @ w)`` with an ``activation``)."""

    def loss(outputs, targets):
        return 0.5 * jnp.mean((outputs - targets) ** 2)

    def x_at(w, x):
        return x @ w if activation is None else activation(x @ w)

    def objective_loss(params, model_state, key, batch, train=True):
        value = loss(x_at(params, batch[0]), batch[1])
        return value, Aux(model_state, {"loss": value})

    def gn_predict(params, model_state, key, batch):
        return x_at(params, batch[0])

    model = stateless(lambda key: jnp.zeros(dim), x_at)
    objective = Objective(
        model, objective_loss, "loss", False, (gn_predict, lambda out, b: loss(out, b[1]))
    )
    return Problem(
        objective,
        lambda key: jnp.zeros(dim),
        x_at,
        loss,
        lambda outputs, targets: {"loss": loss(outputs, targets)},
    )


def linear_task(seed: int = 0, n: int = 8, dim: int = 3, dtype=np.float32) -> tuple:
    """``(w, Task)`` of random linear-regression data; ``Task`` arrays in ``dtype``."""
    rng = np.random.default_rng(seed)
    xs, ys, xq, yq = (
        rng.normal(size=(n, dim)),
        rng.normal(size=n),
        rng.normal(size=(n, dim)),
        rng.normal(size=n),
    )
    cast = lambda a: jnp.asarray(a, dtype)  # noqa: E731
    return cast(rng.normal(size=dim)), Task((cast(xs), cast(ys)), (cast(xq), cast(yq)))


def quadratic_terms(batch) -> tuple[np.ndarray, np.ndarray]:
    """``(A, b)`` with ``0.5 mean((x w - y)^2) = 0.5 w^T A w - b^T w + const``, in float64."""
    x, y = (np.asarray(a, np.float64) for a in batch)
    return x.T @ x / len(y), x.T @ y / len(y)


# Models, parameters and single tasks are built once per session: on a 2-core CPU most of the
# cost of these tests is XLA compilation, and every distinct shape compiles anew.


@functools.cache
def sine_model() -> Problem:
    """Finn et al.'s 1-40-40-1 MLP, with its head and embedding declared."""
    parts = ModelParts(head="head", embed="embed")
    return problem(model_from_flax(MLP((40, 40), 1), (1,), parts), "regression")


@functools.cache
def small_sine_model() -> Problem:
    """A 1-8-8-1 tanh MLP, for float64 and finite-difference checks."""
    model = model_from_flax(MLP((8, 8), 1, "tanh"), (1,), ModelParts(head="head"))
    return problem(model, "regression")


@functools.cache
def init_params(model: Problem, seed: int = 0):
    return jax.jit(model.init)(jax.random.key(seed))


@functools.cache
def sine_task(seed: int = 1, shots: int = 5) -> Task:
    """One sinusoid task with ``shots`` support and 10 query points."""
    sample = jax.jit(sample_sinusoid_task, static_argnums=(1, 2))
    return sample(jax.random.key(seed), shots, 10)


@functools.partial(jax.jit, static_argnums=(1, 2))
def sine_tasks(key: jax.Array, count: int, shots: int = 10) -> Task:
    """``count`` sinusoid tasks stacked on a leading axis."""
    keys = jax.random.split(key, count)
    return jax.vmap(lambda k: sample_sinusoid_task(k, shots, 10))(keys)


# Gaussian clusters: class means differ in the first INFORMATIVE input dimensions only; the other
# dimensions carry large per-example noise. Distances in input space (or in a random embedding)
# are dominated by the noise; an embedding that learns to drop those dimensions separates classes.
WAYS, DIM, INFORMATIVE = 5, 16, 4


@functools.partial(jax.jit, static_argnums=(1, 2))
def cluster_task(key: jax.Array, shots: int = 5, queries: int = 5) -> Task:
    k_means, k_support, k_query = jax.random.split(key, 3)
    means = (
        jnp.zeros((WAYS, DIM))
        .at[:, :INFORMATIVE]
        .set(2.0 * jax.random.normal(k_means, (WAYS, INFORMATIVE)))
    )
    scale = jnp.concatenate([jnp.full(INFORMATIVE, 0.5), jnp.full(DIM - INFORMATIVE, 3.0)])

    def draw(k, n):
        labels = jnp.repeat(jnp.arange(WAYS), n)
        return means[labels] + scale * jax.random.normal(k, (WAYS * n, DIM)), labels

    return Task(draw(k_support, shots), draw(k_query, queries))


@functools.partial(jax.jit, static_argnums=(1, 2))
def cluster_tasks(key: jax.Array, count: int, shots: int = 5) -> Task:
    return jax.vmap(lambda k: cluster_task(k, shots))(jax.random.split(key, count))


@functools.cache
def cluster_model() -> Problem:
    parts = ModelParts(head="head", embed="embed")
    return problem(model_from_flax(MLP((64, 32), WAYS), (DIM,), parts), "classification")


@functools.cache
def task_pool(kind: str, meta_steps: int = 300, meta_batch: int = 8, held_out: int = 96):
    """``(batches [meta_steps, meta_batch, ...], held_out [held_out, ...])`` of "sine" or
    "clusters" tasks, drawn in one call."""
    sample = cluster_tasks if kind == "clusters" else sine_tasks
    tasks = sample(jax.random.key(7), meta_steps * meta_batch + held_out)
    train = jax.tree_util.tree_map(
        lambda t: t[: meta_steps * meta_batch].reshape(meta_steps, meta_batch, *t.shape[1:]), tasks
    )
    return train, jax.tree_util.tree_map(lambda t: t[meta_steps * meta_batch :], tasks)


def meta_train(learner, meta_params, batches: Task, optimizer):
    """One meta-step per leading entry of ``batches`` (vmap over its tasks), in one jitted scan
    of the library's ``meta_train_step``."""
    num_steps = jax.tree_util.tree_leaves(batches)[0].shape[0]
    step = make_meta_train_step(
        learner, optimizer, meta_steps=num_steps, strategy="vmap", key=jax.random.key(0)
    )

    @jax.jit
    def run(params, batches):
        state = TrainState(jnp.asarray(0, jnp.int32), params, {}, optimizer.init(params))
        state, metrics = jax.lax.scan(step, state, batches)
        return state.meta_params, metrics

    return run(meta_params, batches)
