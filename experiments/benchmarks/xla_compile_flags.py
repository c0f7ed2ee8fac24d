"""Compile and run times of programs of the kinds the test suite compiles, under the XLA flags
given in ``XLA_FLAGS``, with JAX's persistent cache off (one process per measurement); the same
program under two flag sets:

    XLA_FLAGS="--xla_backend_optimization_level=0" \\
        python experiments/benchmarks/xla_compile_flags.py resnet
    XLA_FLAGS="--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false" \\
        python experiments/benchmarks/xla_compile_flags.py resnet

``brax``: compiling one physics step of HalfCheetah (``cheetah_dir``); ``resnet``: compiling the
second-order MAML meta-gradient of a tiny ResNet-12 (filters 2, 3, 4, 5; 16x16 images);
``eager``: small operations on 59 shapes run op by op, each compiled as its own program;
``run``: ten executions of a compiled ResNet-12 meta-gradient (filters 16, 16, 32, 32; 32x32
images, 25 support and 75 query), for what the flags cost when a program runs. Results:
experiments/benchmarks/README.md, "XLA's older CPU fusion emitters in the suite".
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import optax

jax.config.update("jax_enable_compilation_cache", False)


def timed_compile(label: str, lowered) -> None:
    start = time.perf_counter()
    lowered.compile()
    print(f"{label}: compiled in {time.perf_counter() - start:.2f} s", flush=True)


def resnet_meta_gradient(filters: tuple[int, ...], size: int, shots: int, queries: int):
    """``(jitted meta-gradient, params)`` of one MAML step (rate 0.5) on a random 5-way task."""
    from metalearn import maml_loss
    from metalearn.models.resnet12 import ResNet12Config, resnet12

    net = resnet12(5, ResNet12Config(filters=filters, dropblock_size=2))
    variables = jax.jit(net.init)(jax.random.key(0), jnp.zeros((1, size, size, 3)))
    keys = jax.random.split(jax.random.key(5), 4)
    xs = jax.random.normal(keys[0], (shots, size, size, 3))
    xq = jax.random.normal(keys[1], (queries, size, size, 3))
    ys, yq = jnp.arange(shots) % 5, jnp.arange(queries) % 5

    def loss(params, x, y, key):
        logits, _ = net.apply(
            {"params": params, "batch_stats": variables["batch_stats"]},
            x,
            train=True,
            mutable=["batch_stats"],
            rngs={"dropout": key},
        )
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def meta_loss(params):
        batch_loss = lambda p, batch: loss(p, *batch)  # noqa: E731
        return maml_loss(batch_loss, params, (xs, ys, keys[2]), (xq, yq, keys[3]), inner_lr=0.5)

    return jax.jit(jax.grad(meta_loss)), variables["params"]


def main(which: str) -> None:
    if which == "brax":
        from metalearn.rl.envs.locomotion import make_locomotion_env

        env = make_locomotion_env("cheetah_dir", horizon=6)
        state = jax.jit(env.reset)(jax.random.key(0), jnp.array(1.0))
        timed_compile("brax step", jax.jit(env.step).lower(state, jnp.zeros(env.action_dim)))
    elif which == "resnet":
        meta_gradient, params = resnet_meta_gradient((2, 3, 4, 5), 16, 3, 6)
        timed_compile("resnet-12 second-order meta-gradient", meta_gradient.lower(params))
    elif which == "eager":
        start = time.perf_counter()
        for rows in range(1, 60):
            y = jnp.ones((rows, 3))
            jax.block_until_ready([(jnp.tanh(y) * 2 + 1).sum(0), jnp.concatenate([y, y]), y.T @ y])
        print(f"small operations on 59 shapes, op by op: {time.perf_counter() - start:.2f} s")
    elif which == "run":
        meta_gradient, params = resnet_meta_gradient((16, 16, 32, 32), 32, 25, 75)
        jax.block_until_ready(meta_gradient(params))
        start = time.perf_counter()
        for _ in range(10):
            jax.block_until_ready(meta_gradient(params))
        print(f"resnet-12 meta-gradient, 10 runs: {time.perf_counter() - start:.2f} s")
    else:
        raise SystemExit(f"unknown program {which!r}: give brax, resnet, eager or run")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "resnet")
