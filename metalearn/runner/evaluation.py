"""Held-out evaluation: per-task metrics to mean and 95% confidence interval records."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

log = logging.getLogger("metalearn")

# Domain tags folded into the evaluation seed, so validation and test tasks are different
# streams, and both differ from training (which folds the training seed, not this one).
SPLIT_TAGS = {"train": 0, "val": 1, "test": 2}


def mean_and_ci95(values: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """Mean and half-width of the normal 95% confidence interval, 1.96 * s / sqrt(n).

    ``s`` is the sample standard deviation (ddof=1), as in the MAML paper's tables.

    >>> mean_and_ci95([1.0, 2.0, 3.0, 4.0])
    (2.5, 1.2651...)
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no values to average")
    if values.size == 1:
        return float(values[0]), float("nan")
    return float(values.mean()), float(1.96 * values.std(ddof=1) / math.sqrt(values.size))


def summarize(values: np.ndarray) -> dict:
    """``mean`` and ``ci95`` over the finite per-task values, and how many were not finite.

    A task whose inner loop diverges (an infinite or NaN loss) is counted in ``nonfinite``
    rather than turning the mean into NaN; a non-zero count is always worth a look.
    """
    finite = np.isfinite(values)
    nonfinite = int(values.size - finite.sum())
    if nonfinite == values.size:
        return {"mean": None, "ci95": None, "nonfinite": nonfinite}
    mean, ci95 = mean_and_ci95(values[finite])
    return {"mean": mean, "ci95": None if math.isnan(ci95) else ci95, "nonfinite": nonfinite}


def evaluation_keys(seed: int, split: str, shots: int, num_tasks: int) -> jax.Array:
    """The fixed keys of ``num_tasks`` evaluation tasks of one split and shot count."""
    key = jax.random.fold_in(jax.random.key(seed), SPLIT_TAGS[split])
    return jax.random.split(jax.random.fold_in(key, shots), num_tasks)


def evaluate_split(
    eval_step: Callable,
    meta_params: Any,
    split_arrays: Any,
    *,
    split: str,
    seed: int,
    shots_list: Sequence[int],
    steps: Sequence[int],
    num_tasks: int,
    tasks_per_call: int,
    ways: int | None,
) -> list[dict]:
    """Evaluate on ``num_tasks`` fixed tasks per shot count; one record per (metric, shots, steps).

    Records look like ``{"metric": "mse", "shots": 5, "steps": 10, "mean": ..., "ci95": ...,
    "tasks": 600}``, with ``"ways"`` added for classification.
    """
    records = []
    for shots in shots_list:
        keys = evaluation_keys(seed, split, shots, num_tasks)
        padded = -(-num_tasks // tasks_per_call) * tasks_per_call
        keys = (
            jax.numpy.concatenate([keys, keys[: padded - num_tasks]])
            if padded > num_tasks
            else keys
        )
        chunks = [
            eval_step(meta_params, split_arrays, keys[i : i + tasks_per_call], int(shots))
            for i in range(0, padded, tasks_per_call)
        ]
        per_task = {
            name: np.concatenate([np.asarray(c[name]) for c in chunks])[:num_tasks]
            for name in chunks[0]
        }
        for name, values in sorted(per_task.items()):
            for column, num_steps in enumerate(steps):
                record = {"metric": name, "shots": int(shots), "steps": int(num_steps)}
                if ways is not None:
                    record["ways"] = int(ways)
                record.update(summarize(values[:, column]), tasks=int(num_tasks))
                if record["nonfinite"]:
                    log.warning(
                        "%s: %d of %d tasks non-finite (%s, %d shots, %d steps)",
                        split,
                        record["nonfinite"],
                        num_tasks,
                        name,
                        shots,
                        num_steps,
                    )
                records.append(record)
    return records


def selection_score(records: list[dict], objective: Any, shots: int) -> float:
    """The objective's primary metric at the training shot count and the most inner steps
    evaluated, signed so that higher is better (``objective``: any object with
    ``primary_metric`` and ``maximize``, e.g. :class:`metalearn.data.task.Objective`)."""
    metric = objective.primary_metric
    candidates = [r for r in records if r["metric"] == metric]
    chosen = max(candidates, key=lambda r: (r["shots"] == shots, r["steps"]))
    if chosen["mean"] is None or chosen["nonfinite"]:
        return -math.inf  # a diverging model is never the best
    return chosen["mean"] if objective.maximize else -chosen["mean"]


def format_record(record: dict) -> str:
    """One line for a log or a table, e.g. ``mse shots=5 steps=10: 0.3512 ± 0.0301``."""
    ways = f"ways={record['ways']} " if "ways" in record else ""
    head = f"{record['metric']} {ways}shots={record['shots']} steps={record['steps']}"
    if record["mean"] is None:
        return f"{head}: all {record['tasks']} tasks non-finite"
    ci = f" ± {record['ci95']:.4f}" if record["ci95"] is not None else ""
    tail = (
        f" ({record['nonfinite']} of {record['tasks']} tasks non-finite)"
        if record["nonfinite"]
        else ""
    )
    return f"{head}: {record['mean']:.4f}{ci}{tail}"
