"""Held-out evaluation: fixed tasks per split and shot count, evaluated in chunks of calls, their
per-task metrics summed up in records (:mod:`metalearn.statistics`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from metalearn.runner.devices import InFlight
from metalearn.statistics import paired_change, summarize

log = logging.getLogger("metalearn")

# Folded into the evaluation seed: validation and test tasks are different streams.
SPLIT_TAGS = {"train": 0, "val": 1, "test": 2}


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
    objective: Any,
    on_chunk: Callable[[int, int], None] | None = None,
    runs: int | None = None,
) -> list[dict] | list[list[dict]]:
    """Evaluate on ``num_tasks`` fixed tasks per shot count; one record per (metric, shots, steps).

    Records hold the :func:`summarize` fields, ``"ways"`` when given, and after k > 0 steps,
    when ``steps`` has 0, the :func:`paired_change` from before adaptation. Only the
    ``objective``'s minimised primary metric counts finite blow-ups as diverged.
    ``on_chunk(shots, tasks_done)`` is called as each call finishes. With ``runs``,
    ``eval_step``'s results have a leading runs axis and each run's records are returned.
    """
    every: list[list[dict]] = [[] for _ in range(runs or 1)]
    for shots in map(int, shots_list):
        keys = evaluation_keys(seed, split, shots, num_tasks)
        padded = -(-num_tasks // tasks_per_call) * tasks_per_call
        keys = jax.numpy.concatenate([keys, keys[: padded - num_tasks]])
        chunks, in_flight = [], InFlight()
        for i in range(0, padded, tasks_per_call):
            chunks.append(eval_step(meta_params, split_arrays, keys[i : i + tasks_per_call], shots))
            in_flight.add(chunks[-1])
            if on_chunk is not None:
                jax.block_until_ready(chunks[-1])
                on_chunk(shots, min(i + tasks_per_call, num_tasks))
        axis = 0 if runs is None else 1  # the tasks axis, after the runs axis of a group
        per_task = {
            name: np.concatenate([np.asarray(c[name]) for c in chunks], axis=axis)
            for name in chunks[0]
        }
        for run, records in enumerate(every):
            own = {k: (v if runs is None else v[run])[:num_tasks] for k, v in per_task.items()}
            records += _records(own, shots, steps, split, ways, objective)
    return every if runs is not None else every[0]


def _records(per_task, shots, steps, split, ways, objective) -> list[dict]:
    num_tasks, records = len(next(iter(per_task.values()))), []
    for name, values in sorted(per_task.items()):
        unadapted = values[:, list(steps).index(0)] if 0 in steps else None
        primary = name == objective.primary_metric
        before = unadapted if primary and not objective.maximize else None  # a loss
        maximized = primary and objective.maximize
        for column, num_steps in enumerate(steps):
            record = {"metric": name, "shots": int(shots), "steps": int(num_steps)}
            record.update({} if ways is None else {"ways": int(ways)})
            summary = summarize(values[:, column], before, lower_is_better=not maximized)
            record.update(summary, tasks=int(num_tasks))
            if unadapted is not None and num_steps != 0:
                record.update(paired_change(values[:, column], unadapted))
            if record["diverged"]:
                log.warning(
                    f"{split}: {record['diverged']} of {num_tasks} tasks diverged, "
                    f"{record['nonfinite']} of them non-finite ({name}, {shots} shots, "
                    f"{num_steps} steps)"
                )
            records.append(record)
    return records


def selection_score(records: list[dict], objective: Any, shots: int) -> float:
    """The objective's primary metric at the training shot count and the most inner steps
    evaluated, signed so that higher is better.

    >>> from types import SimpleNamespace
    >>> selection_score([{"metric": "reward"}], SimpleNamespace(primary_metric="return"), 1)
    Traceback (most recent call last):
    ...
    ValueError: the objective's primary metric 'return' is not among the metrics ... (reward); ...
    """
    metric = objective.primary_metric
    candidates = [r for r in records if r["metric"] == metric]
    if not candidates:
        found = ", ".join(sorted({r["metric"] for r in records})) or "none"
        raise ValueError(
            f"the objective's primary metric {metric!r} is not among the metrics its evaluation "
            f"returns ({found}); return {metric!r}, or name one of those as its primary_metric"
        )
    chosen = max(candidates, key=lambda r: (r["shots"] == shots, r["steps"]))
    if chosen["mean"] is None or chosen["nonfinite"]:
        return -math.inf  # a diverging model is never the best
    return chosen["mean"] if objective.maximize else -chosen["mean"]


def format_record(record: dict) -> str:
    """One line for a log or a table.

    >>> print(format_record({"metric": "mse", "shots": 5, "steps": 10, "mean": 0.35,
    ...     "ci95": 0.03, "median": 0.21, "median_ci95": [0.19, 0.23], "nonfinite": 1,
    ...     "diverged": 2, "tasks": 600}))
    mse shots=5 steps=10: 0.3500 ± 0.0300, median 0.2100 [0.1900, 0.2300] (2 of 600 tasks diverged, 1 non-finite)
    >>> print(format_record({"metric": "return", "shots": 1, "steps": 1, "mean": -17.0,
    ...     "ci95": 7.7, "nonfinite": 0, "diverged": 0, "tasks": 40, "change": 3.2,
    ...     "change_ci95": 1.1}))
    return shots=1 steps=1: -17.0000 ± 7.7000, change from 0 steps +3.2000 ± 1.1000
    """  # noqa: E501
    ways = f"ways={record['ways']} " if "ways" in record else ""
    head = f"{record['metric']} {ways}shots={record['shots']} steps={record['steps']}"
    if record["mean"] is None:
        return f"{head}: all {record['tasks']} tasks non-finite"
    ci = f" ± {record['ci95']:.4f}" if record["ci95"] is not None else ""
    median = change = tail = ""
    if record.get("median") is not None:
        bounds = record.get("median_ci95", [None, None])
        bounds = ", ".join("n/a" if b is None else f"{b:.4f}" for b in bounds)
        median = f", median {record['median']:.4f} [{bounds}]"
    if record.get("change") is not None:
        change_ci = record.get("change_ci95")
        change = f", change from 0 steps {record['change']:+.4f}"
        change += f" ± {change_ci:.4f}" if change_ci is not None else ""
    nonfinite, diverged = record["nonfinite"], record.get("diverged", record["nonfinite"])
    if diverged:
        tail = f" ({diverged} of {record['tasks']} tasks diverged, {nonfinite} non-finite)"
    return f"{head}: {record['mean']:.4f}{ci}{median}{change}{tail}"
