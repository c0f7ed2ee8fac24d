"""Task families and the objectives that score a model on their tasks.

Following learned_optimization's TaskFamily / Task split:

- a :class:`TaskFamily` samples a task from a key, on the device (``sample(split_arrays, key,
  shots)``). A task is any pytree with a ``support`` and a ``query`` entry: the data the inner
  loop adapts on and the data the adapted parameters are judged on. For a supervised episode
  those are ``(inputs, targets)`` batches; for a bandit or an RL task both may be the task's
  goal, and the loss draws its own samples or rollouts with the key it is given.
- an :class:`Objective`, built by the family for a model (``family.objective(model)``), is the
  task's loss ``loss(params, model_state, key, data, train=True) -> (loss, Aux)``, where
  :class:`Aux` carries the model's new state (batch-norm statistics) and scalar metrics. It
  also names the metric that selects the best parameters, so the runner and the evaluation
  never ask whether a task is a regression or a classification.

Supervised families say ``kind="regression"`` or ``kind="classification"`` and get
:func:`supervised_objective`; any other family passes its own ``objective``. A supervised batch
is ``(inputs, targets)`` or a :class:`WeightedBatch` ``(inputs, targets, weights)`` (padded
variable-way/variable-shot episodes): the loss and metrics are then means over the examples of
weight 1, padding never counts, and a classifier's logits of classes absent from the batch are
masked to ``-inf`` (:func:`supervised_loss_and_metrics`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from metalearn.models.base import Model
from metalearn.models.weighted_losses import weighted_classification_metrics, weighted_mean

PyTree = Any
Batch = tuple[jax.Array, jax.Array]  # (inputs, targets)
Metrics = dict[str, jax.Array]


class Task(NamedTuple):
    """One task: a support set to adapt on and a query set to evaluate on (any pytrees)."""

    support: PyTree
    query: PyTree


class WeightedBatch(NamedTuple):
    """A padded supervised batch: inputs, targets (labels ``-1`` for padding), weights (1.0 for
    a real example, 0.0 for padding). A tuple, so ``batch[0]`` / ``batch[1]`` are the inputs
    and targets as for an ``(inputs, targets)`` batch."""

    inputs: jax.Array
    labels: jax.Array
    weights: jax.Array


class Aux(NamedTuple):
    """What a task loss returns beside the scalar: the new model state and metrics."""

    model_state: PyTree
    metrics: Metrics


# loss(params, model_state, key, data, train) -> (scalar, Aux)
TaskLoss = Callable[[PyTree, PyTree, jax.Array, PyTree, bool], tuple[jax.Array, Aux]]


class Objective(NamedTuple):
    """A model scored on one family's tasks.

    - ``loss(params, model_state, key, data, train=True) -> (loss, Aux)``.
    - ``primary_metric`` and ``maximize``: the metric (a key of ``Aux.metrics``) that selects
      the best parameters on validation, and whether higher is better.
    - ``gauss_newton``: for losses of the form ``output_loss(predict(params), data)`` with a
      convex ``output_loss``, the pair ``(predict(params, model_state, key, data),
      output_loss(outputs, data))`` (iMAML's Gauss-Newton curvature needs it); else None.
    """

    model: Model
    loss: TaskLoss
    primary_metric: str
    maximize: bool
    gauss_newton: tuple[Callable, Callable] | None = None


class TaskFamily(NamedTuple):
    """A family of tasks, sampled on the device inside jitted code.

    ``splits`` maps a split name (``"train"``, ``"val"``, ``"test"``) to the device arrays the
    sampler needs for it (an empty dict for generated tasks such as sinusoids). They are passed to
    ``sample`` as an argument, never closed over, so they are not baked into compiled code.
    ``sample(split_arrays, key, shots)`` returns one task (a pytree with ``support`` and
    ``query``); ``shots`` is a static int (support examples per class, or per task for
    regression). ``objective(model) -> Objective`` scores a model on the family's tasks; left
    None, a supervised family (``kind`` ``"regression"`` or ``"classification"``) gets
    :func:`supervised_objective`. ``input_shape`` and ``num_outputs`` size the model.
    """

    splits: dict[str, PyTree]
    sample: Callable[[PyTree, jax.Array, int], PyTree]
    input_shape: tuple[int, ...]
    num_outputs: int
    kind: str = "custom"
    ways: int | None = None
    objective: Callable[[Model], Objective] | None = None


def family_objective(family: TaskFamily, model: Model, name: str = "the task family") -> Objective:
    """The objective that scores ``model`` on ``family``'s tasks (``name`` names the family in
    the error raised when it has neither a supervised ``kind`` nor an ``objective``)."""
    if family.objective is not None:
        return family.objective(model)
    if family.kind not in SUPERVISED:
        raise ValueError(
            f"{name} has kind={family.kind!r} and no objective: a supervised family "
            f"says kind='regression' or 'classification', any other passes its own "
            "objective(model) -> Objective (docs/extending.md)"
        )
    return supervised_objective(model, family.kind)


def mse_loss(outputs: jax.Array, targets: jax.Array) -> jax.Array:
    """The mean squared error over every element."""
    return jnp.mean((outputs - targets) ** 2)


def cross_entropy_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """The mean softmax cross-entropy of ``logits [examples, classes]`` on integer labels."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def regression_metrics(outputs: jax.Array, targets: jax.Array) -> Metrics:
    """``{"mse": ...}``, the metrics of a regression task."""
    return {"mse": mse_loss(outputs, targets)}


def classification_metrics(logits: jax.Array, labels: jax.Array) -> Metrics:
    """``{"loss": cross-entropy, "accuracy": ...}``, the metrics of a classification task."""
    return {
        "loss": cross_entropy_loss(logits, labels),
        "accuracy": jnp.mean(jnp.argmax(logits, -1) == labels),
    }


SUPERVISED = {
    # kind: (output loss, metrics, primary metric, maximize)
    "regression": (mse_loss, regression_metrics, "mse", False),
    "classification": (cross_entropy_loss, classification_metrics, "accuracy", True),
}


def mask_absent_classes(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
    """``logits`` with the classes that no example of weight > 0 carries set to ``-inf`` (all
    kept if none is present), so a head with ``max_ways`` outputs scores a smaller episode as
    a classifier over its present classes.

    >>> logits = jnp.zeros((3, 4))
    >>> mask_absent_classes(logits, jnp.array([0, 2, -1]), jnp.array([1.0, 1.0, 0.0]))[0].tolist()
    [0.0, -inf, 0.0, -inf]
    """
    real = jnp.where(weights > 0, labels, -1)
    present = jax.nn.one_hot(real, logits.shape[-1], dtype=bool).any(axis=0)
    present = present | ~present.any()
    return jnp.where(present, logits, -jnp.inf)


def describe(value: Any) -> str:
    """What ``value`` (abstract or concrete) is, in a few words, for an error message.

    >>> describe(jax.ShapeDtypeStruct((10,), jnp.float32)), describe((1, 2)), describe(None)
    ('an array of shape (10,) (float32)', 'a tuple of 2 items', 'None')
    """
    if value is None:
        return "None"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"an array of shape {tuple(value.shape)} ({value.dtype})"
    if isinstance(value, tuple | list):
        name = "a tuple" if isinstance(value, tuple) else "a list"
        shapes = [tuple(v.shape) for v in value if hasattr(v, "shape")]
        of_arrays = f" (arrays of shapes {', '.join(map(str, shapes))})" if shapes else ""
        return f"{name} of {len(value)} item{'s' if len(value) != 1 else ''}{of_arrays}"
    return f"a {type(value).__name__}"


def check_output_shapes(kind: str, outputs: jax.Array, targets: jax.Array) -> None:
    """ValueError (one line) unless a supervised ``kind``'s model ``outputs`` and task
    ``targets`` fit without broadcasting: equal shapes for regression (outputs ``(n, 1)``
    against targets ``(n,)`` made the mean squared error an ``(n, n)`` mean, silently), integer
    labels of the logits' leading shape for classification. Shapes are static: this costs
    nothing in the compiled step.

    >>> check_output_shapes("regression", jnp.zeros((10, 1)), jnp.zeros(10))
    Traceback (most recent call last):
    ...
    ValueError: regression: the model's outputs have shape (10, 1) and the task's targets (10,); ...
    """
    if not hasattr(outputs, "shape"):  # a tuple: "'tuple' object has no attribute 'shape'"
        raise ValueError(
            f"{kind}: the model's apply returned {describe(outputs)}, not one array of "
            "outputs; return the outputs alone (see docs/extending.md, a model)"
        )
    outputs_shape, targets_shape = tuple(outputs.shape), tuple(targets.shape)
    if kind == "regression" and outputs_shape != targets_shape:
        raise ValueError(
            f"regression: the model's outputs have shape {outputs_shape} and the task's targets "
            f"{targets_shape}; the squared error would broadcast them: make them the same shape "
            "(the task family's targets, or the model's number of outputs)"
        )
    if kind == "classification" and (
        outputs_shape[:-1] != targets_shape or not jnp.issubdtype(targets.dtype, jnp.integer)
    ):
        raise ValueError(
            f"classification: the model's logits have shape {outputs_shape} and the task's "
            f"labels {targets_shape} ({targets.dtype}); labels are class indices, integers of "
            "shape logits.shape[:-1]"
        )


def supervised_loss_and_metrics(kind: str, outputs: jax.Array, batch) -> tuple[jax.Array, Metrics]:
    """``(loss, metrics)`` of a supervised ``kind`` on ``batch``: plain means for
    ``(inputs, targets)``, means over the real examples for a :class:`WeightedBatch`.

    >>> logits = jnp.array([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 9.0]])
    >>> batch = WeightedBatch(None, jnp.array([0, 0, -1]), jnp.array([1.0, 1.0, 0.0]))
    >>> loss, metrics = supervised_loss_and_metrics("classification", logits, batch)
    >>> float(metrics["accuracy"]), round(float(loss), 4)  # classes 1, 2 absent: class 0 only
    (1.0, 0.0)
    """
    output_loss, metrics_fn, _, _ = SUPERVISED[kind]
    targets = batch[1]
    check_output_shapes(kind, outputs, targets)
    if not isinstance(batch, WeightedBatch):
        return output_loss(outputs, targets), metrics_fn(outputs, targets)
    if kind == "classification":
        metrics = weighted_classification_metrics(
            mask_absent_classes(outputs, targets, batch.weights), targets, batch.weights
        )
        return metrics["loss"], metrics
    per_example = jnp.mean((outputs - targets) ** 2, axis=tuple(range(1, outputs.ndim)))
    mse = weighted_mean(per_example, batch.weights)
    return mse, {"mse": mse}


def real_examples(batch) -> jax.Array | None:
    """The mask of a batch's real examples (bool ``[examples]``) for a :class:`WeightedBatch`,
    None for a plain ``(inputs, targets)`` batch (every example real).

    >>> real_examples(WeightedBatch(None, None, jnp.array([1.0, 0.0]))).tolist()
    [True, False]
    """
    return batch.weights > 0 if isinstance(batch, WeightedBatch) else None


def apply_to_batch(apply, params, model_state, key, batch, train=True):
    """``apply(params, model_state, key, inputs, train)`` on a supervised batch's inputs; a
    padded :class:`WeightedBatch` also passes ``mask`` (its real examples), so that batch
    statistics ignore the padding (see :class:`~metalearn.models.base.Model`)."""
    mask = real_examples(batch)
    if mask is None:
        return apply(params, model_state, key, batch[0], train)
    return apply(params, model_state, key, batch[0], train, mask=mask)


def supervised_objective(model: Model, kind: str) -> Objective:
    """Score ``model`` on ``(inputs, targets)`` batches: mean squared error (``"regression"``)
    or softmax cross-entropy with integer labels (``"classification"``). On a
    :class:`WeightedBatch` both are means over its real examples, with absent classes masked
    (:func:`supervised_loss_and_metrics`), so every algorithm that scores data through the
    objective ignores padding.

    >>> import jax, jax.numpy as jnp
    >>> from metalearn.models.base import model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> model = model_from_flax(MLP((8,), 1), (1,))
    >>> objective = supervised_objective(model, "regression")
    >>> params, state = model.init(jax.random.key(0))
    >>> batch = (jnp.ones((4, 1)), jnp.zeros((4, 1)))
    >>> loss, aux = objective.loss(params, state, jax.random.key(1), batch)
    >>> sorted(aux.metrics), objective.primary_metric, objective.maximize
    (['mse'], 'mse', False)
    """
    if kind not in SUPERVISED:
        raise ValueError(f"unknown task kind {kind!r}; expected one of {sorted(SUPERVISED)}")
    _, _, primary, maximize = SUPERVISED[kind]

    def predict(params, model_state, key, batch, train=True):
        return apply_to_batch(model.apply, params, model_state, key, batch, train)

    def loss(params, model_state, key, batch, train=True):
        outputs, new_state = predict(params, model_state, key, batch, train)
        value, batch_metrics = supervised_loss_and_metrics(kind, outputs, batch)
        return value, Aux(new_state, batch_metrics)

    def gn_predict(params, model_state, key, batch):
        return predict(params, model_state, key, batch)[0]

    def gn_loss(outputs, batch):
        return supervised_loss_and_metrics(kind, outputs, batch)[0]

    return Objective(model, loss, primary, maximize, (gn_predict, gn_loss))
