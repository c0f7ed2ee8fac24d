"""What runs on the locomotion environments need of XLA:CPU: their physics makes batched LAPACK
calls (:data:`~metalearn.rl.envs.BATCHED_LINALG_ENVS`), which jaxlib 0.10 can deadlock on
(experiments/rl/locomotion/README.md). The ``rl_env`` task family declares these to the runner:
a process setting made before JAX's first computation (:func:`prepare_process`), a refusal
(:func:`lapack_batch_error`) and a warning (:func:`lapack_device_warning`), each read through
the family's registry entry, so the runner itself knows nothing of LAPACK.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from metalearn.rl.envs import BATCHED_LINALG_ENVS

if TYPE_CHECKING:  # an annotation only: metalearn.config imports metalearn.rl
    from metalearn.config import Config

# jaxlib 0.10's batched LAPACK calls wait on XLA's intra-op pool: as many at once as it has
# threads hang. This scheduler does not start them together (10% slower: asked for when needed).
SERIAL_LAPACK_SCHEDULING = "--xla_cpu_enable_concurrency_optimized_scheduler=false"

# jaxlib 0.10 (GetLapackBatchChunkSize) splits a call across that pool when its estimated work
# (batch size times FLOPs per matrix) reaches this; below it the call runs inline.
LAPACK_PARALLEL_WORK = 200_000


def needs_serial_lapack(cfg: Config) -> bool:
    """Whether a run's programs make batched LAPACK calls on CPU (the locomotion families).

    >>> from metalearn.config import Config
    >>> from metalearn.rl.family import RLTasksConfig
    >>> [needs_serial_lapack(Config(data=RLTasksConfig(env=e))) for e in ("nav2d", "ant_dir")]
    [False, True]
    """
    return getattr(cfg.data, "env", None) in BATCHED_LINALG_ENVS


def prepare_process(cfg: Config) -> None:
    """Serial LAPACK scheduling for a run whose programs need it; before JAX computes."""
    if needs_serial_lapack(cfg):
        schedule_lapack_calls_serially()


def schedule_lapack_calls_serially() -> bool:
    """Ask XLA:CPU for the scheduling under which batched LAPACK calls do not deadlock; False
    if ``XLA_FLAGS`` already chooses the scheduler.

    >>> saved = os.environ.pop("XLA_FLAGS", None)
    >>> schedule_lapack_calls_serially(), schedule_lapack_calls_serially()
    (True, False)
    >>> os.environ["XLA_FLAGS"]
    '--xla_cpu_enable_concurrency_optimized_scheduler=false'
    >>> _ = os.environ.pop("XLA_FLAGS") if saved is None else os.environ.update(XLA_FLAGS=saved)
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_enable_concurrency_optimized_scheduler" in flags:
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {SERIAL_LAPACK_SCHEDULING}".strip()
    return True


def linalg_size_on_cpu_devices(cfg: Config, platform: str, device_count: int) -> int | None:
    """The size of a locomotion family's batched solves on several XLA:CPU devices, else None."""
    if platform != "cpu" or device_count < 2:
        return None
    return BATCHED_LINALG_ENVS.get(getattr(cfg.data, "env", None))


def inline_solve_batch(size: int) -> int:
    """The most ``size`` x ``size`` systems one batched solve against the identity may hold
    for jaxlib 0.10 to run it inline (its triangular solves count ``size**3`` per matrix).

    >>> inline_solve_batch(14), inline_solve_batch(9)  # the Ant's and the HalfCheetah's
    (72, 274)
    """
    return max(1, (LAPACK_PARALLEL_WORK - 1) // size**3)


def lapack_device_warning(
    cfg: Config, strategy: str, platform: str, device_count: int
) -> str | None:
    """The line a run logs when it shards a locomotion family's physics over several XLA:CPU
    devices, whose batched Cholesky solves can deadlock (experiments/rl/locomotion/README.md),
    whichever the task batching ``strategy``.

    >>> from metalearn.config import Config
    >>> from metalearn.rl.family import RLTasksConfig
    >>> def warning(env, devices):
    ...     cfg = Config(data=RLTasksConfig(env=env))
    ...     return lapack_device_warning(cfg, "map", "cpu", devices)
    >>> warning("cheetah_dir", 2).startswith("2 XLA:CPU devices on cheetah_dir: ")
    True
    >>> warning("cheetah_dir", 1), warning("nav2d", 2)
    (None, None)
    """
    if linalg_size_on_cpu_devices(cfg, platform, device_count) is None:
        return None
    return (
        f"{device_count} XLA:CPU devices on {cfg.data.env}: jaxlib 0.10's batched LAPACK calls "
        "(the physics' Cholesky) can deadlock across devices on large batches; if the run "
        "stops making progress, stop it and resume with one device (unset JAX_NUM_CPU_DEVICES)"
    )


def lapack_batch_error(cfg: Config, strategy: str, platform: str, device_count: int) -> str | None:
    """The line a run is refused with when, on several XLA:CPU devices, one device would step
    so many locomotion rollouts at once that jaxlib 0.10's threaded batched solve deadlocks
    (:func:`inline_solve_batch`); None when the run is safe.

    >>> from metalearn.config import Config, TrainerConfig
    >>> from metalearn.rl.algorithm import MAMLRLAlgorithmConfig
    >>> from metalearn.rl.family import RLTasksConfig
    >>> def error(env, rollouts, devices):
    ...     cfg = Config(data=RLTasksConfig(env=env, rollouts=rollouts),
    ...                  algorithm=MAMLRLAlgorithmConfig(post_rollouts=rollouts),
    ...                  trainer=TrainerConfig(meta_batch_size=10))
    ...     return lapack_batch_error(cfg, "map", "cpu", devices)
    >>> print(error("ant_dir", 20, 2))  # doctest: +ELLIPSIS
    ant_dir on 2 XLA:CPU devices: each would step 100 rollouts at once (5 tasks x 20), ...
    >>> error("ant_dir", 14, 2), error("ant_dir", 20, 1), error("cheetah_dir", 20, 2)
    (None, None, None)
    """
    size = linalg_size_on_cpu_devices(cfg, platform, device_count)
    if size is None or not cfg.trainer.shard_tasks:
        return None
    limit = inline_solve_batch(size)
    tasks = cfg.trainer.meta_batch_size // device_count
    rollouts = max(cfg.data.rollouts, getattr(cfg.algorithm, "post_rollouts", 0))
    what, batch = f"{tasks} tasks x {rollouts}", tasks * rollouts
    eval_tasks = 1 if strategy != "vmap" else -(-cfg.eval.tasks_per_call // device_count)
    eval_rollouts = getattr(cfg.algorithm, "eval_rollouts", 0)
    if eval_tasks * eval_rollouts > batch:
        what, batch = f"{eval_tasks} evaluation tasks x {eval_rollouts}", eval_tasks * eval_rollouts
    if batch <= limit:
        return None
    return (
        f"{cfg.data.env} on {device_count} XLA:CPU devices: each would step {batch} rollouts "
        f"at once ({what}), solving {batch} {size} x {size} systems in one batched LAPACK call, "
        f"which jaxlib 0.10 splits across threads and which deadlocks across devices (at most "
        f"{limit} run inline); run on one device (unset JAX_NUM_CPU_DEVICES) or lower "
        "trainer.meta_batch_size or the rollouts per task"
    )
