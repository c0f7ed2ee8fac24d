"""The jitted meta-step and evaluation step, with tasks batched by a per-backend strategy.

Tasks are sampled on the device inside the jitted function from the split arrays passed in as
an argument; nothing crosses from host to device per step except the step counter in ``state``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from metalearn.algorithms.base import MetaLearner
from metalearn.data.task import TaskDistribution
from metalearn.runner.devices import constrain_replicated, shard_task_axis

PyTree = Any


class TrainState(NamedTuple):
    step: jax.Array  # int32 scalar: meta-steps done
    meta_params: PyTree
    opt_state: PyTree


def resolve_task_batching(strategy: str, model_params: PyTree) -> str:
    """Pick how the tasks of a meta-batch are batched, when the config says ``auto``.

    On GPUs and TPUs, ``vmap``. On CPU, ``vmap`` for dense models, but ``map`` (one task per
    loop iteration) for convolutional ones (any 4-d kernel): per-task kernels under ``vmap``
    become grouped convolutions, which XLA:CPU expands, and one task's matrix products are
    already large enough for the CPU; a Python loop unrolled inside ``jit`` (``unroll``) makes
    the program 32 times larger and compiles for minutes. Measured in experiments/benchmarks/.
    """
    if strategy != "auto":
        return strategy
    if jax.default_backend() != "cpu":
        return "vmap"
    return "map" if _has_convolutions(model_params) else "vmap"


def _has_convolutions(model_params: PyTree) -> bool:
    return any(leaf.ndim == 4 for leaf in jax.tree_util.tree_leaves(model_params))


def resolve_steps_per_call(steps_per_call: int, model_params: PyTree) -> int:
    """Meta-steps fused per jitted call; 0 means auto.

    Auto fuses 100 steps in a ``lax.scan`` (dispatch overhead dominates small models), and
    10 for convolutional models on CPU, whose steps take long enough that dispatch costs
    nothing and progress should be reported more often.
    """
    if steps_per_call:
        return steps_per_call
    if jax.default_backend() == "cpu" and _has_convolutions(model_params):
        return 10
    return 100


def map_over_tasks(fn: Callable[[PyTree], PyTree], tasks: PyTree, strategy: str) -> PyTree:
    """Apply ``fn`` to each task (leading axis of ``tasks``); results stacked on axis 0."""
    if strategy == "vmap":
        return jax.vmap(fn)(tasks)
    if strategy == "map":
        return jax.lax.map(fn, tasks)
    if strategy == "unroll":
        count = jax.tree_util.tree_leaves(tasks)[0].shape[0]
        outs = [fn(jax.tree_util.tree_map(lambda t, i=i: t[i], tasks)) for i in range(count)]
        return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *outs)
    raise ValueError(f"unknown task batching strategy {strategy!r}")


def mean_over_tasks(
    fn: Callable[[PyTree], PyTree], tasks: PyTree, strategy: str, *, in_carry: bool = True
) -> PyTree:
    """The mean of ``fn(task)`` over the leading axis of ``tasks``.

    With ``map`` (and ``in_carry``) the loop accumulates the sum in its carry instead of
    stacking one result per task and reducing afterwards: no ``[tasks, *params]`` buffer, and
    no large reduction after the loop (XLA:CPU took 17 ms to average 32 Conv4 kernel gradients
    that way). Pass ``in_carry=False`` when the task axis is split across devices: a loop
    carry cannot be.

    >>> import jax.numpy as jnp
    >>> tasks = jnp.arange(6.0).reshape(3, 2)
    >>> [float(mean_over_tasks(jnp.sum, tasks, s)) for s in ("vmap", "map", "unroll")]
    [5.0, 5.0, 5.0]
    """
    if strategy != "map" or not in_carry:
        stacked = map_over_tasks(fn, tasks, strategy)
        return jax.tree_util.tree_map(lambda x: jnp.mean(x, axis=0), stacked)
    count = jax.tree_util.tree_leaves(tasks)[0].shape[0]
    shapes = jax.eval_shape(fn, jax.tree_util.tree_map(lambda t: t[0], tasks))
    zeros = jax.tree_util.tree_map(
        lambda s: jnp.zeros(s.shape, jnp.result_type(s.dtype, jnp.float32)), shapes
    )

    def accumulate(total, task):
        return jax.tree_util.tree_map(jnp.add, total, fn(task)), None

    total, _ = jax.lax.scan(accumulate, zeros, tasks)
    return jax.tree_util.tree_map(lambda x: x / count, total)


def sample_tasks(
    tasks: TaskDistribution, split_arrays: PyTree, key: jax.Array, count: int, shots: int
):
    """``count`` tasks from one key, stacked on a leading axis."""
    return sample_tasks_from_keys(tasks, split_arrays, jax.random.split(key, count), shots)


def sample_tasks_from_keys(
    tasks: TaskDistribution, split_arrays: PyTree, keys: jax.Array, shots: int
):
    """One task per key, stacked on a leading axis."""
    return jax.vmap(lambda k: tasks.sample(split_arrays, k, shots))(keys)


def make_meta_step(
    learner: MetaLearner,
    tasks: TaskDistribution,
    optimizer: optax.GradientTransformation,
    *,
    train_key: jax.Array,
    meta_batch_size: int,
    shots: int,
    total_steps: int,
    strategy: str,
    mesh=None,
) -> Callable[[TrainState, PyTree], tuple[TrainState, dict]]:
    """One meta-step ``(state, train_arrays) -> (state, metrics)``, not yet jitted.

    The step's tasks come from ``fold_in(train_key, state.step)``, so a run resumed from any
    checkpoint sees exactly the tasks an uninterrupted run would. With a ``mesh`` the tasks are
    split across its devices (see :mod:`metalearn.runner.devices`).
    """

    def meta_step(state: TrainState, train_arrays: PyTree):
        key = jax.random.fold_in(train_key, state.step)
        batch = shard_task_axis(
            sample_tasks(tasks, train_arrays, key, meta_batch_size, shots), mesh
        )
        progress = state.step.astype(jnp.float32) / total_steps
        grads, metrics = mean_over_tasks(
            lambda task: learner.task_grad(state.meta_params, task, progress),
            batch,
            strategy,
            in_carry=mesh is None,
        )
        updates, opt_state = optimizer.update(grads, state.opt_state, state.meta_params)
        meta_params = optax.apply_updates(state.meta_params, updates)
        return constrain_replicated(
            (TrainState(state.step + 1, meta_params, opt_state), metrics), mesh
        )

    return meta_step


def make_multi_step(meta_step: Callable, num_steps: int) -> Callable:
    """Jit ``num_steps`` meta-steps fused by ``lax.scan``; metrics averaged over them."""

    def run(state: TrainState, train_arrays: PyTree):
        if num_steps == 1:
            return meta_step(state, train_arrays)
        state, metrics = jax.lax.scan(
            lambda s, _: meta_step(s, train_arrays), state, None, length=num_steps
        )
        return state, jax.tree_util.tree_map(lambda m: jnp.mean(m, axis=0), metrics)

    return jax.jit(run, donate_argnums=0)


def make_eval_step(
    learner: MetaLearner,
    tasks: TaskDistribution,
    *,
    steps: tuple[int, ...],
    strategy: str,
    mesh=None,
) -> Callable:
    """Jitted ``(meta_params, split_arrays, keys, shots) -> {metric: [len(keys), len(steps)]}``."""

    def evaluate(meta_params, split_arrays, keys, shots):
        batch = sample_tasks_from_keys(tasks, split_arrays, keys, shots)
        if mesh is not None and keys.shape[0] % mesh.size == 0:
            batch = shard_task_axis(batch, mesh)
        per_task = map_over_tasks(
            lambda t: learner.evaluate(meta_params, t, steps), batch, strategy
        )
        return constrain_replicated(per_task, mesh)

    return jax.jit(evaluate, static_argnums=3)


@jax.jit
def all_finite(tree: PyTree) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in leaves]))
