"""The meta-learner interface every algorithm returns, and helpers the algorithms share."""

from __future__ import annotations

import dataclasses
import inspect
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from metalearn.core import adapt_trajectory
from metalearn.core.checks import check_count as core_check_count
from metalearn.data.task import Aux, Objective, Task
from metalearn.registry import with_config  # noqa: F401  (the algorithms' factories use it)

PyTree = Any
Metrics = dict[str, jax.Array]


class TaskContext(NamedTuple):
    """What a learner needs besides its meta-parameters and the task.

    ``step``: meta-steps done and ``meta_steps``: meta-steps in the whole run (int32 scalars;
    schedules such as MAML++'s annealing read them); ``model_state``: the model's mutable
    collections (``{}`` for a stateless model); ``key``: this task's PRNG key (model randomness,
    rollouts), or None; ``hyper``: the learner's hyperparameters as the runner passes them
    (``MetaLearner.hyper``'s names, traced arguments of the compiled step), or None, where the
    learner uses the values it was built with (:func:`hyperparameter_values`).
    """

    step: jax.Array
    meta_steps: jax.Array
    model_state: PyTree
    key: jax.Array | None
    hyper: Mapping[str, jax.Array] | None = None

    def progress(self) -> jax.Array:
        """The fraction of training done, ``step / meta_steps`` (float32)."""
        return self.step.astype(jnp.float32) / self.meta_steps


def context(
    model_state: PyTree = None, key: jax.Array | None = None, step=0, meta_steps=1, hyper=None
) -> TaskContext:
    """A :class:`TaskContext`, e.g. ``context(model_state)`` to adapt outside training.

    >>> context().model_state, float(context(step=3, meta_steps=4).progress())
    ({}, 0.75)
    """
    state = {} if model_state is None else model_state
    as_int = lambda n: jnp.asarray(n, jnp.int32)  # noqa: E731
    return TaskContext(as_int(step), as_int(meta_steps), state, key, hyper)


# --- hyperparameters as data ------------------------------------------------------------------
# A setting declared with ``hyperparameter(default)`` in an algorithm's config is data, not a
# constant of the compiled step: the factory returns the values it was built with as
# ``MetaLearner.hyper``, the runner passes them back (traced) in ``TaskContext.hyper`` and to
# ``batch_update``, and the learner reads them with :func:`hyperparameter_values`. So runs that
# differ only in them share one compiled program, the factory is called once, outside ``jit``,
# and a rate may be called anything (as optax's ``inject_hyperparams`` keeps a rate in state).

_HYPERPARAMETER = "metalearn_hyperparameter"


def hyperparameter(default: float) -> Any:
    """A config field (``inner_lr: float = hyperparameter(0.01)``) the compiled step takes as
    data: runs differing only in it share one compilation.

    >>> @dataclasses.dataclass
    ... class Demo:
    ...     step_size: float = hyperparameter(0.1)
    ...     inner_steps: int = 1
    >>> hyperparameters(Demo(step_size=0.2))
    {'step_size': 0.2}
    """
    return dataclasses.field(default=default, metadata={_HYPERPARAMETER: True})


def hyperparameters(config: Any) -> dict[str, float]:
    """The values of ``config``'s fields declared with :func:`hyperparameter`, by name."""
    return {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if f.metadata.get(_HYPERPARAMETER)
    }


def hyperparameter_values(ctx: TaskContext | None, own: Mapping[str, Any]) -> Any:
    """The hyperparameters a learner's function uses (``.inner_lr``, ...): those the runner
    passes in ``ctx.hyper``, else ``own``, the values the learner was built with.

    >>> hyperparameter_values(context(), {"inner_lr": 0.1}).inner_lr
    0.1
    >>> hyperparameter_values(context(hyper={"inner_lr": 0.5}), {"inner_lr": 0.1}).inner_lr
    0.5
    """
    passed = None if ctx is None else ctx.hyper
    return types.SimpleNamespace(**{**own, **(passed or {})})


class MetaLearner(NamedTuple):
    """A meta-learning algorithm as pure functions (in the style of optax's transforms).

    - ``init(key, model_params) -> meta_params``: what the outer optimiser updates (the model
      initialisation, plus e.g. learned inner rates for Meta-SGD).
    - ``task_grad(meta_params, task, ctx) -> (meta_grads, Aux)``: the meta-gradient of one task
      (a descent direction for the outer optax optimiser; for Reptile the difference to the
      adapted weights), with the model's new state and scalar metrics on the query set.
    - ``evaluate(meta_params, task, ctx, steps) -> {metric: array[len(steps)]}``: query metrics
      (evaluation mode) after each number of inner steps in the static tuple ``steps``.
    - ``adapt(meta_params, support, ctx, inner_steps) -> model_params``: task-specific
      parameters, for prediction and plots.
    - ``batch_update`` (optional): for an outer step that needs the whole meta-batch at once
      rather than a mean of per-task gradients (TRPO's KL-constrained step, PPO's epochs over
      stored rollouts: :mod:`metalearn.rl.algorithm`),
      ``batch_update(meta_params, opt_state, tasks, keys, optimizer, strategy) -> (meta_params,
      opt_state, metrics)`` with ``tasks`` stacked on a leading axis, one key per task, and
      ``strategy`` how to batch them (:func:`~metalearn.core.batching.map_over_tasks`). The
      runner's ``meta_train_step`` calls it instead of averaging ``task_grad`` and applying
      ``optimizer``; ``hyper`` are the learner's hyperparameters as the runner passes them
      (as in ``TaskContext.hyper``).
    - ``hyper``: the hyperparameters the functions were built with, by name (the values of the
      config's :func:`hyperparameter` fields): the runner passes them back as data.

    A ``task_grad`` made by :func:`gradient_of` from a scalar ``task_loss`` carries that loss
    (``task_grad.loss``): a meta-batch batched by ``vmap`` then takes the gradient of the mean
    loss in one backward pass, where XLA merges the tasks' products with the shared
    meta-parameters into single larger ones, instead of averaging per-task gradients.
    """

    init: Callable[[jax.Array, PyTree], PyTree]
    task_grad: Callable[[PyTree, Task, TaskContext], tuple[PyTree, Aux]]
    evaluate: Callable[[PyTree, Task, TaskContext, tuple[int, ...]], Metrics]
    adapt: Callable[..., PyTree]
    batch_update: Callable[..., tuple[PyTree, PyTree, Metrics]] | None = None
    hyper: Mapping[str, float] = types.MappingProxyType({})


BATCH_UPDATE_ARGS = (
    "meta_params",
    "opt_state",
    "tasks",
    "keys",
    "optimizer",
    "strategy",
    "hyper",
)


def check_batch_update(learner: MetaLearner, algorithm: str) -> None:
    """ValueError, one line, unless the learner's ``batch_update`` (if it has one) takes the
    arguments the runner passes (:data:`BATCH_UPDATE_ARGS`), e.g. one written before
    ``strategy`` was added.

    >>> learner = MetaLearner(None, None, None, None, lambda p, s, t, k, o, b: (p, s, {}))
    >>> check_batch_update(learner, "mine")
    Traceback (most recent call last):
    ...
    ValueError: algorithm=mine: its batch_update must take (..., hyper); ... (p, s, t, k, o, b)
    """
    if learner.batch_update is None:
        return
    try:
        signature = inspect.signature(learner.batch_update)
    except (TypeError, ValueError):  # not introspectable (a builtin): the call will tell
        return
    try:
        signature.bind(*BATCH_UPDATE_ARGS)
    except TypeError:
        raise ValueError(
            f"algorithm={algorithm}: its batch_update must take ({', '.join(BATCH_UPDATE_ARGS)}); "
            "strategy says how to batch the tasks ('vmap', 'map' or 'map<k>': "
            "metalearn.core.batching.map_over_tasks), hyper holds the learner's hyperparameters "
            f"(MetaLearner.hyper) as the runner passes them; it takes {signature}"
        ) from None


# --- the task loss as core sees it ----------------------------------------------------------


def _key(ctx: TaskContext, stream: int) -> jax.Array | None:
    return None if ctx.key is None else jax.random.fold_in(ctx.key, stream)


def inner_loss(objective: Objective, ctx: TaskContext, train: bool = True):
    """``loss_fn(params, data) -> scalar`` for :mod:`metalearn.core`: the task loss with the
    model state and the inner loop's key held fixed (every inner step sees the same key)."""
    key = _key(ctx, 0)

    def loss_fn(params, data):
        return objective.loss(params, ctx.model_state, key, data, train)[0]

    return loss_fn


def query_loss(
    objective: Objective, params: PyTree, ctx: TaskContext, data: PyTree, train: bool = True
) -> tuple[jax.Array, Aux]:
    """``(loss, Aux)`` of ``params`` on ``data`` (a task's query set), with the query key."""
    return objective.loss(params, ctx.model_state, _key(ctx, 1), data, train)


def query_metrics(objective: Objective, params: PyTree, ctx: TaskContext, data: PyTree) -> Metrics:
    """The metrics of ``params`` on ``data`` in evaluation mode."""
    return query_loss(objective, params, ctx, data, train=False)[1].metrics


def gradient_of(task_loss: Callable) -> Callable:
    """``task_grad`` from ``task_loss(meta_params, task, ctx) -> (loss, Aux)``: the loss's
    gradient with respect to the meta-parameters, and its Aux. It keeps ``task_loss`` as
    ``task_grad.loss``, which the runner differentiates once for a meta-batch."""

    def task_grad(meta_params, task: Task, ctx: TaskContext) -> tuple[PyTree, Aux]:
        (_, aux), grads = jax.value_and_grad(task_loss, has_aux=True)(meta_params, task, ctx)
        return grads, aux

    task_grad.loss = task_loss  # what the runner checks before differentiating the loss itself
    return task_grad


def query_gradient(objective: Objective, adapt_fn) -> Callable:
    """``task_grad`` of a learner whose meta-gradient is that of the query loss after
    ``adapt_fn(meta_params, support, ctx)``, made by :func:`gradient_of`."""

    def task_loss(meta_params, task: Task, ctx: TaskContext) -> tuple[jax.Array, Aux]:
        return query_loss(objective, adapt_fn(meta_params, task.support, ctx), ctx, task.query)

    return gradient_of(task_loss)


# --- config checks: each raises ValueError naming the key, as ``algorithm.<key>`` -------------


def check_positive(key: str, value: float) -> None:
    """``value > 0``."""
    if isinstance(value, bool) or not value > 0:
        raise ValueError(f"algorithm.{key} must be > 0, got {value!r}")


def check_nonnegative(key: str, value: float) -> None:
    """``value >= 0``."""
    if isinstance(value, bool) or not value >= 0:
        raise ValueError(f"algorithm.{key} must be >= 0, got {value!r}")


def check_fraction(key: str, value: float) -> None:
    """``0 <= value <= 1``."""
    if isinstance(value, bool) or not 0 <= value <= 1:
        raise ValueError(f"algorithm.{key} must be in [0, 1], got {value!r}")


def check_count(key: str, value: int, minimum: int = 1) -> None:
    """An integer ``value >= minimum`` (not a bool), named ``algorithm.<key>``."""
    core_check_count(f"algorithm.{key}", value, minimum)


def check_choice(key: str, value: str, choices: Sequence[str]) -> None:
    """``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"algorithm.{key} must be one of {list(choices)}, got {value!r}")


@dataclasses.dataclass
class InnerLoopConfig:
    """The inner loop the MAML family shares: ``inner_steps`` steps at rate ``inner_lr`` (a
    :func:`hyperparameter`). An algorithm's config subclasses it, with its ``name``, its own
    fields and, where they differ, its own defaults; its ``__post_init__`` calls this one."""

    # Read in training only (metalearn.evaluate refuses them as overrides).
    TRAINING_ONLY: ClassVar[Mapping[str, str]] = {
        "inner_steps": "eval.steps are the evaluation's inner step counts",
    }

    name: str = "inner_loop"
    inner_lr: float = hyperparameter(0.01)
    inner_steps: int = 1

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        check_positive("inner_lr", self.inner_lr)
        check_count("inner_steps", self.inner_steps)


# --- parameter paths -----------------------------------------------------------------------


def path_name(path: tuple) -> str:
    """``"hidden_0/kernel"`` for the key path of a leaf in a nested-dict (or list) pytree."""
    parts = []
    for entry in path:
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                parts.append(str(getattr(entry, attr)))
                break
        else:
            parts.append(str(entry))
    return "/".join(parts)


def named_leaves(tree: PyTree) -> dict[str, jax.Array]:
    """A flat ``{path_name: leaf}`` dict of ``tree`` (insertion order = tree order)."""
    return {path_name(p): leaf for p, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def split_top_level(params: PyTree, names: Sequence[str]) -> tuple[dict, dict]:
    """``(selected, rest)``: the top-level entries of dict ``params`` named in ``names``, and the
    others. Raises ValueError if a name is missing."""
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(
            f"parameter entries {missing} not found; the top-level entries are {list(params)}"
        )
    selected = {k: v for k, v in params.items() if k in names}
    rest = {k: v for k, v in params.items() if k not in names}
    return selected, rest


# --- which parameters the inner loop adapts --------------------------------------------------
# The one home of this choice: algorithms ask ``inner_rates`` for their inner step sizes. The
# normalisation parameters are those the model declares (``Model.norm_paths``, found by layer
# type; see :func:`declared_norm_paths`), never guessed from names. maml, fomaml and meta_sgd
# take ``adapt_norm``; ANIL adapts the head only and MAML++ holds its per-step normalisation
# copies fixed (``per_step_norm``), so neither adapts normalisation parameters; Reptile adapts
# everything, since its meta-update is the adapted difference: a parameter held fixed in its
# inner loop would never be meta-learned.


def declared_norm_paths(objective: Objective) -> frozenset[str]:
    """The parameter paths (``"norms_0/bias"``) of the objective's model's normalisation layers;
    empty when the objective has no model (a bare loss)."""
    return objective.model.norm_paths if objective.model is not None else frozenset()


def inner_loop_mask(
    params: PyTree, norm_paths: frozenset[str], *, adapt_norm: bool = True
) -> PyTree:
    """A pytree of bools shaped like ``params``: True where the inner loop adapts the leaf.

    With ``adapt_norm=False`` the normalisation parameters (``norm_paths``, as the model
    declares them) are held fixed in the inner loop (they are still meta-learned by the outer
    loop), as in Finn et al.'s code, where batch norm's offsets are variables outside the
    adapted ``weights`` dict.

    >>> params = {"convs_0": {"kernel": 1.0}, "norms_0": {"bias": 0.0}, "head": {"bias": 0.0}}
    >>> inner_loop_mask(params, frozenset({"norms_0/bias"}), adapt_norm=False)
    {'convs_0': {'kernel': True}, 'head': {'bias': True}, 'norms_0': {'bias': False}}
    """
    return jax.tree_util.tree_map_with_path(
        lambda path, _: adapt_norm or path_name(path) not in norm_paths, params
    )


def inner_rates(
    params: PyTree, inner_lr: float | PyTree, norm_paths: frozenset[str], *, adapt_norm=True
):
    """Inner step sizes for ``params``: ``inner_lr`` where :func:`inner_loop_mask` adapts, 0 else.

    ``inner_lr`` is a scalar or a pytree like ``params`` (Meta-SGD's learned rates). With
    ``adapt_norm=True`` it is returned unchanged (every parameter adapts).

    >>> params = {"norms_0": {"bias": 1.0}, "head": {"kernel": 1.0}}
    >>> inner_rates(params, 0.4, frozenset({"norms_0/bias"}), adapt_norm=False)
    {'head': {'kernel': 0.4}, 'norms_0': {'bias': 0.0}}
    """
    if adapt_norm:
        return inner_lr
    mask = inner_loop_mask(params, norm_paths, adapt_norm=adapt_norm)
    if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(inner_lr)):
        return jax.tree_util.tree_map(lambda m: inner_lr if m else 0.0, mask)
    return jax.tree_util.tree_map(lambda lr, m: lr if m else jnp.zeros_like(lr), inner_lr, mask)


# --- evaluation ------------------------------------------------------------------------------


def evaluate_trajectory(
    objective: Objective,
    trajectory_fn: Callable[[Any, int], PyTree],
    task: Task,
    ctx: TaskContext,
    steps: Sequence[int],
    to_model_params: Callable[[PyTree], PyTree] = lambda p: p,
) -> Metrics:
    """Query metrics at each step count in ``steps`` along one inner-loop trajectory.

    ``trajectory_fn(support, num_steps)`` returns stacked parameters with a leading axis of
    ``num_steps + 1`` (as :func:`metalearn.core.adapt_trajectory` does). ``to_model_params``
    maps one (unstacked) entry of the trajectory to model parameters, e.g. to put an adapted
    head back on a shared body (ANIL) without stacking the body.
    """
    trajectory = trajectory_fn(task.support, max(max(steps), 1))
    return metrics_at_steps(
        trajectory, steps, lambda p: query_metrics(objective, to_model_params(p), ctx, task.query)
    )


def metrics_at_steps(
    trajectory: PyTree, steps: Sequence[int], metrics: Callable[[PyTree], Metrics]
) -> Metrics:
    """``metrics`` of the trajectory's entries after each step count in ``steps``, stacked:
    whatever a learner adapts (parameters, a context, a fitted head), stacked along a leading
    axis of steps done.

    >>> trajectory = {"w": jnp.array([0.0, 1.0, 2.0, 3.0])}  # after 0, 1, 2, 3 steps
    >>> metrics_at_steps(trajectory, (0, 3), lambda p: {"w2": p["w"] ** 2})["w2"]
    Array([0., 9.], dtype=float32)
    """
    picked = jax.tree_util.tree_map(lambda t: t[jnp.asarray([int(s) for s in steps])], trajectory)
    return jax.vmap(metrics)(picked)


def sgd_trajectory_fn(objective: Objective, params: PyTree, inner_lr, ctx: TaskContext):
    """``(support, num_steps) -> stacked params`` for plain SGD adaptation from ``params``
    (evaluation mode)."""
    loss_fn = inner_loss(objective, ctx, train=False)

    def trajectory(support, num_steps):
        return adapt_trajectory(loss_fn, params, support, inner_lr=inner_lr, num_steps=num_steps)

    return trajectory
