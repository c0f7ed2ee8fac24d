"""Brax pipelines (and MuJoCo MJX through Brax) for the locomotion task families, on this CPU.

    flock /work/runs/bench.lock python scripts/bench_locomotion.py --out experiments/rl

For each backend: build the ``cheetah_dir`` environment, jit one batch of rollouts (``--tasks``
tasks x ``--rollouts`` rollouts x ``--horizon`` steps of the 6-100-100-6 Gaussian policy, the
shape of one MAML-RL sampling pass), and report the first call's time (compile + one run), the
steady time per call (median of ``--reps``) and env steps/s. Writes
``locomotion_backends.json`` to ``--out``.

``--devices N`` starts N XLA:CPU devices (one thread each) and splits the tasks across them,
as ``JAX_NUM_CPU_DEVICES=N`` does for a training run (experiments/rl/locomotion/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from metalearn.rl.envs.locomotion import BACKENDS, env_dt, make_locomotion_env
from metalearn.rl.lapack import schedule_lapack_calls_serially
from metalearn.rl.policy import init_policy, policy_apply
from metalearn.rl.rollout import rollouts
from metalearn.runner.cpu_backend import start_cpu_devices
from metalearn.runner.devices import TASK_AXIS, shard_task_axis


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS))
    parser.add_argument("--env", default="cheetah_dir")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--rollouts", type=int, default=40)
    parser.add_argument("--horizon", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--devices", type=int, default=1, help="XLA:CPU devices sharing the tasks")
    parser.add_argument("--out", type=Path, default=Path("experiments/rl"))
    args = parser.parse_args(argv)
    unknown = sorted(set(args.backends) - set(BACKENDS))
    if unknown:
        raise ValueError(f"unknown backends {unknown}; choose from {list(BACKENDS)}")
    if min(args.tasks, args.rollouts, args.horizon, args.reps, args.devices) < 1:
        raise ValueError("--tasks, --rollouts, --horizon, --reps and --devices must be at least 1")
    if args.tasks % args.devices:
        raise ValueError(f"--tasks ({args.tasks}) must be a multiple of --devices ({args.devices})")
    return args


def measure(args: argparse.Namespace, backend: str) -> dict:
    """Build, first-call and steady timings of one backend's batched rollouts."""
    tic = time.perf_counter()
    env = make_locomotion_env(args.env, backend, horizon=args.horizon)
    build_s = time.perf_counter() - tic
    params = init_policy(jax.random.key(0), env.obs_dim, env.action_dim)
    tasks = env.sample_tasks(jax.random.key(1), args.tasks)

    mesh = Mesh(jax.devices()[: args.devices], (TASK_AXIS,))
    tasks = jax.device_put(tasks, NamedSharding(mesh, PartitionSpec(TASK_AXIS)))

    @jax.jit
    def sample(key):
        keys = shard_task_axis(jax.random.split(key, args.tasks), mesh)
        batch = jax.vmap(lambda k, t: rollouts(env, policy_apply, params, k, t, args.rollouts))(
            keys, tasks
        )
        return jnp.mean(jnp.sum(batch.rewards, -1)), jnp.all(jnp.isfinite(batch.obs))

    tic = time.perf_counter()
    jax.block_until_ready(sample(jax.random.key(2)))
    first_s = time.perf_counter() - tic
    steady = []
    for rep in range(args.reps):
        tic = time.perf_counter()
        mean_return, finite = jax.block_until_ready(sample(jax.random.key(3 + rep)))
        steady.append(time.perf_counter() - tic)
    run_s = float(np.median(steady))
    steps = args.tasks * args.rollouts * args.horizon
    return {
        "backend": backend,
        "dt": env_dt(args.env, backend),
        "build_s": build_s,
        "first_call_s (compile + run)": first_s,
        "compile_s (first - steady)": first_s - run_s,
        "steady_call_s (median)": run_s,
        "env_steps_per_call": steps,
        "env_steps_per_s": steps / run_s,
        "mean_return_random_policy": float(mean_return),
        "observations_finite": bool(finite),
    }


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    start_cpu_devices(args.devices)  # before JAX's first computation
    schedule_lapack_calls_serially()
    results = {
        "command": "python scripts/bench_locomotion.py " + " ".join(sys.argv[1:]),
        "jax": jax.__version__,
        "devices": [str(d) for d in jax.devices()],
        "cpu_count": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "backends": [],
    }
    for backend in args.backends:
        row = measure(args, backend)
        results["backends"].append(row)
        print(json.dumps(row), flush=True)
    results["load_average_after"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "locomotion_backends.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
