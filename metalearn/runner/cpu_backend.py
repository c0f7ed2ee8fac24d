"""The settings a process takes before JAX's first computation: :func:`prepare_machine`.

On a CPU, a meta-batch of convolutional tasks looped over by ``lax.map`` runs one task at a
time, and one task's matrix products are too small to keep several cores busy. So for
``trainer.task_batching: auto`` the runner starts one XLA:CPU device per core, each on one
thread, and splits the tasks across them (:mod:`metalearn.runner.devices`). Measured in
experiments/benchmarks/. Runs whose programs make batched LAPACK calls (the locomotion
families' physics) ask for the scheduling under which those do not deadlock.
"""

from __future__ import annotations

import logging
import os

import jax

from metalearn.config import Config
from metalearn.models.base import ModelParts
from metalearn.registry import MODELS
from metalearn.runner.compilation_cache import enable_compilation_cache
from metalearn.runner.devices import initialize_distributed

log = logging.getLogger("metalearn")


def prepare_machine(cfg: Config, *, training: bool = True, runs: int = 1) -> None:
    """Apply what ``cfg`` asks of this process before JAX's first computation: XLA:CPU devices
    (training only: an evaluation runs on one; for a group of ``runs`` sharing a program, one
    per core, each stepping its share of the runs), serial LAPACK scheduling, the persistent
    compilation cache, and (training only) joining a multi-host run. The entry points call it
    first; from a Python session where JAX has started, the running backend is kept."""
    if training and runs > 1:
        start_cpu_devices(auto_cpu_devices(True, runs, usable_cores()))
    elif training:
        start_cpu_devices(cpu_devices_for(cfg))
    if needs_serial_lapack(cfg):
        schedule_lapack_calls_serially()
    enable_compilation_cache(cfg.trainer.compilation_cache)
    if training:
        d = cfg.distributed
        initialize_distributed(d.enabled, d.coordinator_address, d.num_processes, d.process_id)


def cpu_devices_for(cfg: Config, cores: int | None = None) -> int:
    """XLA:CPU devices a run asks for before JAX starts: :func:`auto_cpu_devices` under
    ``trainer.task_batching: auto`` with ``trainer.shard_tasks`` on one host, else one.

    >>> from metalearn.config import TrainerConfig
    >>> from metalearn.models.conv4 import Conv4Config
    >>> cfg = Config(model=Conv4Config(), trainer=TrainerConfig(meta_batch_size=32))
    >>> cpu_devices_for(cfg, cores=2)
    2
    """
    t = cfg.trainer
    if t.task_batching != "auto" or not t.shard_tasks or cfg.distributed.enabled:
        return 1
    parts = MODELS.entry(cfg.model.name).info.get("parts", ModelParts())
    count = usable_cores() if cores is None else cores
    return auto_cpu_devices(parts.convolutional, t.meta_batch_size, count)


def needs_serial_lapack(cfg: Config) -> bool:
    """Whether a run's programs make batched LAPACK calls on CPU, so that it must ask for
    :func:`schedule_lapack_calls_serially` before JAX starts: an RL environment registered with
    a ``linalg_size`` (the locomotion families).

    >>> from metalearn.rl.family import RLTasksConfig
    >>> [needs_serial_lapack(Config(data=RLTasksConfig(env=e))) for e in ("nav2d", "ant_dir")]
    [False, True]
    """
    from metalearn.rl.envs import BATCHED_LINALG_ENVS

    return getattr(cfg.data, "env", None) in BATCHED_LINALG_ENVS


def linalg_size_on_cpu_devices(cfg: Config, platform: str, device_count: int) -> int | None:
    """The size of the systems a locomotion family's physics solves in batches
    (:data:`~metalearn.rl.envs.BATCHED_LINALG_ENVS`) when the run has several XLA:CPU devices;
    None for any other run."""
    from metalearn.rl.envs import BATCHED_LINALG_ENVS

    if platform != "cpu" or device_count < 2:
        return None
    return BATCHED_LINALG_ENVS.get(getattr(cfg.data, "env", None))


# Each of several XLA:CPU devices runs its programs on one thread: one device per core, none
# spreading its matrix products onto the other devices' cores.
ONE_THREAD_PER_CPU_DEVICE = "--xla_cpu_multi_thread_eigen=false"

# jaxlib 0.10's CPU LAPACK kernels (Cholesky, triangular solves, LU, ...) split a large batch
# of matrices across XLA's intra-op thread pool and block until the pieces are done: a program
# running as many such calls at once as the pool has threads hangs, each waiting for pieces no
# free thread will run. Under XLA's other scheduler they do not start together. It costs about
# 10% on Conv4's Omniglot step, so only runs whose programs make batched LAPACK calls ask for it.
SERIAL_LAPACK_SCHEDULING = "--xla_cpu_enable_concurrency_optimized_scheduler=false"

# Which batches go to that pool: jaxlib 0.10 (jaxlib/cpu/lapack_kernels.cc,
# GetLapackBatchChunkSize) splits a call whose estimated work, the batch size times a FLOP
# estimate per matrix, reaches this; below it the call runs inline on its caller's thread.
LAPACK_PARALLEL_WORK = 200_000


def inline_solve_batch(size: int) -> int:
    """The most ``size`` x ``size`` systems one batched solve against the identity may hold
    for jaxlib 0.10 to run it inline: its triangular solves count ``size**3`` per matrix (the
    Cholesky factorisation before them ``size**3 / 3``, so it stays inline too).

    >>> inline_solve_batch(14), inline_solve_batch(9)  # the Ant's and the HalfCheetah's
    (72, 274)
    """
    return max(1, (LAPACK_PARALLEL_WORK - 1) // size**3)


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def auto_cpu_devices(convolutional: bool, meta_batch_size: int, cores: int) -> int:
    """XLA:CPU devices for ``task_batching: auto`` (why: the module's docstring): for a
    convolutional model the most, up to one per core, that divide the meta-batch; dense models
    (whose whole meta-batch is one ``vmap``) keep one.

    >>> auto_cpu_devices(True, 32, 2), auto_cpu_devices(True, 25, 2), auto_cpu_devices(False, 32, 2)
    (2, 1, 1)
    >>> auto_cpu_devices(True, 12, 8)
    6
    """
    if not convolutional:
        return 1
    return max(n for n in range(1, max(cores, 1) + 1) if meta_batch_size % n == 0)


def schedule_lapack_calls_serially() -> bool:
    """Ask XLA:CPU for the scheduling under which batched LAPACK calls do not deadlock (see
    ``SERIAL_LAPACK_SCHEDULING``); False if ``XLA_FLAGS`` already chooses the scheduler. Must
    run before JAX's first computation (a backend already started keeps its flags).

    >>> import os
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


def start_cpu_devices(count: int) -> bool:
    """Ask for ``count`` XLA:CPU devices, each running on one thread, before JAX's first
    computation (GPUs are unaffected); False if not applied. A device count given by the
    environment (``JAX_NUM_CPU_DEVICES``, ``--xla_force_host_platform_device_count``) wins, and
    a backend already started keeps its devices."""
    flags = os.environ.get("XLA_FLAGS", "")
    if count <= 1 or "JAX_NUM_CPU_DEVICES" in os.environ or "device_count" in flags:
        return False
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # JAX has started (e.g. training called from a Python session)
        log.info("JAX has already started: keeping its CPU devices")
        return False
    if "xla_cpu_multi_thread_eigen" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {ONE_THREAD_PER_CPU_DEVICE}".strip()
    return True
