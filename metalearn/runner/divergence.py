"""What made a run diverge: the data (resampled tasks checked), the model (a non-finite loss
at the last good parameters), the inner loop's rate (adapting blows up) or the outer one's."""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from metalearn.data.family_checks import sampled_values_problem
from metalearn.runner.devices import replicated
from metalearn.runner.evaluation import evaluation_keys
from metalearn.runner.experiment import Experiment
from metalearn.runner.preflight import outer_step_settings
from metalearn.runner.steps import Trained, make_eval_step

# The inner loop "diverges" when adapting multiplies the mean query loss by more than this.
BLOW_UP = 10.0
PROBE_TASKS = 8
DATA_PROBE_TASKS = 256  # sampled only: their values are checked, no model is run


def inner_loop_verdict(
    before: np.ndarray, after: np.ndarray, steps: int, rate: Any, setting: str = "inner_lr"
) -> str:
    """Advice from per-task query losses before and after ``steps`` inner steps at ``rate``.

    >>> inner_loop_verdict(np.array([1.0, 2.0]), np.array([np.nan, 1e9]), 5, 1e4)[:58]
    'the inner loop diverges from the last good parameters (mea'
    >>> inner_loop_verdict(np.array([1.0, 2.0]), np.array([0.5, 1.0]), 1, 0.01)[:46]
    'the inner loop adapts sanely from the last goo'
    """
    mean_before, mean_after = float(np.mean(before)), float(np.mean(after))
    losses = f"mean query loss {mean_before:.4g} before adaptation, {mean_after:.4g} after {steps}"
    if not math.isfinite(mean_after) or mean_after > BLOW_UP * max(mean_before, 1e-12):
        return (
            f"the inner loop diverges from the last good parameters ({losses} inner step(s) at "
            f"algorithm.{setting}={rate}): lower algorithm.{setting}"
        )
    return (
        f"the inner loop adapts sanely from the last good parameters ({losses} inner step(s)), "
        "so the outer update diverged: lower optimizer.lr or set optimizer.grad_clip_norm"
    )


def divergence_advice(exp: Experiment, train_arrays: Any, good: Trained) -> str:
    """What to change after a NaN, judged from ``good`` (the last finite parameters and state)
    on ``train_arrays`` (the placed training split)."""
    cfg, mesh = exp.plan.config, exp.plan.mesh
    shots = cfg.trainer.shots
    try:
        data_problem = sampled_values_problem(exp.tasks, shots, DATA_PROBE_TASKS, distinct=False)
    except Exception:  # a diagnosis must never hide the error it explains
        data_problem = None
    if data_problem:
        return f"{DATA_PROBE_TASKS} training tasks sampled again {data_problem}"
    setting = next(iter(exp.learner.hyper), None)
    inner = f"algorithm.{setting} or " if setting is not None else ""
    outer = outer_step_settings(cfg.algorithm)
    if outer is not None:  # an outer step of its own (MAML-RL's TRPO): no optimizer to blame
        return f"lower {inner}{outer}"
    unknown = f"lower {inner}optimizer.lr, or set optimizer.grad_clip_norm"
    steps = int(getattr(cfg.algorithm, "inner_steps", 1))
    probe = make_eval_step(
        exp.learner,
        exp.tasks,
        steps=(0, steps) if setting is not None else (0,),  # before adaptation only, for none
        strategy=exp.plan.task_batching,
        mesh=mesh,
    )
    keys = evaluation_keys(cfg.eval.seed, "train", shots, PROBE_TASKS)
    try:
        hyper = replicated(exp.hyper, mesh)
        metrics = jax.device_get(probe(good, train_arrays, keys, shots, hyper.learner))
    except Exception:  # a diagnosis must never hide the error it explains
        return unknown
    name = next((n for n in ("loss", "mse") if n in metrics), None)
    if name is None:  # a task family without a loss metric (e.g. a reward): no probe verdict
        return unknown
    values = np.asarray(metrics[name], np.float64)
    if not np.isfinite(values[:, 0]).all():
        bad = int((~np.isfinite(values[:, 0])).sum())
        return (
            f"the query loss is already non-finite before any inner step, at the last good "
            f"parameters ({bad} of {PROBE_TASKS} training tasks), while the sampled tasks are "
            "finite: the model's outputs or the loss overflow (check the model), not a rate"
        )
    if setting is None:  # no inner learning rate (e.g. ProtoNets): only the outer one is left
        return "lower optimizer.lr or set optimizer.grad_clip_norm"
    rate = exp.learner.hyper[setting]
    return inner_loop_verdict(values[:, 0], values[:, 1], steps, rate, setting)
