"""Time on-device episode sampling: meta-batches of Omniglot tasks drawn by a jitted function.

Two measures, each the median of ``--repeats`` runs:

- ``call``: one jitted call samples a meta-batch (``vmap`` over its task keys) and returns it;
  ``--batches`` calls, each waited for: what a meta-step pays to sample, dispatch included.
- ``loop``: one jitted ``lax.fori_loop`` draws ``--batches`` meta-batches and reduces each to a
  checksum, so nothing leaves the device: the sampling work alone.

It uses only ``TaskFamily.sample``, so it runs unchanged against older checkouts of the
library (``PYTHONPATH=<checkout> python scripts/bench_episodes.py ...``) for before/after tables.

    python scripts/bench_episodes.py --manual-dir ../shared/data/omniglot --data-dir /tmp/tfds
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp


def sampler(tasks, meta_batch: int, shots: int):
    def batch(split, key):
        return jax.vmap(lambda k: tasks.sample(split, k, shots))(jax.random.split(key, meta_batch))

    return batch


def time_calls(batch, split, batches: int) -> float:
    call = jax.jit(batch)
    jax.block_until_ready(call(split, jax.random.key(0)))  # compile
    keys = jax.random.split(jax.random.key(1), batches)
    start = time.perf_counter()
    for i in range(batches):
        jax.block_until_ready(call(split, keys[i]))
    return time.perf_counter() - start


def time_loop(batch, split, batches: int) -> float:
    def body(i, total):
        task = batch(split, jax.random.fold_in(jax.random.key(2), i))
        return total + sum(jnp.sum(leaf) for leaf in jax.tree_util.tree_leaves(task))

    loop = jax.jit(lambda s: jax.lax.fori_loop(0, batches, body, jnp.float32(0)))
    jax.block_until_ready(loop(split))  # compile
    start = time.perf_counter()
    jax.block_until_ready(loop(split))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manual-dir", required=True)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--ways", type=int, default=5)
    parser.add_argument("--shots", type=int, default=1)
    parser.add_argument("--num-queries", type=int, default=15)
    parser.add_argument("--meta-batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--label", default="")
    args = parser.parse_args(argv)

    from metalearn.data.omniglot import omniglot

    tasks = omniglot(
        ways=args.ways,
        num_queries=args.num_queries,
        data_dir=args.data_dir,
        manual_dir=args.manual_dir,
    )
    split = tasks.splits["train"]
    batch = sampler(tasks, args.meta_batch, args.shots)
    for measure, fn in (("call", time_calls), ("loop", time_loop)):
        seconds = [fn(batch, split, args.batches) for _ in range(args.repeats)]
        record = {
            "label": args.label,
            "measure": measure,
            "ways": args.ways,
            "shots": args.shots,
            "meta_batch": args.meta_batch,
            "batches": args.batches,
            "ms_per_batch_median": 1e3 * statistics.median(seconds) / args.batches,
            "ms_per_batch_all": [round(1e3 * s / args.batches, 3) for s in seconds],
            "backend": jax.default_backend(),
        }
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
