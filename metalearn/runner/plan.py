"""The run plan: what the config, the registered parts and the machine decide about a run
(task batching, fused steps, the task mesh, warnings), resolved once before it starts."""

from __future__ import annotations

import dataclasses
import json

import jax
from jax.sharding import Mesh

from metalearn.config import Config, OptimizerConfig
from metalearn.core.batching import resolve_auto
from metalearn.models.base import ModelParts
from metalearn.registry import MODELS, TASKS
from metalearn.runner.devices import task_mesh


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """One run, resolved: the validated ``config`` and what it and the machine decide."""

    config: Config
    task_batching: str  # vmap | map | map<k> | unroll: how the tasks of a meta-batch run
    steps_per_call: int  # meta-steps fused into one jitted call (lax.scan)
    mesh: Mesh | None  # the devices the tasks are split across; None: one device
    platform: str  # cpu | gpu | tpu
    device_count: int
    devices: str  # "2 x cpu", for the run's summary
    warnings: tuple[str, ...] = ()  # logged as the run starts


def resolve(config: Config, *, runs: int = 1) -> RunPlan:
    """The :class:`RunPlan` of ``config`` on this process's devices, as one of ``runs`` runs
    sharing a program (several are split across the devices by run: no task mesh)."""
    t = config.trainer
    parts = MODELS.entry(config.model.name).info.get("parts", ModelParts())
    family = TASKS.entry(config.data.name).info
    platform, device_count = jax.devices()[0].platform, jax.device_count()
    task_batching = resolve_task_batching(
        t.task_batching,
        convolutional=parts.convolutional,
        large_tasks=family.get("large_tasks", False),
    )
    family_warning = family.get("run_warning", lambda *_: None)
    warnings = (
        family_warning(config, task_batching, platform, device_count),
        unread_final_lr_warning(config.optimizer),
    )
    return RunPlan(
        config=config,
        task_batching=task_batching,
        steps_per_call=resolve_steps_per_call(t.steps_per_call, convolutional=parts.convolutional),
        mesh=task_mesh(t.shard_tasks, t.meta_batch_size) if runs == 1 else None,
        platform=platform,
        device_count=device_count,
        devices=f"{device_count} x {jax.devices()[0].device_kind}",
        warnings=tuple(w for w in warnings if w),
    )


def program_key(config: Config) -> str:
    """What the compiled program of ``config`` depends on: its settings but for what the
    program takes as data (seed, rates). Runs with one key can share one program.

    >>> from metalearn.algorithms.maml import MAMLConfig
    >>> key = lambda **kw: program_key(Config(algorithm=MAMLConfig(**kw), model={}, data={}))
    >>> key(inner_lr=0.1) == key(inner_lr=0.2), key(inner_steps=1) == key(inner_steps=2)
    (True, False)
    """
    from metalearn.algorithms.base import hyperparameters
    from metalearn.runner.rundir import flat_config

    data = {"seed", "optimizer.lr"}
    if dataclasses.is_dataclass(config.algorithm):
        data |= {f"algorithm.{name}" for name in hyperparameters(config.algorithm)}
    flat = {k: v for k, v in flat_config(config).items() if k not in data}
    return json.dumps(flat, sort_keys=True)


def resolve_task_batching(strategy: str, *, convolutional: bool, large_tasks: bool = False) -> str:
    """How a meta-batch's tasks are batched for ``auto``: ``vmap``, but on a CPU ``map`` for
    convolutional models and large tasks, whose per-task weights XLA:CPU runs far slower
    batched (measured in experiments/benchmarks/)."""
    return resolve_auto(strategy, large_tasks=convolutional or large_tasks)


def resolve_steps_per_call(steps_per_call: int, *, convolutional: bool) -> int:
    """Meta-steps fused per jitted call; 0 means auto: 100 (dispatch dominates small models),
    10 for convolutional models on a CPU (slow steps: progress reported more often)."""
    if steps_per_call:
        return steps_per_call
    if jax.default_backend() == "cpu" and convolutional:
        return 10
    return 100


def unread_final_lr_warning(cfg: OptimizerConfig) -> str | None:
    """The line a run logs when ``final_lr_fraction`` is set and no schedule reads it (not a
    refusal: ``optimizer.schedule=constant`` alone turns ``algorithm=mamlpp``'s cosine off).

    >>> unread_final_lr_warning(OptimizerConfig(final_lr_fraction=0.01))[:64]
    'optimizer.final_lr_fraction=0.01 is unused: only optimizer.sched'
    >>> unread_final_lr_warning(OptimizerConfig(schedule="cosine", final_lr_fraction=0.01))
    """
    if cfg.schedule == "cosine" or cfg.final_lr_fraction == 0:
        return None
    return (
        f"optimizer.final_lr_fraction={cfg.final_lr_fraction} is unused: only "
        f"optimizer.schedule=cosine decays the rate, and this run's schedule is {cfg.schedule} "
        f"(the rate {'warms up to' if cfg.warmup_steps else 'stays'} {cfg.lr}); for a decay, "
        "set optimizer.schedule=cosine"
    )
