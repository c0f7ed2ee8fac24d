"""The settings a process takes before JAX's first computation (:func:`prepare_machine`). One
convolutional task's matrix products are too small to keep several cores busy, so on a CPU
``task_batching: auto`` splits the tasks across one single-threaded XLA:CPU device per core."""

from __future__ import annotations

import logging
import os

import jax

from metalearn.config import Config
from metalearn.models.base import ModelParts
from metalearn.registry import MODELS, TASKS
from metalearn.runner.compilation_cache import enable_compilation_cache
from metalearn.runner.devices import initialize_distributed

log = logging.getLogger("metalearn")


def prepare_machine(cfg: Config, *, training: bool = True, runs: int = 1) -> None:
    """Apply what ``cfg`` asks of this process before JAX's first computation."""
    if training and runs > 1:
        start_cpu_devices(auto_cpu_devices(True, runs, usable_cores()))
    elif training:
        start_cpu_devices(cpu_devices_for(cfg))
    prepare_family = TASKS.entry(cfg.data.name).info.get("prepare_process")
    if prepare_family is not None:
        prepare_family(cfg)
    enable_compilation_cache(cfg.trainer.compilation_cache)
    if training:
        initialize_distributed(cfg.distributed)


def cpu_devices_for(cfg: Config, cores: int | None = None) -> int:
    """XLA:CPU devices a run asks for: :func:`auto_cpu_devices` under ``task_batching: auto``.

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


# One device per core: none spreads its matrix products onto the other devices' cores.
ONE_THREAD_PER_CPU_DEVICE = "--xla_cpu_multi_thread_eigen=false"


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def auto_cpu_devices(convolutional: bool, meta_batch_size: int, cores: int) -> int:
    """XLA:CPU devices for ``task_batching: auto``: for a convolutional model the most, up to
    one per core, that divide the meta-batch; dense models (one ``vmap``) keep one.

    >>> auto_cpu_devices(True, 32, 2), auto_cpu_devices(True, 25, 2), auto_cpu_devices(False, 32, 2)
    (2, 1, 1)
    >>> auto_cpu_devices(True, 12, 8)
    6
    """
    if not convolutional:
        return 1
    return max(n for n in range(1, max(cores, 1) + 1) if meta_batch_size % n == 0)


def start_cpu_devices(count: int) -> bool:
    """Ask for ``count`` single-threaded XLA:CPU devices before JAX's first computation; False
    if not applied (the environment's count wins, a started backend keeps its own)."""
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
