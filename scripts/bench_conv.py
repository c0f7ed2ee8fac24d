"""Convolutions that stay fast on XLA:CPU when tasks are batched: the item-2 experiments.

Why ``vmap`` and ``lax.map`` over tasks are slow on XLA:CPU (see experiments/benchmarks/):

- Under ``vmap`` every task has its own (adapted) kernel, so JAX's batching rule for
  ``conv_general_dilated`` turns the per-task convolutions into one grouped convolution
  (``feature_group_count = tasks``) and its kernel gradient into one with
  ``batch_group_count = tasks``. XLA:CPU has no grouped-convolution kernel: it expands the
  groups (the kernel gradient becomes a 3-D convolution with a dilated ``tasks`` axis), which
  is ~6x slower in the forward pass and ~50x in the backward pass than separate convolutions.
- Under ``lax.map`` (a while loop) the forward convolution is fine, but the two backward
  convolutions keep non-canonical dimension orders (``f01b_i01o->01bf`` and
  ``b01f_01oi->b01f``) inside the loop body, so XLA:CPU emits them with its generic loop
  emitter instead of its Eigen convolution (outside loops they are rewritten to the canonical
  ``b01f_01io->b01f``): ~10x slower.

The library's answer is :mod:`metalearn.models.patch_conv` (``model.conv: im2col``, the CPU
default): the convolution as a matrix product over image patches, whose derivatives of every
order are matrix products, pads and slices. This script measures one Conv4 layer both ways
(XLA's convolution and im2col) under each task batching. (A custom-VJP "canonical" convolution
measured earlier was abandoned and removed; its rows in experiments/benchmarks/ are historical.)

    python scripts/bench_conv.py            # per-layer micro-benchmark of the formulations
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
from jax import lax

from metalearn.models.patch_conv import im2col_conv

# --- micro-benchmark: one Conv4 layer (14x14x64 -> 7x7x64, stride 2) for a batch of tasks ---


def xla_conv(x, kernel, stride=2):
    return lax.conv_general_dilated(
        x, kernel, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def over_tasks(conv, strategy):
    if strategy == "vmap":
        return jax.vmap(conv)
    if strategy == "map":
        return lambda x, k: lax.map(lambda a: conv(*a), (x, k))
    return lambda x, k: jnp.stack([conv(x[i], k[i]) for i in range(x.shape[0])])


def time_ms(fn, *args, repeats=5) -> tuple[float, float]:
    """(compile seconds, median milliseconds) of ``jax.jit(fn)(*args)``."""
    jitted = jax.jit(fn)
    start = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return compile_s, 1e3 * statistics.median(times)


def micro(tasks: int, images: int, strategies, convs, repeats: int) -> None:
    x = jax.random.normal(jax.random.key(0), (tasks, images, 14, 14, 64))
    k = jax.random.normal(jax.random.key(1), (tasks, 3, 3, 64, 64)) * 0.05
    impls = {
        "xla": xla_conv,
        "im2col": lambda x, k: im2col_conv(x, k, 2),
    }
    print(f"one Conv4 layer, {tasks} tasks x {images} images, 14x14x64 -> 7x7x64")
    print(f"{'conv':<7} {'batching':<7} {'fwd ms':>9} {'fwd+bwd ms':>11} {'compile s':>9}")
    for name in convs:
        for strategy in strategies:
            f = over_tasks(impls[name], strategy)
            _, fwd = time_ms(f, x, k, repeats=repeats)
            grad = jax.grad(lambda x, k, f=f: jnp.sum(f(x, k) ** 2), argnums=(0, 1))
            compile_s, both = time_ms(grad, x, k, repeats=repeats)
            print(f"{name:<7} {strategy:<7} {fwd:9.1f} {both:11.1f} {compile_s:9.2f}", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Conv4-layer formulations under task batching")
    p.add_argument("--tasks", type=int, default=32)
    p.add_argument("--images", type=int, default=75, help="images per task (5-way x 15 queries)")
    p.add_argument("--batching", default="unroll,map,vmap")
    p.add_argument("--conv", default="xla,im2col")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    micro(args.tasks, args.images, args.batching.split(","), args.conv.split(","), args.repeats)


if __name__ == "__main__":
    main()
