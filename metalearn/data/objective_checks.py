"""Checks of a task family's objective and the model it scores, once, before a run trains or
evaluates.

A family's own ``objective(model)`` is code of the researcher's own, and a loss that breaks its
contract, ``loss(params, model_state, key, data, train) -> (scalar, Aux(model_state, metrics))``,
failed deep inside the algorithms or the runner with a message about JAX's internals (``Too
many indices``, ``scan body function carry input and carry output must have the same pytree
structure``, ``iteration over a 0-d array`` after the first steps had trained), or ran on,
silently: a loss that returns the model state it was given trained a batch-norm model whose
running statistics never moved. :func:`check_objective` refuses each in one line, traced
without computing (``jax.eval_shape``) on a task the family's sampler gives:

- the loss returns a pair whose first item is a scalar (float) and whose second is an
  :class:`~metalearn.data.task.Aux`: the model state, of the structure and shapes of the one it
  was given, and a dict of scalar metrics (in training and in evaluation);
- in training, it returns the state the model's ``apply`` gave, where that ``apply`` updates
  the state (told apart by identity: the loss handed back the very state it was given);
- for a supervised family (whose loss is the library's), the model's ``apply`` returns one
  array of outputs.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from metalearn.data.task import (
    SUPERVISED,
    Aux,
    Objective,
    TaskFamily,
    apply_to_batch,
    describe,
)

OBJECTIVE_DOCS = "see docs/extending.md (a task family that is not supervised)"
MODEL_DOCS = "see docs/extending.md (a model)"


def _shapes(tree: Any) -> dict[str, tuple[tuple[int, ...], Any]]:
    return {path: (tuple(jnp.shape(leaf)), leaf.dtype) for path, leaf in _leaves(tree)}


def _state_summary(state: Any) -> str:
    """``state`` in a few words: ``{}``, or its first entries with their shapes and dtypes."""
    if not isinstance(state, dict):
        return describe(state)
    entries = [f"{path} {shape} {dtype}" for path, (shape, dtype) in _shapes(state).items()]
    more = ", ..." if len(entries) > 2 else ""
    return f"a dict of {', '.join(entries[:2])}{more}" if entries else "{}"


def _state_problem(returned: Any, given: Any) -> str | None:
    """How ``returned`` (a loss's ``Aux.model_state``) differs from the state ``given``."""
    same_structure = jax.tree.structure(returned) == jax.tree.structure(given)
    if same_structure and _shapes(returned) == _shapes(given):
        return None
    return (
        f"Aux.model_state {_state_summary(returned)}, not a state of the structure and shapes "
        f"of the one it was given ({_state_summary(given)})"
    )


def loss_output_problem(returned: Any, given_state: Any) -> str | None:
    """What is wrong with what an objective's loss returned (abstract), or None."""
    pair = "(loss, Aux(model_state, metrics)) (metalearn.data.task.Aux)"
    if not (isinstance(returned, tuple) and len(returned) == 2):
        return f"{describe(returned)}, not the pair {pair}"
    loss, aux = returned
    if not (hasattr(loss, "shape") and hasattr(loss, "dtype")):
        return f"a loss that is {describe(loss)}, not a scalar array"
    if tuple(loss.shape) != () or not jnp.issubdtype(loss.dtype, jnp.floating):
        return (
            f"a loss of shape {tuple(loss.shape)} ({loss.dtype}), not a float scalar: the "
            "algorithms differentiate it (jax.grad); reduce it to one number (jnp.mean)"
        )
    if not isinstance(aux, Aux):
        return f"a pair whose second item is {describe(aux)}, not {pair}"
    state_problem = _state_problem(aux.model_state, given_state)
    if state_problem:
        return (
            f"{state_problem}: return the state model.apply returned (the state it was given, "
            "for a model without state)"
        )
    if not isinstance(aux.metrics, dict):
        return (
            f"metrics that are {describe(aux.metrics)}, not a dict of scalars "
            "({'name': value, ...})"
        )
    for name, value in aux.metrics.items():
        if not isinstance(name, str) or not hasattr(value, "shape") or tuple(value.shape) != ():
            shown = describe(value) if not hasattr(value, "shape") else f"of shape {value.shape}"
            return (
                f"the metric {name!r} {shown}, not a scalar: metrics are averaged over tasks "
                "and logged as numbers; reduce it to one number (jnp.mean)"
            )
    return None


def check_objective(
    objective: Objective, family: TaskFamily, data_name: str, model_name: str, shots: int
) -> None:
    """ValueError (one line, naming ``data=data_name`` or ``model=model_name``) if ``objective``
    or its model breaks the contract of a loss (see the module's docstring). Traced only, on a
    training task of ``shots`` shots; the family's sampler is checked before
    (:func:`~metalearn.data.family_checks.check_family`).

    >>> from metalearn.data.sinusoid import sinusoid
    >>> from metalearn.data.task import family_objective
    >>> from metalearn.models.base import model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> family, model = sinusoid(), model_from_flax(MLP((8,), 1), (1,))
    >>> check_objective(family_objective(family, model), family, "sinusoid", "mlp", 10)
    >>> def scalar_only(objective):
    ...     return objective._replace(loss=lambda *args: objective.loss(*args)[0])
    >>> mine = family._replace(objective=lambda m: scalar_only(family_objective(family, m)))
    >>> check_objective(mine.objective(model), mine, "mine", "mlp", 10)
    Traceback (most recent call last):
    ...
    ValueError: data=mine: its objective's loss (train=True, on a task's support set) returned ...
    """
    model = objective.model
    supervised = family.objective is None and family.kind in SUPERVISED
    params, state = jax.eval_shape(model.init, jax.random.key(0))
    task = jax.eval_shape(
        lambda key: family.sample(family.splits["train"], key, shots), jax.random.key(0)
    )
    if supervised:
        outputs = jax.eval_shape(
            lambda p, s, key, batch: apply_to_batch(model.apply, p, s, key, batch, True)[0],
            params,
            state,
            jax.random.key(0),
            task.support,
        )
        if not (hasattr(outputs, "shape") and hasattr(outputs, "dtype")):
            raise ValueError(
                f"model={model_name}: its apply returned {describe(outputs)}, not one array of "
                f"outputs, which data={data_name}'s {family.kind} loss scores: return the "
                f"outputs alone; {MODEL_DOCS}"
            )
    stale: list[str] = []

    def losses(params, state, key, task):
        train = objective.loss(params, state, key, task.support, True)
        evaluation = objective.loss(params, state, key, task.query, False)
        given = dict(_leaves(state))
        if given and _is_pair_with_aux(train):
            example = jnp.zeros((1, *family.input_shape), jnp.float32)
            _, applied = model.apply(params, state, key, example, True)
            updated = {p for p, leaf in _leaves(applied) if p in given and leaf is not given[p]}
            kept = {p for p, leaf in _leaves(train[1].model_state) if given.get(p) is leaf}
            stale.extend(sorted(updated & kept))
        return train, evaluation

    train, evaluation = jax.eval_shape(losses, params, state, jax.random.key(0), task)
    who = (
        f"data={data_name}: its objective's loss"
        if family.objective is not None
        else f"model={model_name} on data={data_name}: the {family.kind} loss"
    )
    docs = OBJECTIVE_DOCS if family.objective is not None else MODEL_DOCS
    for returned, call in [
        (train, "train=True, on a task's support set"),
        (evaluation, "train=False, on a task's query set"),
    ]:
        problem = loss_output_problem(returned, state)
        if problem:
            raise ValueError(f"{who} ({call}) returned {problem}; {docs}")
    if stale:
        raise ValueError(
            f"{who} returns, in training (train=True), the model state it was given, but "
            f"model={model_name}'s apply updates that state ({', '.join(stale[:2])}"
            f"{', ...' if len(stale) > 2 else ''}): its running statistics would never move; "
            f"return the state model.apply returned, Aux(new_state, metrics); {docs}"
        )


def _leaves(tree: Any) -> list[tuple[str, Any]]:
    """``tree``'s leaves with their paths, ``"batch_stats/BatchNorm_0/mean"``."""
    return [
        (jax.tree_util.keystr(path, simple=True, separator="/"), leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    ]


def _is_pair_with_aux(returned: Any) -> bool:
    return isinstance(returned, tuple) and len(returned) == 2 and isinstance(returned[1], Aux)
