"""ANIL's speed-up over MAML: wall time of one jitted ``task_grad`` (second order) of each.

    python experiments/algorithms/anil_speedup.py [--repeats 20]

Same model, same task, same inner steps and rate; only the parameters the inner loop adapts
differ (all of them for MAML, the ``head`` entry for ANIL). Models: the sinusoid MLP (1-40-40-1,
10 support and 10 query points) and, if present, Conv4 on Omniglot-shaped 5-way 1-shot tasks
(28x28x1, 64 filters, 5 support and 75 query images, random pixels: the timing does not depend
on the values). Prints a markdown table: the fastest of ``--repeats`` timed calls after one
warm-up call (compile excluded; the minimum, because on a shared machine other processes only
ever add time).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from metalearn.algorithms.anil import anil
from metalearn.algorithms.base import context
from metalearn.algorithms.maml import maml
from metalearn.data.sinusoid import sample_sinusoid_task
from metalearn.data.task import Task, supervised_objective
from metalearn.models.base import ModelParts, model_from_flax
from metalearn.models.mlp import MLP


def problems():
    mlp = supervised_objective(
        model_from_flax(MLP((40, 40), 1), (1,), ModelParts(head="head")), "regression"
    )
    yield "MLP 1-40-40-1, sinusoid K=10", mlp, sample_sinusoid_task(jax.random.key(0), 10, 10)
    try:
        from metalearn.models.conv4 import CONV4_PARTS, Conv4
    except ImportError:
        return
    conv = supervised_objective(
        model_from_flax(Conv4(5), (28, 28, 1), CONV4_PARTS), "classification"
    )
    keys = jax.random.split(jax.random.key(1), 2)
    labels = jnp.arange(5)
    task = Task(
        (jax.random.uniform(keys[0], (5, 28, 28, 1)), labels),
        (jax.random.uniform(keys[1], (75, 28, 28, 1)), jnp.repeat(labels, 15)),
    )
    yield "Conv4 (64 filters), Omniglot 5-way 1-shot", conv, task


def fastest_seconds(fn, args, repeats):
    """``(wall, cpu)``: the fastest call's wall time and this process's CPU time per call.

    CPU time (all threads) is the steadier figure on a shared machine: other processes slow
    the wall clock, not the work done.
    """
    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    cpu_start = time.process_time()
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.min(times)), (time.process_time() - cpu_start) / repeats


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 5])
    args = parser.parse_args()
    print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}")
    print(
        "| model | inner steps | MAML ms (wall, CPU) | ANIL ms (wall, CPU) | speed-up (wall, CPU) |"
    )
    print("| --- | --- | --- | --- | --- |")
    for label, model, task in problems():
        params = model.model.init(jax.random.key(2))[0]
        for steps in args.steps:
            wall, cpu = [], []
            for factory in (maml, anil):
                learner = factory(model, inner_lr=0.01, inner_steps=steps)
                step = jax.jit(learner.task_grad)
                w, c = fastest_seconds(step, (params, task, context()), args.repeats)
                wall.append(1e3 * w)
                cpu.append(1e3 * c)
            print(
                f"| {label} | {steps} | {wall[0]:.2f}, {cpu[0]:.2f} | {wall[1]:.2f}, {cpu[1]:.2f} "
                f"| {wall[0] / wall[1]:.2f}x, {cpu[0] / cpu[1]:.2f}x |"
            )


if __name__ == "__main__":
    main()
