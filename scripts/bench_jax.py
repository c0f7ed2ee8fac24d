"""metalearn's side of ``scripts/bench.py``: the runner's jitted meta-step, timed.

The step is built exactly as :class:`metalearn.runner.loop.Runner` builds it: the registered
task family, model and algorithm, ``build_optimizer``, ``make_meta_train_step`` with sampling
wrapped around it by ``make_meta_step``, and the jitted ``make_multi_step``; options such as a
rolled inner loop (``MAMLConfig.unroll``) and ``map<k>`` task batching are the library's.
Omniglot-shaped tasks are sampled on the device from a dense uint8 array of random images
(``episode_distribution``, the function the registered ``omniglot`` distribution uses), so no
dataset is needed.

Peak memory: on GPU/TPU ``peak_bytes_in_use`` of the device (the process's peak, so
``bench.py`` runs each configuration in its own process); on CPU, where XLA keeps no such
counter, the compiled program's ``memory_analysis()`` (temp + argument + output bytes), with the
process's peak-RSS growth during the run reported beside it.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, NamedTuple

import jax
import numpy as np
from bench_common import MB, OMNIGLOT_TRAIN_SHAPE, rss_peak_mb


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
    """(tasks, model, learner) from the registries, as the runner's ``build_experiment`` does:
    the same ``build_model`` (declared model parts) and the library's algorithm options
    (``MAMLConfig.unroll`` for a rolled inner loop)."""
    import metalearn.algorithms  # noqa: F401  (registers algorithms)
    import metalearn.data  # noqa: F401  (registers task families)
    import metalearn.models  # noqa: F401  (registers models)
    from metalearn.algorithms.maml import MAMLConfig
    from metalearn.data.task import family_objective
    from metalearn.registry import ALGORITHMS, TASKS
    from metalearn.runner.experiment import build_model

    if spec["kind"] == "sinusoid":
        from metalearn.data.sinusoid import SinusoidConfig
        from metalearn.models.mlp import MLPConfig

        tasks = TASKS.build(SinusoidConfig(num_queries=spec["queries"]))
        model = build_model(MLPConfig(hidden_sizes=(40, 40)), tasks)
    else:
        from metalearn.models.conv4 import Conv4Config

        tasks = random_omniglot_tasks(spec["ways"], spec["queries"])
        config = Conv4Config(
            filters=64, downsample="stride", readout="mean", conv=spec.get("conv", "auto")
        )
        model = build_model(config, tasks)
    # default: the library's (full up to FULL_UNROLL_MAX_STEPS, rolled beyond); full: k = steps
    unroll = spec.get("inner_unroll", "default")
    if unroll == "default":
        unroll = None
    elif unroll == "full":
        unroll = max(1, spec["inner_steps"])
    learner = ALGORITHMS.build(
        MAMLConfig(
            inner_lr=spec["inner_lr"],
            inner_steps=spec["inner_steps"],
            first_order=spec["order"] == "first",
            remat=spec["remat"],
            unroll=None if unroll is None else int(unroll),
        ),
        family_objective(tasks, model),
    )
    return tasks, model, learner


def resolved_conv(spec: dict[str, Any]) -> str:
    """The Conv4 convolution the spec ran with (``auto`` resolved), or ``-`` (no Conv4)."""
    from metalearn.models.conv4 import CONVS, resolve_conv

    conv = spec.get("conv", "-")
    return resolve_conv(conv) if spec["kind"] != "sinusoid" and conv in CONVS else conv


def start_devices(spec: dict[str, Any]) -> None:
    """Before JAX starts, as the runner does: the XLA:CPU devices (``cpu_devices: auto``, as
    ``cpu_devices_for`` decides for ``task_batching: auto``, or the count the spec names) and
    with ``threefry: unrolled``, the unrolled threefry lowering (measured: no gain)."""
    from metalearn.runner.cpu_backend import auto_cpu_devices, start_cpu_devices, usable_cores

    count = spec.get("cpu_devices", "auto")
    if count == "auto":
        convolutional = spec["kind"] != "sinusoid"
        auto = spec["batching"] == "auto"
        count = auto_cpu_devices(convolutional, spec["meta_batch"], usable_cores()) if auto else 1
    start_cpu_devices(int(count))
    if spec.get("threefry", "rolled") == "unrolled":
        unroll_cpu_threefry()


def unroll_cpu_threefry() -> bool:
    """Lower ``threefry2x32`` on CPU as straight-line code (JAX's GPU lowering); False if this
    JAX has no such rule.

    JAX lowers its random-number hash to a rolled loop on CPU (~350 small operations per
    sinusoid meta-step). Unrolled, the bits are the same (tests/scripts/test_bench.py) and
    every program traced afterwards in this process uses it, but the sinusoid step was not
    faster (0.49 ms unrolled against 0.44 ms rolled, experiments/benchmarks/), so the library
    does not use it: it re-registers a private JAX lowering, kept here for ``--threefry
    unrolled``.
    """
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32
    except ImportError:  # a JAX without these private modules: keep its lowering
        return False
    rule = getattr(threefry2x32, "_threefry2x32_lowering_rule", None)
    if rule is None:
        return False
    mlir.register_lowering(threefry2x32.threefry2x32_p, rule, platform="cpu")
    return True


def memory_stats() -> dict | None:
    try:
        return jax.devices()[0].memory_stats()
    except Exception:  # backends without memory stats
        return None


class Built(NamedTuple):
    """The runner's jitted meta-step for a spec, with its initial state and data."""

    jitted: Any
    state: Any
    arrays: Any
    strategy: str
    steps_per_call: int


def build_step(spec: dict[str, Any], *, counting: bool = False) -> Built:
    """The runner's meta-step for ``spec``, not yet compiled (JAX's devices started first).

    ``counting``: one device, tasks batched by ``vmap``, one step per call: the same
    arithmetic with no loop over tasks, for XLA's operation count (a loop body counts once).
    """
    from metalearn.config import OptimizerConfig
    from metalearn.runner.experiment import build_optimizer
    from metalearn.runner.plan import resolve_steps_per_call, resolve_task_batching
    from metalearn.runner.steps import (
        init_train_state,
        make_meta_step,
        make_meta_train_step,
        make_multi_step,
    )

    start_devices(spec)
    tasks, model, learner = build_parts(spec)
    meta_steps = 10_000
    optimizer = build_optimizer(OptimizerConfig(name="adam", lr=spec["outer_lr"]), meta_steps)
    state = init_train_state(learner, model, optimizer, jax.random.key(0))
    strategy = (
        "vmap"
        if counting
        else resolve_task_batching(spec["batching"], convolutional=model.is_convolutional)
    )
    mesh, arrays = None, tasks.splits["train"]
    if (
        len(jax.devices()) > 1 and not counting
    ):  # shard the tasks as the runner does (trainer.shard_tasks)
        from metalearn.runner.devices import replicated, task_mesh

        mesh = task_mesh(True, spec["meta_batch"])
        state, arrays = replicated(state, mesh), replicated(arrays, mesh)
    train_step = make_meta_train_step(
        learner,
        optimizer,
        meta_steps=meta_steps,
        strategy=strategy,
        key=jax.random.key(2),
        mesh=mesh,
    )
    meta_step = make_meta_step(
        train_step,
        tasks,
        train_key=jax.random.key(1),
        meta_batch_size=spec["meta_batch"],
        shots=spec["shots"],
        mesh=mesh,
    )
    fused = 1 if counting else spec["steps_per_call"]
    if fused == "auto":
        fused = (
            1
            if model.is_convolutional
            else resolve_steps_per_call(0, convolutional=model.is_convolutional)
        )
    jitted = make_multi_step(meta_step, int(fused))
    return Built(jitted, state, arrays, strategy, int(fused))


def _flops(cost: Any) -> float | None:
    """The ``flops`` entry of a JAX cost analysis (a dict, or a list of one per program)."""
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    flops = (cost or {}).get("flops")
    return float(flops) if flops and flops > 0 else None


def step_gflop(spec: dict[str, Any]) -> float | None:
    """XLA's count of one meta-step's floating-point operations, in GFLOP (the step with
    ``vmap`` over tasks and the inner loop unrolled: the lowered program's count, else the
    compiled one's, which is what XLA:GPU gives), or None where the backend gives no count."""
    # The inner loop unrolled: the same arithmetic, and a rolled loop's body counts once.
    built = build_step({**spec, "inner_unroll": "full"}, counting=True)
    lowered = built.jitted.lower(built.state, built.arrays)
    flops = _flops(lowered.cost_analysis()) or _flops(lowered.compile().cost_analysis())
    return flops / 1e9 if flops else None


def matmul_ceiling(repeats: int = 20) -> list[dict[str, Any]]:
    """GFLOP/s of float32 matrix products with the devices the Conv4 runner starts (one per
    core, one thread each), every device multiplying at once: the ceiling for a meta-step.

    Shapes: Conv4's second layer on 300 images ([14700, 576] x [576, 64], 20-way queries),
    on 75 ([3675, 576] x [576, 64], 5-way), and square 1024 products.
    """
    from jax.sharding import PartitionSpec

    from metalearn.runner.devices import TASK_AXIS, task_mesh

    start_devices({"kind": "omniglot", "batching": "auto", "meta_batch": 32})
    devices = len(jax.devices())
    mesh = task_mesh(True, devices)
    rows = []
    for m, k, n in ((14700, 576, 64), (3675, 576, 64), (1024, 1024, 1024)):
        a = jax.random.normal(jax.random.key(0), (devices, m, k))
        b = jax.random.normal(jax.random.key(1), (devices, k, n))
        product = jax.jit(lambda a, b: jax.numpy.einsum("dmk,dkn->dmn", a, b))
        if mesh is not None:
            spec = PartitionSpec(TASK_AXIS)
            product = jax.jit(
                jax.shard_map(
                    lambda a, b: jax.numpy.einsum("dmk,dkn->dmn", a, b),
                    mesh=mesh,
                    in_specs=(spec, spec),
                    out_specs=spec,
                )
            )
        jax.block_until_ready(product(a, b))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(product(a, b))
            times.append(time.perf_counter() - start)
        gflop = 2.0 * devices * m * k * n / 1e9
        rows.append(
            {
                "case": "matmul_ceiling",
                "shape": f"{devices} x [{m}, {k}] x [{k}, {n}]",
                "num_devices": devices,
                "gflop": gflop,
                "ms_per_call": 1e3 * statistics.median(times),
                "gflop_s": gflop / statistics.median(times),
                "gflop_s_best": gflop / min(times),
            }
        )
    return rows


def run_metalearn(spec: dict[str, Any]) -> dict[str, Any]:
    """Compile and time the runner's meta-step for ``spec``; one result row."""
    jitted, state, arrays, strategy, fused = build_step(spec)
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
            times.append((time.perf_counter() - start) / fused)
            cpu_times.append((time.process_time() - cpu_start) / fused)
    name = "loss" if "loss" in metrics else sorted(metrics)[0]
    loss = float(np.asarray(metrics[name]))

    row = {
        "device": f"{jax.devices()[0].platform}:{jax.devices()[0].device_kind}",
        "conv": resolved_conv(spec),
        "num_devices": len(jax.devices()),
        "batching": strategy,
        "steps_per_call": fused,
        "ms_per_step": 1e3 * statistics.median(times) if times else None,
        "ms_min": 1e3 * min(times) if times else None,
        "cpu_ms_per_step": 1e3 * statistics.median(cpu_times) if cpu_times else None,
        "compile_s": compile_s,
        "final_metric": loss,
        "rss_peak_delta_mb": rss_peak_mb() - rss_before,
    }
    gflop = step_gflop(spec)
    if gflop and row["ms_per_step"]:
        row["gflop_per_step"] = gflop
        row["gflop_s"] = gflop / (row["ms_per_step"] / 1e3)
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
