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
    on_chunk: Callable[[int, int], None] | None = None,
) -> list[dict]:
    """Evaluate on ``num_tasks`` fixed tasks per shot count; one record per (metric, shots, steps).

    Records look like ``{"metric": "mse", "shots": 5, "steps": 10, "mean": ..., "ci95": ...,
    "tasks": 600}``, with ``"ways"`` added for classification. ``on_chunk(shots, tasks_done)``,
    if given, is called as each jitted call finishes (for a progress bar).
    """
    records = []
    for shots in map(int, shots_list):
        keys = evaluation_keys(seed, split, shots, num_tasks)
        padded = -(-num_tasks // tasks_per_call) * tasks_per_call
        keys = (
            jax.numpy.concatenate([keys, keys[: padded - num_tasks]])
            if padded > num_tasks
            else keys
        )
        chunks = []
        for i in range(0, padded, tasks_per_call):
            chunks.append(eval_step(meta_params, split_arrays, keys[i : i + tasks_per_call], shots))
            if on_chunk is not None:
                jax.block_until_ready(chunks[-1])
                on_chunk(shots, min(i + tasks_per_call, num_tasks))
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


def check_shot_counts(
    sample: Callable, splits: dict, trainer_shots: int, eval_shots: Sequence[int]
) -> None:
    """Fail before training if the data cannot supply a shot count the run will ask for.

    Traces (without computing) ``sample(split_arrays, key, shots)`` for ``trainer.shots`` on the
    train and validation splits and for each of ``eval.shots`` on the test split; a sampler's
    ValueError comes back naming the key to change.

    >>> def sample(arrays, key, shots):
    ...     if shots > 18:
    ...         raise ValueError(f"shots={shots} exceeds the 20 examples per class")
    ...     return shots
    >>> check_shot_counts(sample, {"train": {}, "val": {}, "test": {}}, 5, [5, 50])
    Traceback (most recent call last):
    ...
    ValueError: eval.shots=[5, 50]: shots=50 exceeds the 20 examples per class; lower eval.shots
    """
    key = jax.random.key(0)
    wanted = [("trainer.shots", trainer_shots, s, [trainer_shots]) for s in ("train", "val")]
    wanted += [("eval.shots", shots, "test", list(eval_shots)) for shots in eval_shots]
    for name, shots, split, setting in wanted:
        try:
            jax.eval_shape(lambda k, s=split, n=shots: sample(splits[s], k, n), key)
        except ValueError as err:
            shown = setting if name == "eval.shots" else setting[0]
            raise ValueError(f"{name}={shown}: {err}; lower {name}") from None
