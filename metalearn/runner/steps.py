"""The meta-training step (:func:`make_meta_train_step`, the one unit everything calls), its
on-device task sampling (:func:`make_meta_step`), fusion, and the evaluation step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from metalearn.algorithms.base import MetaLearner, TaskContext, context
from metalearn.core.batching import map_over_tasks, mean_over_tasks
from metalearn.data.task import Aux, TaskFamily
from metalearn.models.base import Model
from metalearn.runner.devices import (
    TASK_AXIS,
    constrain_replicated,
    over_runs,
    over_task_shards,
    shard_task_axis,
)

PyTree = Any


class TrainState(NamedTuple):
    """Everything a meta-training step updates (and a checkpoint holds)."""

    step: jax.Array  # int32 scalar: meta-steps done
    meta_params: PyTree
    model_state: PyTree  # the model's mutable collections ({} for a stateless model)
    opt_state: PyTree


class Trained(NamedTuple):
    """What evaluation needs from a training state (and the best checkpoint keeps)."""

    meta_params: PyTree
    model_state: PyTree


def trained(state: TrainState) -> Trained:
    """What evaluation and checkpoints of the best parameters keep of a training state."""
    return Trained(state.meta_params, state.model_state)


def sample_tasks(
    family: TaskFamily, split_arrays: PyTree, key: jax.Array, count: int, shots: int, mesh=None
):
    """``count`` tasks from one key, stacked on a leading axis."""
    keys = jax.random.split(key, count)
    return sample_tasks_from_keys(family, split_arrays, keys, shots, mesh)


def sample_tasks_from_keys(
    family: TaskFamily, split_arrays: PyTree, keys: jax.Array, shots: int, mesh=None
):
    """One task per key, stacked on a leading axis; with a ``mesh``, each device samples its
    own share of ``keys``, so that the devices exchange nothing."""

    def sample(arrays, task_keys):
        return jax.vmap(lambda k: family.sample(arrays, k, shots))(task_keys)

    if mesh is None or keys.shape[0] % mesh.size:
        return sample(split_arrays, keys)
    return over_task_shards(sample, mesh, reduce=False)(split_arrays, shard_task_axis(keys, mesh))


def init_train_state(
    learner: MetaLearner,
    model: Model,
    optimizer: optax.GradientTransformation,
    key: jax.Array,
) -> TrainState:
    """Step 0: model initialised, learner and optimiser state built (optax-style ``init``)."""
    init_key, learner_key = jax.random.split(key)
    model_params, model_state = model.init(init_key)
    meta_params = learner.init(learner_key, model_params)
    step = jnp.asarray(0, jnp.int32)
    return TrainState(step, meta_params, model_state, optimizer.init(meta_params))


def batch_update_strategy(strategy: str, mesh) -> str:
    """How a learner's ``batch_update`` batches the tasks: across a ``mesh``'s devices ``vmap``,
    which XLA partitions along the task axis."""
    return strategy if mesh is None else "vmap"


def make_meta_train_step(
    learner: MetaLearner,
    optimizer: optax.GradientTransformation,
    *,
    meta_steps: int,
    strategy: str,
    key: jax.Array,
    mesh=None,
    hyper: dict[str, jax.Array] | None = None,
    learning_rate: jax.Array | None = None,
) -> Callable[[TrainState, PyTree], tuple[TrainState, dict]]:
    """``meta_train_step(state, tasks) -> (state, metrics)``: one meta-update from an
    already-sampled meta-batch, not yet jitted.

    The tasks' meta-gradients, model states and metrics are averaged and ``optimizer`` applies
    the mean gradient; a learner's ``batch_update`` (TRPO) takes the whole meta-batch instead.
    ``hyper``: the learner's hyperparameters as data (None: the values it was built with).
    With a ``mesh`` each device batches its share of the tasks, and the means are averaged.

    >>> import jax, jax.numpy as jnp, optax
    >>> from metalearn.algorithms.maml import maml
    >>> from metalearn.data.sinusoid import sinusoid
    >>> from metalearn.data.task import family_objective
    >>> from metalearn.models.base import model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> family = sinusoid()
    >>> model = model_from_flax(MLP((40, 40), 1), (1,))
    >>> learner, optimizer = maml(family_objective(family, model)), optax.adam(1e-3)
    >>> state = init_train_state(learner, model, optimizer, jax.random.key(0))
    >>> tasks = sample_tasks(family, {}, jax.random.key(1), 4, 10)
    >>> step = make_meta_train_step(
    ...     learner, optimizer, meta_steps=10, strategy="vmap", key=jax.random.key(2))
    >>> state, metrics = jax.jit(step)(state, tasks)
    >>> int(state.step), sorted(metrics)
    (1, ['mse'])
    """

    # A task_grad made by gradient_of(task_loss) carries the loss it differentiates.
    task_loss = getattr(learner.task_grad, "loss", None)

    def task_mean(state: TrainState, tasks_and_keys: PyTree):
        total = jnp.asarray(meta_steps, jnp.int32)

        def task_context(task_key):
            return TaskContext(state.step, total, state.model_state, task_key, hyper)

        def one_task(task_and_key):
            task, task_key = task_and_key
            returned = learner.task_grad(state.meta_params, task, task_context(task_key))
            check_task_grad_output(returned)
            grads, aux = returned
            check_gradient_structure(grads, state.meta_params)
            return grads, aux.model_state, aux.metrics

        def mean_loss(meta_params):
            def one_loss(task_and_key):
                task, task_key = task_and_key
                returned = task_loss(meta_params, task, task_context(task_key))
                check_task_loss_output(returned)
                return returned

            losses, aux = jax.vmap(one_loss)(tasks_and_keys)
            return jnp.mean(losses), aux

        if task_loss is not None and strategy == "vmap":
            # One backward pass for the meta-batch: XLA merges the tasks' products with the
            # shared meta-parameters, where a mean of per-task gradients keeps one per task.
            grads, aux = jax.grad(mean_loss, has_aux=True)(state.meta_params)
            model_state, metrics = jax.tree_util.tree_map(lambda x: jnp.mean(x, axis=0), aux)
            mean = (grads, model_state, metrics)
        else:
            mean = mean_over_tasks(one_task, tasks_and_keys, strategy)
        return mean if mesh is None else jax.lax.pmean(mean, TASK_AXIS)

    def meta_train_step(state: TrainState, tasks: PyTree):
        count = jax.tree_util.tree_leaves(tasks)[0].shape[0]
        keys = jax.random.split(jax.random.fold_in(key, state.step), count)
        if learner.batch_update is not None:  # an outer step on the whole meta-batch (TRPO)
            meta_params, opt_state, metrics = learner.batch_update(
                state.meta_params,
                state.opt_state,
                tasks,
                keys,
                optimizer,
                batch_update_strategy(strategy, mesh),
                hyper,
            )
            model_state = state.model_state
        else:
            mean = task_mean if mesh is None else over_task_shards(task_mean, mesh, reduce=True)
            grads, model_state, metrics = mean(state, (tasks, keys))
            rate = {} if learning_rate is None else {"learning_rate": learning_rate}
            updates, opt_state = optimizer.update(grads, state.opt_state, state.meta_params, **rate)
            meta_params = optax.apply_updates(state.meta_params, updates)
        new_state = TrainState(state.step + 1, meta_params, model_state, opt_state)
        return constrain_replicated((new_state, metrics), mesh)

    return meta_train_step


def check_task_grad_output(returned: Any) -> None:
    """ValueError unless a learner's ``task_grad`` returned ``(grads, Aux)``.

    >>> check_task_grad_output({"w": jnp.zeros(2)})
    Traceback (most recent call last):
    ...
    ValueError: the algorithm's task_grad returned a dict, not (grads, Aux(model_state, ...
    """
    if isinstance(returned, tuple) and len(returned) == 2:
        aux = returned[1]
        if hasattr(aux, "model_state") and hasattr(aux, "metrics"):
            return
        shown = f"a pair whose second item is a {type(aux).__name__}"
    elif isinstance(returned, tuple):
        shown = f"a tuple of {len(returned)}"
    else:
        shown = f"a {type(returned).__name__}"
    raise ValueError(
        f"the algorithm's task_grad returned {shown}, not (grads, Aux(model_state, metrics)) "
        "(metalearn.data.task.Aux: the model state after the task and a dict of metrics); "
        "see docs/extending.md"
    )


def check_task_loss_output(returned: Any) -> None:
    """ValueError unless a learner's ``task_loss`` returned ``(scalar loss, Aux)``.

    >>> check_task_loss_output((jnp.zeros(3), None))
    Traceback (most recent call last):
    ...
    ValueError: the algorithm's task_loss must return (scalar loss, Aux(model_state, metrics)): ...
    """
    pair = isinstance(returned, tuple) and len(returned) == 2
    if pair and jnp.ndim(returned[0]) == 0 and isinstance(returned[1], Aux):
        return
    raise ValueError(
        "the algorithm's task_loss must return (scalar loss, Aux(model_state, metrics)): the "
        "loss whose gradient its task_grad = gradient_of(task_loss) returns "
        "(metalearn.algorithms.base); see docs/extending.md"
    )


def check_gradient_structure(grads: PyTree, meta_params: PyTree) -> None:
    """ValueError unless ``grads`` has one gradient of each meta-parameter's shape (static:
    free in the compiled step).

    >>> params = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)}
    >>> check_gradient_structure({"w": jnp.zeros((2, 3))}, params)
    Traceback (most recent call last):
    ...
    ValueError: the algorithm's task_grad returned gradients for ['w'], not for the ...
    """
    paths = lambda tree: {  # noqa: E731
        jax.tree_util.keystr(p, simple=True, separator="/"): jnp.shape(x)
        for p, x in jax.tree_util.tree_leaves_with_path(tree)
    }
    got, wanted = paths(grads), paths(meta_params)
    hint = "return the gradient of the query loss with respect to the meta-parameters (jax.grad)"
    if got.keys() != wanted.keys() or jax.tree.structure(grads) != jax.tree.structure(meta_params):
        raise ValueError(
            f"the algorithm's task_grad returned gradients for {sorted(got)[:6]}, not for the "
            f"meta-parameters {sorted(wanted)[:6]}; {hint}"
        )
    for path, shape in wanted.items():
        if got[path] != shape:
            raise ValueError(
                f"the algorithm's task_grad returned a gradient of shape {got[path]} for the "
                f"meta-parameter {path} of shape {shape}; {hint}"
            )


def make_meta_step(
    meta_train_step: Callable[[TrainState, PyTree], tuple[TrainState, dict]],
    family: TaskFamily,
    *,
    train_key: jax.Array,
    meta_batch_size: int,
    shots: int,
    mesh=None,
) -> Callable[[TrainState, PyTree], tuple[TrainState, dict]]:
    """``(state, train_arrays) -> (state, metrics)``: sample a meta-batch on the device from
    ``fold_in(train_key, state.step)`` (a resumed run sees the same tasks), then
    ``meta_train_step`` on it; not yet jitted."""

    def meta_step(state: TrainState, train_arrays: PyTree):
        key = jax.random.fold_in(train_key, state.step)
        tasks = sample_tasks(family, train_arrays, key, meta_batch_size, shots, mesh)
        return meta_train_step(state, shard_task_axis(tasks, mesh))

    return meta_step


def make_multi_step(meta_step: Callable, num_steps: int, runs_mesh=None, runs: bool = False):
    """Jit ``num_steps`` of ``meta_step(state, train_arrays, *args)`` fused by ``lax.scan``,
    metrics averaged. With ``runs``, the state and the one argument have a leading runs axis
    (``vmap``, split over a ``runs_mesh``); the data are shared."""

    def run(state: TrainState, train_arrays: PyTree, *args):
        if num_steps == 1:
            return meta_step(state, train_arrays, *args)
        state, metrics = jax.lax.scan(
            lambda s, _: meta_step(s, train_arrays, *args), state, None, length=num_steps
        )
        return state, jax.tree_util.tree_map(lambda m: jnp.mean(m, axis=0), metrics)

    if runs:
        run = over_runs(jax.vmap(run, in_axes=(0, None, 0)), runs_mesh, (0, None, 0))
    return jax.jit(run, donate_argnums=0)


def stack(trees: list[PyTree]) -> PyTree:
    """Pytrees of the same structure stacked on a leading runs axis.

    >>> stack([{"w": jnp.zeros(2)}, {"w": jnp.ones(2)}])["w"].shape
    (2, 2)
    """
    return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *trees)


def run_of(tree: PyTree, index: int) -> PyTree:
    """Entry ``index`` of a pytree stacked on a runs axis (:func:`stack`)."""
    return jax.tree_util.tree_map(lambda leaf: leaf[index], tree)


def make_eval_step(
    learner: MetaLearner,
    family: TaskFamily,
    *,
    steps: tuple[int, ...],
    strategy: str,
    mesh=None,
    runs: bool = False,
    runs_mesh=None,
) -> Callable:
    """Jitted ``(trained, split_arrays, keys, shots, hyper=None) -> {metric: [len(keys),
    len(steps)]}``: one task per key, its model key ``fold_in(key, 1)``. With a ``mesh`` on one
    host the results stay split across its devices. With ``runs``, ``trained``, ``hyper`` and
    the results have a leading runs axis, every run evaluated on the same tasks."""

    def evaluate(trained: Trained, split_arrays, keys, shots, hyper=None):
        def per_task(trained: Trained, batch_and_keys: PyTree):
            def one_task(task_and_key):
                task, key = task_and_key
                ctx = context(trained.model_state, key, hyper=hyper)
                return learner.evaluate(trained.meta_params, task, ctx, steps)

            return map_over_tasks(one_task, batch_and_keys, strategy)

        batch = sample_tasks_from_keys(family, split_arrays, keys, shots, mesh)
        model_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)
        if mesh is None or keys.shape[0] % mesh.size:
            return constrain_replicated(per_task(trained, (batch, model_keys)), mesh)
        batch, model_keys = shard_task_axis((batch, model_keys), mesh)
        results = over_task_shards(per_task, mesh, reduce=False)(trained, (batch, model_keys))
        # no gather in the program unless other hosts must read the results too
        return results if jax.process_count() == 1 else constrain_replicated(results, mesh)

    if runs:
        each = jax.vmap(evaluate, in_axes=(0, None, None, None, 0))
        return jax.jit(
            lambda trained, arrays, keys, shots, hyper: over_runs(
                lambda t, a, h: each(t, a, keys, shots, h), runs_mesh, (0, None, 0)
            )(trained, arrays, hyper),
            static_argnums=3,
        )
    return jax.jit(evaluate, static_argnums=3)


@jax.jit
def all_finite(tree: PyTree) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in leaves]))


@jax.jit
def all_equal(a: PyTree, b: PyTree) -> jax.Array:
    """Whether two trees of the same structure hold the same values.

    >>> bool(all_equal({"w": jnp.ones(2)}, {"w": jnp.ones(2)})), bool(
    ...     all_equal({"w": jnp.ones(2)}, {"w": jnp.zeros(2)}))
    (True, False)
    """
    pairs = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    return jnp.all(jnp.array([jnp.array_equal(x, y) for x, y in pairs]))
