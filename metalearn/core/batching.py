"""How the tasks of a meta-batch are batched: ``vmap``, or loops over them (``lax.map``).

Under ``vmap`` each task's own parameters turn the model's matrix products into batched ones
(and convolutions into grouped ones), which XLA:CPU runs far below the rate of one large
product; a loop runs one task at a time on plain products, and one task's work is large
enough for a CPU when the model is convolutional or the task is a batch of RL rollouts.
On GPUs and TPUs ``vmap`` keeps the accelerator busy. Measured in experiments/benchmarks/.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


TASK_BATCHING = ("auto", "vmap", "unroll", "map")  # and map<k>: k loops side by side


def is_task_batching(name: str) -> bool:
    """Whether ``name`` is a strategy of :func:`map_over_tasks` or ``auto``.

    >>> [is_task_batching(n) for n in ("auto", "map2", "map0", "pmap")]
    [True, True, False, False]
    """
    return name in TASK_BATCHING or parallel_chains(name) is not None


def resolve_auto(strategy: str, large_tasks: bool) -> str:
    """``strategy``, or what ``auto`` means on this backend: ``map`` on a CPU when one task's
    work is large (a convolutional model, an RL task's rollouts), else ``vmap``.

    >>> resolve_auto("auto", large_tasks=False), resolve_auto("map2", large_tasks=False)
    ('vmap', 'map2')
    """
    if strategy != "auto":
        return strategy
    if jax.default_backend() == "cpu" and large_tasks:
        return "map"
    return "vmap"


def parallel_chains(strategy: str) -> int | None:
    """``k`` for a ``map<k>`` strategy (``"map2"``: two loops side by side), else None.

    >>> parallel_chains("map2"), parallel_chains("map")
    (2, None)
    """
    if re.fullmatch(r"map[1-9][0-9]*", strategy):
        return int(strategy[3:])
    return None


def map_over_tasks(fn: Callable[[PyTree], PyTree], tasks: PyTree, strategy: str) -> PyTree:
    """Apply ``fn`` to each task (leading axis of ``tasks``); results stacked on axis 0.

    ``vmap``; ``map`` (a ``lax.map`` loop, one task at a time); ``map<k>`` (the tasks split
    into ``k`` consecutive groups as equal as the count allows, each a ``lax.map`` loop, the
    loops side by side so XLA:CPU can run them on different cores; fewer loops when there are
    fewer than ``k`` tasks); ``unroll`` (a Python loop inside ``jit``).

    >>> import jax.numpy as jnp
    >>> map_over_tasks(jnp.sum, jnp.arange(8.0).reshape(4, 2), "map2").tolist()
    [1.0, 5.0, 9.0, 13.0]
    >>> map_over_tasks(jnp.sum, jnp.arange(10.0).reshape(5, 2), "map3").tolist()
    [1.0, 5.0, 9.0, 13.0, 17.0]
    """
    chains = parallel_chains(strategy)
    if chains is not None:
        count = jax.tree_util.tree_leaves(tasks)[0].shape[0]
        bounds = [count * i // chains for i in range(chains + 1)]
        outs = [
            jax.lax.map(fn, jax.tree_util.tree_map(lambda t, a=a, b=b: t[a:b], tasks))
            for a, b in zip(bounds, bounds[1:], strict=False)
            if b > a
        ]
        return jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *outs)
    if strategy == "vmap":
        return jax.vmap(fn)(tasks)
    if strategy == "map":
        return jax.lax.map(fn, tasks)
    if strategy == "unroll":
        count = jax.tree_util.tree_leaves(tasks)[0].shape[0]
        outs = [fn(jax.tree_util.tree_map(lambda t, i=i: t[i], tasks)) for i in range(count)]
        return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *outs)
    raise ValueError(f"unknown task batching strategy {strategy!r}")


def mean_over_tasks(
    fn: Callable[[PyTree], PyTree], tasks: PyTree, strategy: str, *, in_carry: bool = True
) -> PyTree:
    """The mean of ``fn(task)`` over the leading axis of ``tasks``.

    With ``map`` (and ``in_carry``) the loop accumulates the sum in its carry instead of
    stacking one result per task and reducing afterwards: no ``[tasks, *params]`` buffer, and
    no large reduction after the loop (XLA:CPU took 17 ms to average 32 Conv4 kernel gradients
    that way). ``in_carry=False`` stacks and reduces anyway. With several devices, each one
    runs this on its own share of the tasks (:func:`~metalearn.runner.devices.over_task_shards`).

    >>> import jax.numpy as jnp
    >>> tasks = jnp.arange(6.0).reshape(3, 2)
    >>> [float(mean_over_tasks(jnp.sum, tasks, s)) for s in ("vmap", "map", "unroll")]
    [5.0, 5.0, 5.0]
    """
    if strategy != "map" or not in_carry:
        stacked = map_over_tasks(fn, tasks, strategy)
        return jax.tree_util.tree_map(lambda x: jnp.mean(x, axis=0), stacked)
    count = jax.tree_util.tree_leaves(tasks)[0].shape[0]
    shapes = jax.eval_shape(fn, jax.tree_util.tree_map(lambda t: t[0], tasks))
    zeros = jax.tree_util.tree_map(
        lambda s: jnp.zeros(s.shape, jnp.result_type(s.dtype, jnp.float32)), shapes
    )

    def accumulate(total, task):
        return jax.tree_util.tree_map(jnp.add, total, fn(task)), None

    total, _ = jax.lax.scan(accumulate, zeros, tasks)
    return jax.tree_util.tree_map(lambda x: x / count, total)
