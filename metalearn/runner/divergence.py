"""Which learning rate made a run diverge: the inner loop's or the outer (meta) optimiser's.

When training produces a NaN, the parameters of the last good checkpoint (or the initial ones)
are adapted on a few training tasks. If the inner loop already blows the query loss up from
there, ``algorithm.inner_lr`` is the likely culprit; if it adapts sanely, the outer update is
(``optimizer.lr``, or gradients that need clipping).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from metalearn.runner.devices import replicated
from metalearn.runner.evaluation import evaluation_keys
from metalearn.runner.experiment import outer_step_settings
from metalearn.runner.steps import Trained, make_eval_step

# The inner loop "diverges" when adapting multiplies the mean query loss by more than this.
BLOW_UP = 10.0
PROBE_TASKS = 8


def inner_loop_verdict(before: np.ndarray, after: np.ndarray, steps: int, inner_lr: Any) -> str:
    """Advice from per-task query losses before and after ``steps`` inner steps.

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
            f"algorithm.inner_lr={inner_lr}): lower algorithm.inner_lr"
        )
    return (
        f"the inner loop adapts sanely from the last good parameters ({losses} inner step(s)), "
        "so the outer update diverged: lower optimizer.lr or set optimizer.grad_clip_norm"
    )


def divergence_advice(cfg: Any, exp: Any, train_arrays: Any, mesh: Any, good: Trained) -> str:
    """What to change after a NaN, judged from ``good`` (the last finite parameters and state)."""
    inner_lr = getattr(cfg.algorithm, "inner_lr", None)
    outer = outer_step_settings(cfg.algorithm)
    if outer is not None:  # an outer step of its own (MAML-RL's TRPO): no optimizer to blame
        inner = "algorithm.inner_lr or " if inner_lr is not None else ""
        return f"lower {inner}{outer}"
    if inner_lr is None:  # no inner learning rate (e.g. ProtoNets): only the outer one is left
        return "lower optimizer.lr or set optimizer.grad_clip_norm"
    steps = int(getattr(cfg.algorithm, "inner_steps", 1))
    probe = make_eval_step(
        exp.learner_for, exp.tasks, steps=(0, steps), strategy=exp.task_batching, mesh=mesh
    )
    keys = evaluation_keys(cfg.eval.seed, "train", cfg.trainer.shots, PROBE_TASKS)
    try:
        hyper = replicated(exp.hyper, mesh)
        metrics = jax.device_get(probe(good, train_arrays, keys, cfg.trainer.shots, hyper))
    except Exception:  # a diagnosis must never hide the error it explains
        return "lower algorithm.inner_lr or optimizer.lr, or set optimizer.grad_clip_norm"
    name = next((n for n in ("loss", "mse") if n in metrics), None)
    if name is None:  # a task family without a loss metric (e.g. a reward): no probe verdict
        return "lower algorithm.inner_lr or optimizer.lr, or set optimizer.grad_clip_norm"
    values = np.asarray(metrics[name], np.float64)
    return inner_loop_verdict(values[:, 0], values[:, 1], steps, inner_lr)
