"""metalearn's side of ``scripts/bench.py``: the runner's jitted meta-step, timed.

The step is built exactly as :class:`metalearn.runner.loop.Runner` builds it: the registered
task distribution, model and algorithm, ``build_optimizer``, ``make_meta_step`` and the jitted
``make_multi_step``. Omniglot-shaped tasks are sampled on the device from a dense uint8 array of
random images (``episode_distribution``, the function the registered ``omniglot`` distribution
uses), so no dataset is needed.

Peak memory: on GPU/TPU ``peak_bytes_in_use`` of the device (the process's peak, so
``bench.py`` runs each configuration in its own process); on CPU, where XLA keeps no such
counter, the compiled program's ``memory_analysis()`` (temp + argument + output bytes), with the
process's peak-RSS growth during the run reported beside it.
"""

from __future__ import annotations

import resource
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

MB = 1024.0 * 1024.0
OMNIGLOT_TRAIN_SHAPE = (4112, 20, 28, 28, 1)  # 1028 characters x 4 rotations, 20 drawings


def rss_peak_mb() -> float:
    """The process's peak resident set size so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def random_omniglot_tasks(ways: int, num_queries: int, seed: int = 0):
    """An Omniglot-shaped episode distribution over random uint8 images."""
    from metalearn.data.episodes import episode_distribution

    rng = np.random.default_rng(seed)
    train = rng.integers(0, 256, OMNIGLOT_TRAIN_SHAPE, dtype=np.uint8)
    small = train[:64]  # val/test are never sampled here
    return episode_distribution(
        {"train": train, "val": small, "test": small},
        ways=ways,
        num_queries=num_queries,
        dataset="omniglot-random",
    )


def build_parts(spec: dict[str, Any]):
    """(tasks, model, learner) from the registries, as the runner's ``build_experiment`` does."""
    import metalearn.algorithms  # noqa: F401  (registers algorithms)
    import metalearn.data  # noqa: F401  (registers task distributions)
    import metalearn.models  # noqa: F401  (registers models)
    from metalearn.algorithms.maml import MAMLConfig
    from metalearn.models.base import model_from_flax
    from metalearn.registry import ALGORITHMS, MODELS, TASKS

    if spec["kind"] == "sinusoid":
        from metalearn.data.sinusoid import SinusoidConfig
        from metalearn.models.mlp import MLPConfig

        tasks = TASKS.build(SinusoidConfig(num_queries=spec["queries"]))
        module = MODELS.build(MLPConfig(hidden_sizes=(40, 40)), tasks.num_outputs)
    else:
        from metalearn.models.conv4 import Conv4Config

        tasks = random_omniglot_tasks(spec["ways"], spec["queries"])
        if spec.get("conv") == "canonical":  # custom-VJP convolutions of bench_conv.py
            from bench_conv import conv4_with

            module = conv4_with(spec["conv"], tasks.num_outputs, filters=64)
        else:  # the library's Conv4: conv auto | xla | im2col
            config = Conv4Config(
                filters=64, downsample="stride", readout="mean", conv=spec.get("conv", "auto")
            )
            module = MODELS.build(config, tasks.num_outputs)
    embed = "embed" if hasattr(module, "embed") else None
    model = model_from_flax(
        module, tasks.input_shape, tasks.kind, head=("head",), embed_method=embed
    )
    if spec.get("inner_unroll", "full") != "full":  # proposed: a rolled inner loop
        patch_inner_unroll(int(spec["inner_unroll"]))
    learner = ALGORITHMS.build(
        MAMLConfig(
            inner_lr=spec["inner_lr"],
            num_steps=spec["inner_steps"],
            first_order=spec["order"] == "first",
            remat=spec["remat"],
        ),
        model,
    )
    return tasks, model, learner


def patch_inner_unroll(unroll: int) -> None:
    """Make MAML's inner loop a rolled ``lax.scan`` (``unroll`` steps per iteration) instead of
    the library's fully unrolled default, for measuring it: remat only bounds memory when the
    loop is rolled (XLA schedules an unrolled program as straight-line code and keeps the
    rematerialised steps' buffers alive)."""
    import functools

    import metalearn.algorithms.maml as maml
    from metalearn.core import adapt

    maml.adapt = functools.partial(adapt, unroll=unroll)


def patch_parallel_map(chains: int) -> None:
    """Add a task batching strategy ``map<chains>`` to the runner, for measuring it: the
    meta-batch split into ``chains`` groups, each a ``lax.map`` loop, the groups unrolled side
    by side so that XLA:CPU can run the loops on different cores (one ``lax.map`` runs its
    tasks one after the other, and a single task's convolutions are too small to keep two
    cores busy)."""
    import metalearn.runner.steps as steps

    original = steps.map_over_tasks

    def map_over_tasks(fn, tasks, strategy):
        if strategy != f"map{chains}":
            return original(fn, tasks, strategy)
        count = jax.tree_util.tree_leaves(tasks)[0].shape[0]
        if count % chains:
            raise ValueError(f"meta-batch {count} is not a multiple of {chains} chains")
        groups = jax.tree_util.tree_map(lambda t: t.reshape(chains, -1, *t.shape[1:]), tasks)
        outs = [
            jax.lax.map(fn, jax.tree_util.tree_map(lambda t, i=i: t[i], groups))
            for i in range(chains)
        ]
        return jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *outs)

    steps.map_over_tasks = map_over_tasks


def resolved_conv(spec: dict[str, Any]) -> str:
    """The Conv4 convolution the spec ran with (``auto`` resolved), or ``-`` (no Conv4)."""
    from metalearn.models.conv4 import CONVS, resolve_conv

    conv = spec.get("conv", "-")
    return resolve_conv(conv) if spec["kind"] != "sinusoid" and conv in CONVS else conv


def memory_stats() -> dict | None:
    try:
        return jax.devices()[0].memory_stats()
    except Exception:  # backends without memory stats
        return None


def run_metalearn(spec: dict[str, Any]) -> dict[str, Any]:
    """Compile and time the runner's meta-step for ``spec``; one result row."""
    from metalearn.config import OptimizerConfig
    from metalearn.runner.experiment import build_optimizer
    from metalearn.runner.steps import (
        TrainState,
        make_meta_step,
        make_multi_step,
        resolve_task_batching,
    )

    tasks, model, learner = build_parts(spec)
    total_steps = 10_000
    optimizer = build_optimizer(OptimizerConfig(name="adam", lr=spec["outer_lr"]), total_steps)
    init_key, learner_key = jax.random.split(jax.random.key(0))
    model_params = model.init(init_key)
    meta_params = learner.init(learner_key, model_params)
    state = TrainState(jnp.asarray(0, jnp.int32), meta_params, optimizer.init(meta_params))
    strategy = resolve_task_batching(spec["batching"], model_params)
    if strategy.startswith("map") and strategy != "map":  # e.g. map2: proposed, see below
        patch_parallel_map(int(strategy[3:]))
    extra, arrays = {}, tasks.splits["train"]
    if len(jax.devices()) > 1:  # shard the tasks as the runner does (trainer.shard_tasks)
        from metalearn.runner.devices import replicated, task_mesh

        mesh = task_mesh(True, spec["meta_batch"])
        state, arrays, extra = replicated(state, mesh), replicated(arrays, mesh), {"mesh": mesh}
    meta_step = make_meta_step(
        learner,
        tasks,
        optimizer,
        train_key=jax.random.key(1),
        meta_batch_size=spec["meta_batch"],
        shots=spec["shots"],
        total_steps=total_steps,
        strategy=strategy,
        **extra,
    )
    jitted = make_multi_step(meta_step, spec["steps_per_call"])
    jax.block_until_ready((state, arrays))
    rss_before = rss_peak_mb()

    start = time.perf_counter()
    compiled = jitted.lower(state, arrays).compile()
    compile_s = time.perf_counter() - start
    analysis = compiled.memory_analysis()

    times, cpu_times = [], []
    for i in range(spec["warmup"] + spec["steps"]):
        start, cpu_start = time.perf_counter(), time.process_time()
        state, metrics = compiled(state, arrays)
        jax.block_until_ready((state, metrics))
        if i >= spec["warmup"]:
            times.append((time.perf_counter() - start) / spec["steps_per_call"])
            cpu_times.append((time.process_time() - cpu_start) / spec["steps_per_call"])
    name = "loss" if "loss" in metrics else sorted(metrics)[0]
    loss = float(np.asarray(metrics[name]))

    row = {
        "device": f"{jax.devices()[0].platform}:{jax.devices()[0].device_kind}",
        "conv": resolved_conv(spec),
        "num_devices": len(jax.devices()),
        "batching": strategy,
        "ms_per_step": 1e3 * statistics.median(times) if times else None,
        "ms_min": 1e3 * min(times) if times else None,
        "cpu_ms_per_step": 1e3 * statistics.median(cpu_times) if cpu_times else None,
        "compile_s": compile_s,
        "final_metric": loss,
        "rss_peak_delta_mb": rss_peak_mb() - rss_before,
    }
    program_mb = None
    if analysis is not None:
        program_mb = (
            analysis.temp_size_in_bytes
            + analysis.argument_size_in_bytes
            + analysis.output_size_in_bytes
            - analysis.alias_size_in_bytes
        ) / MB
        row["xla_temp_mb"] = analysis.temp_size_in_bytes / MB
        row["xla_argument_mb"] = analysis.argument_size_in_bytes / MB
    row["xla_program_mb"] = program_mb
    stats = memory_stats()
    if stats and "peak_bytes_in_use" in stats:
        row["peak_mem_mb"] = stats["peak_bytes_in_use"] / MB
        row["peak_mem_kind"] = "device_peak_bytes_in_use"
    else:
        row["peak_mem_mb"] = program_mb
        row["peak_mem_kind"] = "xla_memory_analysis"
    return row
