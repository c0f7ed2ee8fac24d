"""XLA:CPU settings a run takes before JAX's first computation: devices and threads.

On a CPU, a meta-batch of convolutional tasks looped over by ``lax.map`` runs one task at a
time, and one task's matrix products are too small to keep several cores busy. So for
``trainer.task_batching: auto`` the runner starts one XLA:CPU device per core, each on one
thread, and splits the tasks across them (:mod:`metalearn.runner.devices`). Measured in
experiments/benchmarks/.
"""

from __future__ import annotations

import logging
import os

import jax

log = logging.getLogger("metalearn")

# Each of several XLA:CPU devices runs its programs on one thread: one device per core, none
# spreading its matrix products onto the other devices' cores.
ONE_THREAD_PER_CPU_DEVICE = "--xla_cpu_multi_thread_eigen=false"


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def auto_cpu_devices(convolutional: bool, meta_batch_size: int, cores: int) -> int:
    """XLA:CPU devices for ``task_batching: auto``: one per core for convolutional models.

    One ``lax.map`` loop runs one task at a time and leaves the other cores mostly idle (one
    task's matrix products are too small to spread well), so each core gets its own device and
    its own share of the tasks. The count divides the meta-batch; dense models (whose whole
    meta-batch is one ``vmap``) keep one device.

    >>> auto_cpu_devices(True, 32, 2), auto_cpu_devices(True, 25, 2), auto_cpu_devices(False, 32, 2)
    (2, 1, 1)
    >>> auto_cpu_devices(True, 12, 8)
    6
    """
    if not convolutional:
        return 1
    return max(n for n in range(1, max(cores, 1) + 1) if meta_batch_size % n == 0)


def start_cpu_devices(count: int) -> bool:
    """Ask for ``count`` XLA:CPU devices, each running on one thread; False if not applied.

    Must run before JAX's first computation (it only sets configuration). A device count given
    by the environment (``JAX_NUM_CPU_DEVICES``, ``--xla_force_host_platform_device_count``)
    wins, and a backend already started keeps its devices. On a machine with GPUs the CPU
    devices are not the ones training runs on, and this changes nothing there.
    """
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
