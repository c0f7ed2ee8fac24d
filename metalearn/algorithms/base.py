"""The meta-learner interface every algorithm returns, and helpers the algorithms share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from metalearn.core import adapt_trajectory
from metalearn.data.task import Task
from metalearn.models.base import Model

PyTree = Any
Metrics = dict[str, jax.Array]


class MetaLearner(NamedTuple):
    """A meta-learning algorithm as pure functions (in the style of optax's transforms).

    - ``init(key, model_params) -> meta_params``: what the outer optimiser updates (the model
      initialisation, plus e.g. learned inner rates for Meta-SGD).
    - ``task_grad(meta_params, task, progress) -> (meta_grads, metrics)``: the meta-gradient of
      one task (a descent direction for the outer optax optimiser; for Reptile the difference
      to the adapted weights) and scalar metrics on the query set. ``progress`` in [0, 1] is the
      fraction of training done (a traced scalar), for schedules such as MAML++'s annealing.
    - ``evaluate(meta_params, task, steps) -> {metric: array[len(steps)]}``: query metrics after
      each number of inner steps in the static tuple ``steps``.
    - ``adapt(meta_params, support, num_steps) -> model_params``: task-specific parameters, for
      prediction and plots.
    """

    init: Callable[[jax.Array, PyTree], PyTree]
    task_grad: Callable[[PyTree, Task, jax.Array], tuple[PyTree, Metrics]]
    evaluate: Callable[[PyTree, Task, tuple[int, ...]], Metrics]
    adapt: Callable[[PyTree, Any, int], PyTree]


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
    """An integer ``value >= minimum`` (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"algorithm.{key} must be an integer >= {minimum}, got {value!r}")


def check_choice(key: str, value: str, choices: Sequence[str]) -> None:
    """``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"algorithm.{key} must be one of {list(choices)}, got {value!r}")


def check_inner_loop_settings(inner_lr: float, num_steps: int) -> None:
    """``inner_lr > 0`` and an integer ``num_steps >= 1``."""
    check_positive("inner_lr", inner_lr)
    check_count("num_steps", num_steps)


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
# The one home of this choice: algorithms ask ``inner_rates`` for their inner step sizes. Today
# normalisation parameters are recognised by name (``is_norm_parameter``); when models declare
# their parameter groups, only ``inner_loop_mask`` needs to change. maml, fomaml and meta_sgd
# take ``adapt_norm``; ANIL adapts the head only and MAML++ holds its per-step normalisation
# copies fixed (``per_step_norm``), so neither adapts normalisation parameters; Reptile adapts
# everything, since its meta-update is the adapted difference: a parameter held fixed in its
# inner loop would never be meta-learned.


def is_norm_parameter(name: str) -> bool:
    """Whether a parameter path (``"BatchNorm_0/scale"``) names a normalisation parameter.

    True when a path component contains ``"norm"`` (case-insensitive): Conv4's ``norms_0/bias``,
    Flax's ``BatchNorm_0/scale``, ``LayerNorm_1/bias``.
    """
    return any("norm" in part.lower() for part in name.split("/"))


def inner_loop_mask(params: PyTree, *, adapt_norm: bool = True) -> PyTree:
    """A pytree of bools shaped like ``params``: True where the inner loop adapts the leaf.

    With ``adapt_norm=False`` the normalisation parameters are held fixed in the inner loop (they
    are still meta-learned by the outer loop), as in Finn et al.'s code, where batch norm's
    offsets are variables outside the adapted ``weights`` dict.

    >>> params = {"convs_0": {"kernel": 1.0}, "norms_0": {"bias": 0.0}, "head": {"bias": 0.0}}
    >>> inner_loop_mask(params, adapt_norm=False)
    {'convs_0': {'kernel': True}, 'head': {'bias': True}, 'norms_0': {'bias': False}}
    """
    return jax.tree_util.tree_map_with_path(
        lambda path, _: adapt_norm or not is_norm_parameter(path_name(path)), params
    )


def inner_rates(params: PyTree, inner_lr: float | PyTree, *, adapt_norm: bool = True):
    """Inner step sizes for ``params``: ``inner_lr`` where :func:`inner_loop_mask` adapts, 0 else.

    ``inner_lr`` is a scalar or a pytree like ``params`` (Meta-SGD's learned rates). With
    ``adapt_norm=True`` it is returned unchanged (every parameter adapts).

    >>> params = {"norms_0": {"bias": 1.0}, "head": {"kernel": 1.0}}
    >>> inner_rates(params, 0.4, adapt_norm=False)
    {'head': {'kernel': 0.4}, 'norms_0': {'bias': 0.0}}
    """
    if adapt_norm:
        return inner_lr
    mask = inner_loop_mask(params, adapt_norm=adapt_norm)
    if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(inner_lr)):
        return jax.tree_util.tree_map(lambda m: inner_lr if m else 0.0, mask)
    return jax.tree_util.tree_map(lambda lr, m: lr if m else jnp.zeros_like(lr), inner_lr, mask)


# --- evaluation ------------------------------------------------------------------------------


def evaluate_trajectory(
    model: Model,
    meta_params_to_trajectory: Callable[[Any, int], PyTree],
    task: Task,
    steps: Sequence[int],
    to_model_params: Callable[[PyTree], PyTree] = lambda p: p,
) -> Metrics:
    """Query metrics at each step count in ``steps`` along one inner-loop trajectory.

    ``meta_params_to_trajectory(support, num_steps)`` returns stacked parameters with a leading
    axis of ``num_steps + 1`` (as :func:`metalearn.core.adapt_trajectory` does).
    ``to_model_params`` maps one (unstacked) entry of the trajectory to model parameters, e.g.
    to put an adapted head back on a shared body (ANIL) without stacking the body.
    """
    steps = tuple(int(s) for s in steps)
    trajectory = meta_params_to_trajectory(task.support, max(max(steps), 1))
    picked = jax.tree_util.tree_map(lambda t: t[jnp.asarray(steps)], trajectory)
    return jax.vmap(lambda p: model.metrics_fn(to_model_params(p), task.query))(picked)


def sgd_trajectory_fn(model: Model, params: PyTree, inner_lr: float | PyTree):
    """``(support, num_steps) -> stacked params`` for plain SGD adaptation from ``params``."""

    def trajectory(support, num_steps):
        return adapt_trajectory(
            model.loss_fn, params, support, inner_lr=inner_lr, num_steps=num_steps
        )

    return trajectory


def query_metrics(model: Model, params: PyTree, task: Task) -> tuple[jax.Array, Metrics]:
    """``(loss, metrics)`` of ``params`` on the query set, from one forward pass."""
    outputs = model.apply(params, task.query[0])
    return model.loss(outputs, task.query[1]), model.metrics(outputs, task.query[1])


# --- the outer learning rate some algorithms prescribe --------------------------------------


def algorithm_lr_schedule(
    algorithm_config: Any, learning_rate: float, num_steps: int
) -> optax.Schedule | None:
    """The meta learning-rate schedule an algorithm's config prescribes, or None.

    Algorithms whose config has ``meta_lr_schedule = "cosine"`` (MAML++) train with a cosine
    decay from ``learning_rate`` to ``learning_rate * meta_lr_final_fraction`` over
    ``num_steps`` meta-steps; the runner uses this schedule in place of its own. ``None``
    (every other algorithm, or ``meta_lr_schedule = "optimizer"``) leaves the choice to the
    optimiser config.

    >>> from metalearn.algorithms.mamlpp import MAMLPPConfig
    >>> schedule = algorithm_lr_schedule(MAMLPPConfig(), 1e-3, 100)
    >>> round(float(schedule(0)), 8), round(float(schedule(100)), 8)
    (0.001, 1e-05)
    >>> from metalearn.algorithms.maml import MAMLConfig
    >>> algorithm_lr_schedule(MAMLConfig(), 1e-3, 100) is None
    True
    """
    kind = getattr(algorithm_config, "meta_lr_schedule", "optimizer")
    if kind == "optimizer":
        return None
    if kind == "cosine":
        final = getattr(algorithm_config, "meta_lr_final_fraction", 0.0)
        return optax.cosine_decay_schedule(learning_rate, max(int(num_steps), 1), alpha=final)
    raise ValueError(f"algorithm.meta_lr_schedule must be 'cosine' or 'optimizer', got {kind!r}")
