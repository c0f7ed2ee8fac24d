"""The compiled training call of a group of R runs, per run and meta-step.

    python scripts/bench_run_step.py [--runs 1,10,20] [--devices 1] [--threads one|default]
        [--experiment sinusoid_maml] [--impl runner,plain]
        [--out experiments/benchmarks/run_step.jsonl]

Builds each group as ``hydra/launcher=vectorized`` builds it (the runs differ in their seed),
times ``Runner.train_call`` of ``trainer.steps_per_call`` fused meta-steps (best of 5 after a
compiling call) and writes one JSONL row per R: milliseconds per run-step. XLA's settings
apply before JAX starts, so one invocation measures one ``--devices``/``--threads`` setting;
run the script on another checkout (``PYTHONPATH=that/checkout``) to compare versions.

``--impl plain`` (``sinusoid_maml`` only) times the same meta-step written directly in JAX
(:func:`plain_sinusoid_call`: the sinusoid sampler, the MLP, one inner SGD step, Adam, ``vmap``
over the runs, ``lax.scan`` over the steps) from the runner's initial state and keys: what the
runner's step costs without its machinery.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="1,10,20")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--threads", choices=["one", "default"], default="one")
    parser.add_argument("--experiment", default="sinusoid_maml")
    parser.add_argument("--impl", default="runner", help="runner, plain, or both: runner,plain")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=None, help="append JSONL rows here")
    args = parser.parse_args(argv)
    impls = args.impl.split(",")
    if not set(impls) <= {"runner", "plain"}:
        parser.error(f"--impl {args.impl}: choose runner, plain, or runner,plain")
    if "plain" in impls and args.experiment != "sinusoid_maml":
        parser.error("--impl plain is the sinusoid_maml step only")
    flags = [os.environ.get("XLA_FLAGS", "")]
    if args.devices > 1:
        flags.append(f"--xla_force_host_platform_device_count={args.devices}")
    if args.threads == "one":
        flags.append("--xla_cpu_multi_thread_eigen=false")
    os.environ["XLA_FLAGS"] = " ".join(f for f in flags if f)

    import jax
    import jax.numpy as jnp
    from hydra import compose, initialize_config_module
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    from metalearn.config.compose import register_configs, to_objects
    from metalearn.runner import build, resolve
    from metalearn.runner.run import Runner
    from metalearn.runner.rundir import RunDirectory

    register_configs()
    import metalearn

    commit = subprocess.run(
        ["git", "-C", str(Path(metalearn.__file__).parents[1]), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.strip()

    def config(seed: int, runs: int):
        with initialize_config_module("metalearn.conf", version_base=None):
            overrides = [f"+experiment={args.experiment}", f"seed={seed}"]
            if runs == 1:  # alone, on one device, as a run of a process sweep
                overrides.append("trainer.shard_tasks=false")
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)
            with open_dict(cfg):
                del cfg["hydra"]
            OmegaConf.resolve(cfg)
        return to_objects(cfg)

    work = tempfile.mkdtemp()
    for runs in [int(r) for r in args.runs.split(",")]:
        configs = [config(seed, runs) for seed in range(runs)]
        experiments, tasks = [], None
        for cfg in configs:
            experiments.append(build(resolve(cfg, runs=runs), tasks))
            tasks = experiments[-1].tasks
        dirs = [RunDirectory(f"{work}/{runs}_{i}", c) for i, c in enumerate(configs)]
        runner = Runner(experiments, dirs) if runs > 1 else Runner(experiments[0], dirs[0])
        steps = runner.plan.steps_per_call
        for impl in impls:
            if impl == "runner":
                state = jax.tree_util.tree_map(jnp.copy, runner.initial_state)

                def call(state, runner=runner, steps=steps):
                    return runner.train_call(state, steps)[0]

            else:
                call, state = plain_sinusoid_call(experiments, steps)
            state = jax.block_until_ready(call(state))  # compiles
            best = float("inf")
            for _ in range(args.repeat):
                started = time.perf_counter()
                state = jax.block_until_ready(call(state))
                best = min(best, time.perf_counter() - started)
            row = {
                "experiment": args.experiment,
                **({"impl": impl} if impl != "runner" else {}),
                "runs": runs,
                "devices": jax.device_count(),
                "threads": args.threads,
                "steps_per_call": steps,
                "ms_per_run_step": round(1000 * best / steps / runs, 4),
                "commit": commit,
                "device": f"{jax.default_backend()} ({platform.machine()}), {os.cpu_count()} cores",
            }
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as out:
                    out.write(json.dumps(row) + "\n")
    return 0


def plain_sinusoid_call(experiments, steps: int):
    """``(call, state)``: ``call(state) -> state`` runs ``steps`` sinusoid MAML meta-steps of
    every run of ``experiments``, written directly in JAX, from their initial parameters and
    task keys (the runs on a leading axis, split across the devices as the runner splits them).
    The step the runner compiles for ``+experiment=sinusoid_maml``: on the device,
    ``meta_batch_size`` tasks from ``fold_in(train_key, step)``; one SGD step on the support
    points at the algorithm's rate; the gradient of the mean query MSE; Adam at the optimizer's
    rate."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import NamedSharding, PartitionSpec

    from metalearn.runner.devices import RUNS_AXIS, runs_mesh
    from metalearn.runner.steps import stack

    cfg = experiments[0].plan.config
    (low_a, high_a), (low_p, high_p) = cfg.data.amplitude_range, cfg.data.phase_range
    low_x, high_x = cfg.data.input_range
    shots, queries, batch = cfg.trainer.shots, cfg.data.num_queries, cfg.trainer.meta_batch_size
    inner_lr, adam = cfg.algorithm.inner_lr, optax.adam(cfg.optimizer.lr)

    def task(key):
        k_amp, k_phase, k_x = jax.random.split(key, 3)
        amplitude = jax.random.uniform(k_amp, (), minval=low_a, maxval=high_a)
        phase = jax.random.uniform(k_phase, (), minval=low_p, maxval=high_p)
        x = jax.random.uniform(k_x, (shots + queries, 1), minval=low_x, maxval=high_x)
        y = amplitude * jnp.sin(x - phase)
        return x[:shots], y[:shots], x[shots:], y[shots:]

    def predict(params, x):
        for layer in ("hidden_0", "hidden_1"):
            x = jax.nn.relu(x @ params[layer]["kernel"] + params[layer]["bias"])
        return x @ params["head"]["kernel"] + params["head"]["bias"]

    def mse(params, x, y):
        return jnp.mean((predict(params, x) - y) ** 2)

    def query_loss(params, x_support, y_support, x_query, y_query):
        grads = jax.grad(mse)(params, x_support, y_support)
        adapted = jax.tree_util.tree_map(lambda p, g: p - inner_lr * g, params, grads)
        return mse(adapted, x_query, y_query)

    def mean_query_loss(params, tasks):
        return jnp.mean(jax.vmap(query_loss, (None, 0, 0, 0, 0))(params, *tasks))

    def meta_step(carry, _):
        params, opt_state, step, key = carry
        tasks = jax.vmap(task)(jax.random.split(jax.random.fold_in(key, step), batch))
        grads = jax.grad(mean_query_loss)(params, tasks)
        updates, opt_state = adam.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, step + 1, key), None

    def run(carry):
        return jax.lax.scan(meta_step, carry, None, length=steps)[0]

    params = stack([e.initial_state.meta_params for e in experiments])
    state = (
        params,
        jax.vmap(adam.init)(params),
        jnp.zeros(len(experiments), jnp.int32),
        stack([e.hyper.train_key for e in experiments]),
    )
    mesh = runs_mesh(len(experiments))  # the runner's split of the runs over the devices
    if mesh is not None:
        state = jax.device_put(state, NamedSharding(mesh, PartitionSpec(RUNS_AXIS)))
    return jax.jit(jax.vmap(run), donate_argnums=0), state


if __name__ == "__main__":
    sys.exit(main())
