"""The checks that need a run's built parts or the machine, each run once as
:func:`~metalearn.runner.experiment.build` builds the part: each problem is a one-line
ValueError naming the setting or the part to fix."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from metalearn.algorithms.base import MetaLearner, check_batch_update
from metalearn.config import Config, OptimizerConfig
from metalearn.data.family_checks import check_family
from metalearn.data.objective_checks import check_objective
from metalearn.data.task import Objective, TaskFamily
from metalearn.models.base import Model, module_problem
from metalearn.registry import ALGORITHMS, TASKS, selected_parts
from metalearn.runner.plan import RunPlan

__all__ = [
    "check_family_and_objective",
    "check_learner",
    "check_module",
    "check_parameters",
    "check_settings",
    "outer_step_settings",
]


def check_settings(plan: RunPlan) -> None:
    """Refuses ``optimizer.*`` settings nothing reads, and what the task family refuses (its
    ``run_refusal``: a locomotion batch that would hang jaxlib's LAPACK, say)."""
    cfg, default = plan.config, OptimizerConfig()
    settings = outer_step_settings(cfg.algorithm)
    changed = [
        f"optimizer.{f.name}={getattr(cfg.optimizer, f.name)}"
        for f in dataclasses.fields(OptimizerConfig)
        if getattr(cfg.optimizer, f.name) != getattr(default, f.name)
    ]
    if settings is not None and changed:
        raise ValueError(
            f"{', '.join(changed)} would have no effect: algorithm={cfg.algorithm.name} takes "
            f"its outer step with {settings}, not the optimizer section; drop the setting"
        )
    # A head solved for fewer classes than an episode has would drop the others' examples.
    max_ways = getattr(cfg.algorithm, "max_ways", 0)
    ways = max(getattr(cfg.data, "ways", 0) or 0, getattr(cfg.data, "train_ways", 0) or 0)
    if 0 < max_ways < ways:
        raise ValueError(
            f"algorithm.max_ways={max_ways} is below the episodes' {ways} ways (data.ways, "
            f"data.train_ways): the examples of the other classes would be dropped; set "
            f"algorithm.max_ways={ways}, or 0 for the support-set size"
        )
    check_train_labels(cfg)
    refusal = TASKS.entry(cfg.data.name).info.get("run_refusal", lambda *_: None)
    error = refusal(cfg, plan.task_batching, plan.platform, plan.device_count)
    if error:
        raise ValueError(error)


def check_train_labels(cfg: Config) -> None:
    """Refuses an algorithm that pretrains a classifier over the training classes (it declares
    ``class_labels``) on episodes labelled ``0..ways-1``, and class labels for any other."""
    name = cfg.algorithm.name
    wants = ALGORITHMS.entry(name).info.get("class_labels", False)
    labels = getattr(cfg.data, "train_labels", None)
    if wants and labels is None:
        raise ValueError(
            f"algorithm={name} pretrains a classifier over a few-shot dataset's training "
            f"classes; data={cfg.data.name} has none: choose data=omniglot, miniimagenet, "
            "cifarfs or fc100"
        )
    if wants and labels != "class":
        raise ValueError(
            f"algorithm={name} pretrains a classifier over the training classes: set "
            "data.train_labels=class (training labels are then the classes' indices; the "
            f"*_{name} experiments set it)"
        )
    if labels == "class" and not wants:
        raise ValueError(
            "data.train_labels=class labels training episodes by class for an algorithm that "
            f"pretrains a classifier (baseline, baseline_pp); algorithm={name} meta-learns on "
            "episodes: drop it"
        )


def outer_step_settings(algorithm_config: Any) -> str | None:
    """What sets the algorithm's outer step when the ``optimizer`` section does not (None)."""
    declared = ALGORITHMS.entry(algorithm_config.name).info.get("outer_step_settings")
    return declared(algorithm_config) if declared else None


def check_module(module: Any, model_name: str, tasks: TaskFamily, data_name: str) -> None:
    """What a model factory returned: a Flax module, for inputs of the family's rank."""
    problem = module_problem(module)
    if problem:
        raise ValueError(
            f"model={model_name}: its factory returned {problem}; see docs/extending.md (a model)"
        )
    rank = getattr(module, "input_rank", None)
    if rank == 3 and len(tasks.input_shape) != 3:
        advice = (
            "model=mlp, or an image dataset (data=omniglot, miniimagenet, cifarfs or fc100)"
            if tasks.objective is None
            else "a model for vector inputs (for an RL task family: model=gaussian_mlp)"
        )
        raise ValueError(
            f"model={model_name} needs images (inputs [height, width, channels]) but "
            f"data={data_name} gives inputs of shape {tuple(tasks.input_shape)}; use {advice}"
        )


def check_parameters(model: Model, name: str) -> None:
    """ValueError if ``model`` has no parameters or its declared head is not one of its
    top-level parameter entries. Traced only.

    >>> from metalearn.models.base import ModelParts, model_from_flax
    >>> from metalearn.models.mlp import MLP
    >>> check_parameters(model_from_flax(MLP((8,), 1), (1,), ModelParts(head="out")), "mine")
    Traceback (most recent call last):
    ...
    ValueError: model=mine declares its head 'out' (ModelParts(head=...)), but its top-level ...
    """
    params, _ = jax.eval_shape(model.init, jax.random.key(0))
    if not jax.tree_util.tree_leaves(params):
        raise ValueError(
            f"model={name} has no parameters (its init returns none under 'params'): there is "
            "nothing to meta-learn; give it layers with parameters (nn.Dense, nn.Conv, ...)"
        )
    missing = [h for h in model.head if h not in params]
    if missing:
        raise ValueError(
            f"model={name} declares its head {missing[0]!r} (ModelParts(head=...)), but its "
            f"top-level parameter entries are {', '.join(sorted(params))}: name its final "
            f"layer {missing[0]!r} (nn.Dense(..., name={missing[0]!r})) or declare the name it has"
        )


def check_learner(learner: Any, algorithm: str) -> None:
    """What an algorithm factory returned: a MetaLearner with a ``batch_update`` that fits."""
    if not isinstance(learner, MetaLearner):
        raise ValueError(
            f"algorithm={algorithm}: its factory returned {type(learner).__name__}, "
            "not a metalearn.algorithms.base.MetaLearner; return one (docs/extending.md)"
        )
    check_batch_update(learner, algorithm)


def check_family_and_objective(cfg: Config, tasks: TaskFamily, objective: Objective) -> None:
    """The task family's sampler at the training and evaluation shots, and the objective's
    loss on one of its tasks."""
    env = selected_parts(cfg).get("data.env")
    family = cfg.data.name + (f", data.env={env}" if env else "")
    check_family(tasks, family, cfg.trainer.shots, cfg.eval.shots)
    check_objective(objective, tasks, family, cfg.model.name, cfg.trainer.shots)
