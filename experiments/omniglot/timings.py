"""Timings behind the Omniglot configurations: data preparation, episode sampling, Conv4.

    python experiments/omniglot/timings.py [--manual-dir ../shared/data/omniglot]

Prints, on the current JAX backend:
- preparing the ``omniglot_vinyals`` TFDS dataset from the manual directory (a fresh data dir)
  and loading it back as device arrays;
- sampling a jitted meta-batch of 32 5-way 1-shot episodes with 15 queries;
- Conv4 (Omniglot variant) forward and forward+backward on a 5-way 1-shot task (5 support
  images, 75 query images), NHWC against NCHW convolutions;
- one MAML meta-step (5-way 1-shot, inner rate 0.4, one step, Adam) for a few settings, first
  and second order, tasks unrolled inside ``jit``: the library's ``meta_train_step`` on an
  already-sampled meta-batch.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import optax

from metalearn.algorithms.maml import maml
from metalearn.data.episodes import episode_distribution
from metalearn.data.omniglot import omniglot
from metalearn.data.task import supervised_objective
from metalearn.models.base import model_from_flax
from metalearn.models.conv4 import CONV4_PARTS, conv4
from metalearn.runner.steps import init_train_state, make_meta_train_step, sample_tasks

DEFAULT_MANUAL_DIR = os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "data", "omniglot"
)


def best_of(fn, *args, repeats: int = 5) -> float:
    """Seconds per call after one warm-up (compile) call, best of ``repeats``."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return min(times)


def time_data(manual_dir: str) -> dict:
    with tempfile.TemporaryDirectory() as data_dir:
        start = time.perf_counter()
        tasks = omniglot(ways=5, num_queries=15, data_dir=data_dir, manual_dir=manual_dir)
        prepare = time.perf_counter() - start
        start = time.perf_counter()
        omniglot(ways=5, num_queries=15, data_dir=data_dir)
        reload = time.perf_counter() - start
    print(f"prepare omniglot_vinyals from {manual_dir} and load: {prepare:.1f} s")
    print(f"load the prepared dataset again: {reload:.2f} s")
    sample = jax.jit(
        lambda arrays, key: jax.vmap(lambda k: tasks.sample(arrays, k, 1))(
            jax.random.split(key, 32)
        )
    )
    seconds = best_of(sample, tasks.splits["train"], jax.random.key(0), repeats=20)
    print(f"sample 32 episodes (5-way 1-shot, 15 queries), jitted: {seconds * 1e3:.2f} ms")
    return tasks


def time_conv4() -> None:
    objective = supervised_objective(
        model_from_flax(conv4(5), (28, 28, 1), CONV4_PARTS), "classification"
    )
    params, state = objective.model.init(jax.random.key(0))
    for n in (5, 75):
        x, y = jnp.ones((n, 28, 28, 1)), jnp.zeros((n,), jnp.int32)
        loss_fn = lambda p, x=x, y=y: objective.loss(p, state, None, (x, y))[0]  # noqa: E731
        fwd = jax.jit(loss_fn)
        grad = jax.jit(jax.grad(loss_fn))
        print(
            f"Conv4 on {n} images: forward {best_of(fwd, params) * 1e3:.2f} ms, "
            f"forward+backward {best_of(grad, params) * 1e3:.2f} ms"
        )
    x = jnp.ones((80, 14, 14, 64))
    w = jnp.ones((3, 3, 64, 64)) * 0.01
    for layout, lhs in (("NHWC", x), ("NCHW", x.transpose(0, 3, 1, 2))):
        dims = (layout, "HWIO", layout)

        def loss(w, lhs=lhs, dims=dims):
            out = jax.lax.conv_general_dilated(lhs, w, (2, 2), "SAME", dimension_numbers=dims)
            return jnp.sum(out**2)

        print(
            f"3x3 conv 64->64, stride 2, 80x14x14, {layout}: forward+backward "
            f"{best_of(jax.jit(jax.grad(loss)), w) * 1e3:.2f} ms"
        )


# (first order, meta-batch size, queries per class): the CPU configuration, its neighbours, and
# the paper's setting (second order, 32 tasks, here with 15 queries).
META_STEPS = [(True, 8, 5), (True, 8, 15), (False, 8, 5), (True, 32, 5), (False, 32, 15)]


def time_meta_steps(tasks) -> None:
    """The library's ``meta_train_step`` on meta-batches sampled outside the timed step."""
    model = model_from_flax(conv4(5), (28, 28, 1), CONV4_PARTS)
    optimizer = optax.adam(1e-3)
    arrays = dict(tasks.splits)
    for first_order, meta_batch, queries in META_STEPS:
        episodes = episode_distribution(arrays, ways=5, num_queries=queries, dataset="omniglot")
        objective = supervised_objective(model, "classification")
        learner = maml(objective, inner_lr=0.4, inner_steps=1, first_order=first_order)
        state = init_train_state(learner, model, optimizer, jax.random.key(0))
        batch = sample_tasks(episodes, episodes.splits["train"], jax.random.key(1), meta_batch, 1)
        step = make_meta_train_step(
            learner, optimizer, meta_steps=1, strategy="unroll", key=jax.random.key(2)
        )
        start = time.perf_counter()
        jitted = jax.jit(step)
        jax.block_until_ready(jitted(state, batch))
        compile_s = time.perf_counter() - start
        seconds = best_of(jitted, state, batch, repeats=3)
        order = "first" if first_order else "second"
        print(
            f"MAML meta-step, {order} order, meta-batch {meta_batch}, {queries} queries: "
            f"{seconds * 1e3:.0f} ms (compile {compile_s:.0f} s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manual-dir", default=DEFAULT_MANUAL_DIR)
    args = parser.parse_args()
    print(f"backend: {jax.default_backend()}, {os.cpu_count()} CPU cores")
    tasks = time_data(os.path.abspath(args.manual_dir))
    time_conv4()
    time_meta_steps(tasks)


if __name__ == "__main__":
    main()
