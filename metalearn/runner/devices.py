"""Devices and hosts: each device runs its share of a meta-batch's tasks (``jax.shard_map``),
everything else replicated, and an all-reduce averages their means, so the update equals the
one-device update; multi-host init."""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from metalearn.config import DistributedConfig

log = logging.getLogger("metalearn")

TASK_AXIS = "tasks"


def task_mesh(shard_tasks: bool, meta_batch_size: int) -> Mesh | None:
    """A mesh over all devices for the task axis, or None on one device (or when disabled)."""
    devices = jax.devices()
    if not shard_tasks or len(devices) == 1:
        return None
    if meta_batch_size % len(devices):
        raise ValueError(
            f"trainer.meta_batch_size ({meta_batch_size}) must be a multiple of the number of "
            f"devices ({len(devices)}) to shard tasks across them; change it or set "
            f"trainer.shard_tasks=false"
        )
    return Mesh(devices, (TASK_AXIS,))


def shard_task_axis(tree: Any, mesh: Mesh | None) -> Any:
    """Constrain the leading (task) axis of every leaf to be split across ``mesh``."""
    if mesh is None:
        return tree
    return jax.lax.with_sharding_constraint(tree, NamedSharding(mesh, PartitionSpec(TASK_AXIS)))


def replicated(tree: Any, mesh: Mesh | None) -> Any:
    """Place ``tree`` on every device of ``mesh`` (each host supplies its own, identical copy)."""
    if mesh is None:
        return tree
    sharding = NamedSharding(mesh, PartitionSpec())
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)

    def to_global(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            data = to_global(jax.random.key_data(x))
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
        return jax.make_array_from_process_local_data(sharding, np.asarray(x))

    return jax.tree_util.tree_map(to_global, tree)


def over_task_shards(fn: Callable[[Any, Any], Any], mesh: Mesh, *, reduce: bool) -> Callable:
    """``fn(shared, tasks)`` run by each device of ``mesh`` on its share of ``tasks``; with
    ``reduce``, ``fn`` averages over ``TASK_AXIS`` itself, else its results are concatenated.

    >>> import jax, jax.numpy as jnp
    >>> mesh = Mesh(jax.devices()[:1], (TASK_AXIS,))
    >>> mean = lambda w, t: jax.lax.pmean(jnp.mean(w * t), TASK_AXIS)
    >>> float(over_task_shards(mean, mesh, reduce=True)(2.0, jnp.arange(4.0)))
    3.0
    """
    in_specs = (PartitionSpec(), PartitionSpec(TASK_AXIS))
    out_specs = PartitionSpec() if reduce else PartitionSpec(TASK_AXIS)
    # No replication check: loop carries start replicated and end varying; fn reduces itself.
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


MAX_CALLS_IN_FLIGHT = 4  # jitted calls a run lets JAX queue ahead of the host (see InFlight)


class InFlight:
    """Bounds how many dispatched calls may still be running: with dozens queued on several
    XLA:CPU devices, their launch threads can deadlock around an all-reduce.

    >>> import jax.numpy as jnp
    >>> queue = InFlight(limit=2)
    >>> for i in range(5):
    ...     queue.add(jnp.ones(3) * i)
    >>> len(queue.calls)
    2
    """

    def __init__(self, limit: int = MAX_CALLS_IN_FLIGHT):
        self.calls: collections.deque = collections.deque()
        self.limit = limit

    def add(self, outputs: Any) -> None:
        self.calls.append(outputs)
        while len(self.calls) > self.limit:
            jax.block_until_ready(self.calls.popleft())


def constrain_replicated(tree: Any, mesh: Mesh | None) -> Any:
    """Inside jit: ask for ``tree`` on every device (so each host can read all of it)."""
    if mesh is None:
        return tree
    return jax.lax.with_sharding_constraint(tree, NamedSharding(mesh, PartitionSpec()))


def initialize_distributed(d: DistributedConfig) -> None:
    """Join a multi-host run when ``d.enabled``; JAX detects unset fields from the cluster."""
    if not d.enabled:
        return
    slurm = " from SLURM" if "SLURM_JOB_ID" in os.environ and d.coordinator_address is None else ""
    log.info(
        f"jax.distributed.initialize(coordinator={d.coordinator_address}, "
        f"num_processes={d.num_processes}, process_id={d.process_id}){slurm}"
    )
    try:
        jax.distributed.initialize(d.coordinator_address, d.num_processes, d.process_id)
    except (ValueError, TypeError) as err:  # JAX found no cluster to fill in the unset fields
        raise ValueError(distributed_setup_error(err)) from err


def distributed_setup_error(err: BaseException) -> str:
    """What to set when ``jax.distributed.initialize`` cannot start (one line).

    >>> distributed_setup_error(ValueError("coordinator_address should be defined."))[:60]
    'distributed.enabled=true but JAX could not set up the run (c'
    """
    env = "SLURM_JOB_ID is set" if "SLURM_JOB_ID" in os.environ else "no SLURM environment found"
    return (
        f"distributed.enabled=true but JAX could not set up the run ({err}; {env}); set "
        "distributed.coordinator_address=HOST:PORT, distributed.num_processes=N and "
        "distributed.process_id=I on every host, run under SLURM, or set "
        "distributed.enabled=false for one host"
    )


def is_primary_host() -> bool:
    return jax.process_index() == 0


TRAINING_MEMORY_ADVICE = (
    "lower trainer.meta_batch_size (tasks per meta-step), trainer.shots or data.num_queries "
    "(examples per task), eval.tasks_per_call (tasks per evaluation call) or, for RL, "
    "data.rollouts or data.horizon; or set "
    "trainer.task_batching=map (one task in memory at a time) or algorithm.remat=true where the "
    "algorithm has it. Checkpoints already saved are kept: rerun to resume"
)


def out_of_memory_message(err: BaseException, advice: str = TRAINING_MEMORY_ADVICE) -> str | None:
    """One line for XLA's out of memory, with ``advice`` (what bounds memory); else None.

    >>> out_of_memory_message(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 8 bytes."),
    ...                       "lower eval.tasks_per_call")
    'out of memory on the device (RESOURCE_EXHAUSTED: Out of memory allocating 8 bytes.); lower eval.tasks_per_call'
    >>> out_of_memory_message(RuntimeError("INTERNAL: Error dispatching computation: x; Out of "
    ...                       "memory allocating 9 bytes."), "lower --shots")
    'out of memory on the device (Out of memory allocating 9 bytes.); lower --shots'
    >>> out_of_memory_message(ValueError("shapes do not match")) is None
    True
    """  # noqa: E501
    text = str(err)
    mark = next((m for m in ("RESOURCE_EXHAUSTED", "Out of memory") if m in text), None)
    if mark is None:
        return None
    reason = text[text.index(mark) :].splitlines()[0][:160]
    return f"out of memory on the device ({reason}); {advice}"


RUNS_AXIS = "runs"


def runs_mesh(count: int) -> Mesh | None:
    """A mesh over every device for ``count`` runs; None on one device or an uneven split."""
    devices = jax.devices()
    if len(devices) == 1 or count % len(devices):
        return None
    return Mesh(devices, (RUNS_AXIS,))


def over_runs(fn: Callable, mesh: Mesh | None, axes: tuple) -> Callable:
    """``fn`` run by each device of ``mesh`` on its share of the runs (arguments at ``axes`` 0
    and all results split on their leading runs axis; None: shared)."""
    if mesh is None:
        return fn
    specs = tuple(PartitionSpec(RUNS_AXIS) if a == 0 else PartitionSpec() for a in axes)
    return jax.shard_map(
        fn, mesh=mesh, in_specs=specs, out_specs=PartitionSpec(RUNS_AXIS), check_vma=False
    )
