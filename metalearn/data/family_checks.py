"""Checks of a task family's sampler, once, before a run trains or evaluates.

A family is code of the researcher's own as often as the library's, and a sampler that breaks
its contract used to run on, silently: one that ignores ``shots`` reported its "5-shot" results
on ten support examples; one that draws with ``numpy.random`` (run once, when the step is
traced) trained and tested on a single task; NaN inputs or labels out of range surfaced later
as a NaN blamed on a learning rate. :func:`check_family` refuses each in one line.

- Shapes, traced without computing (``jax.eval_shape``), for every split and shot count the run
  asks for: the task has ``support`` and ``query``; a supervised family's batches are
  ``(inputs, targets)`` of one leading size, inputs of the family's ``input_shape``, and as many
  support examples as the shots ask for (``shots`` for regression, ``ways * shots`` on the
  validation and test splits for classification, a multiple of ``shots`` in training, whose
  ways may differ).
- Values, on two training tasks sampled for real (one small compilation): different keys give
  different tasks, every float is finite, and labels are class indices below ``num_outputs``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from metalearn.data.task import SUPERVISED, TaskFamily, WeightedBatch

RANDOMNESS_HINT = (
    "draw every random number from the key the sampler is given (jax.random), not numpy.random "
    "or random, which run once, when the step is traced"
)


def check_family(
    family: TaskFamily, name: str, trainer_shots: int, eval_shots: Sequence[int]
) -> None:
    """ValueError (one line, naming ``data=name``) if ``family``'s sampler cannot give, or gives
    wrong, tasks for the shot counts a run asks for (see the module's docstring).

    >>> from metalearn.data.sinusoid import sinusoid
    >>> check_family(sinusoid(), "sinusoid", 10, [5, 10])  # the library's families pass
    >>> def ignores_shots(arrays, key, shots):
    ...     return sinusoid().sample(arrays, key, 10)
    >>> check_family(sinusoid()._replace(sample=ignores_shots), "mine", 10, [5, 10])
    Traceback (most recent call last):
    ...
    ValueError: data=mine: for eval.shots=5 on the test split its sampler gave 10 support ...
    """
    wanted = [("trainer.shots", trainer_shots, s, [trainer_shots]) for s in ("train", "val")]
    wanted += [("eval.shots", shots, "test", list(eval_shots)) for shots in eval_shots]
    for setting, shots, split, values in wanted:
        try:
            task = jax.eval_shape(
                lambda key, s=split, n=shots: family.sample(family.splits[s], key, n),
                jax.random.key(0),
            )
        except ValueError as err:  # the data cannot supply it (too few examples per class)
            shown = values if setting == "eval.shots" else values[0]
            raise ValueError(f"{setting}={shown}: {err}; lower {setting}") from None
        problem = task_shape_problem(family, task, shots, split)
        if problem:
            raise ValueError(
                f"data={name}: for {setting}={shots} on the {split} split its sampler gave "
                f"{problem}; see docs/extending.md"
            )
    problem = sampled_values_problem(family, trainer_shots)
    if problem:
        raise ValueError(f"data={name}: two training tasks sampled at the start {problem}")


def task_shape_problem(family: TaskFamily, task: Any, shots: int, split: str) -> str | None:
    """What is wrong with the shapes of ``task`` (abstract or concrete), or None."""
    if not (hasattr(task, "support") and hasattr(task, "query")):
        return f"a {type(task).__name__}, not a task with support and query (data.task.Task)"
    if family.kind not in SUPERVISED:
        return None
    for part in ("support", "query"):
        batch = getattr(task, part)
        if not isinstance(batch, tuple) or len(batch) < 2:
            return f"a {part} of {type(batch).__name__}, not an (inputs, targets) pair"
        inputs, targets = batch[0], batch[1]
        if tuple(inputs.shape[1:]) != tuple(family.input_shape):
            return (
                f"{part} inputs of shape {tuple(inputs.shape)}: examples of shape "
                f"{tuple(inputs.shape[1:])}, but the family's input_shape is "
                f"{tuple(family.input_shape)}"
            )
        if targets.shape[:1] != inputs.shape[:1]:
            return (
                f"{inputs.shape[0]} {part} inputs but {targets.shape[0] if targets.ndim else 0} "
                "targets"
            )
        if inputs.ndim and inputs.shape[0] == 0:  # a mean over no examples: a NaN loss later,
            return f"a {part} set of 0 examples"  # blamed on the model's outputs
    if isinstance(task.support, WeightedBatch):  # padded episodes: sizes are the maxima
        return None
    count = task.support[0].shape[0]
    if family.kind == "regression" and count != shots:
        return f"{count} support examples, not {shots} (regression: one per shot)"
    if family.kind == "classification":
        if split != "train" and family.ways and count != family.ways * shots:
            return (
                f"{count} support examples, not ways * shots = {family.ways} * {shots} = "
                f"{family.ways * shots}"
            )
        if count % shots:
            return f"{count} support examples, not a multiple of the {shots} shots per class"
    return None


TASKS_PER_CALL = 16  # tasks sampled at once: 16 miniImageNet episodes are about 100 MB


def sampled_values_problem(
    family: TaskFamily, shots: int, count: int = 2, distinct: bool = True
) -> str | None:
    """What is wrong with the values of ``count`` (at least 2) training tasks sampled for real,
    ``TASKS_PER_CALL`` at a time, or None: the first two the same (when ``distinct`` is asked
    for), or any non-finite or out-of-range value."""
    sample = jax.jit(jax.vmap(lambda arrays, key: family.sample(arrays, key, shots), (None, 0)))
    keys = jax.random.split(jax.random.key(0), max(count, 2))
    for start in range(0, len(keys), TASKS_PER_CALL):
        tasks = jax.device_get(sample(family.splits["train"], keys[start : start + TASKS_PER_CALL]))
        if distinct and start == 0 and _first_two_equal(tasks):
            return f"are the same task for two different keys: {RANDOMNESS_HINT}"
        problem = _values_problem(family, tasks)
        if problem:
            return problem
    return None


def _first_two_equal(tasks: Any) -> bool:
    leaves = jax.tree_util.tree_leaves(tasks)
    return bool(leaves) and all(np.array_equal(leaf[0], leaf[1]) for leaf in leaves)


def _values_problem(family: TaskFamily, tasks: Any) -> str | None:
    """A non-finite value or a label out of range in ``tasks`` (stacked, on the host), or None."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(tasks):
        leaf = np.asarray(leaf)
        if jnp.issubdtype(leaf.dtype, jnp.inexact) and not np.isfinite(leaf).all():
            return (
                f"hold non-finite values (NaN or inf) in task{jax.tree_util.keystr(path)}: "
                "check the data the sampler reads, or what it computes"
            )
    if family.kind == "classification":
        for part in ("support", "query"):
            batch = getattr(tasks, part)
            labels = np.asarray(batch[1])
            if isinstance(batch, WeightedBatch):
                labels = labels[np.asarray(batch.weights) > 0]
            outside = labels[(labels < 0) | (labels >= family.num_outputs)]
            if outside.size:
                return (
                    f"hold {part} labels outside 0..{family.num_outputs - 1} (e.g. "
                    f"{int(outside[0])}): labels index the model's {family.num_outputs} outputs "
                    "(the family's num_outputs); relabel each episode's classes 0..ways-1"
                )
    return None
