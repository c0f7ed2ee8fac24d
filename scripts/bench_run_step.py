"""The compiled training call of a group of R runs, per run and meta-step.

    python scripts/bench_run_step.py [--runs 1,10,20] [--devices 1] [--threads one|default]
        [--experiment sinusoid_maml] [--out experiments/benchmarks/run_step.jsonl]

Builds each group as ``hydra/launcher=vectorized`` builds it (the runs differ in their seed),
times ``Runner.train_call`` of ``trainer.steps_per_call`` fused meta-steps (best of 5 after a
compiling call) and writes one JSONL row per R: milliseconds per run-step. XLA's settings
apply before JAX starts, so one invocation measures one ``--devices``/``--threads`` setting;
run the script on another checkout (``PYTHONPATH=that/checkout``) to compare versions.
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
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=None, help="append JSONL rows here")
    args = parser.parse_args(argv)
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
        state = jax.tree_util.tree_map(jnp.copy, runner.initial_state)
        state, _ = runner.train_call(state, steps)
        jax.block_until_ready(state)
        best = float("inf")
        for _ in range(args.repeat):
            started = time.perf_counter()
            state, _ = runner.train_call(state, steps)
            jax.block_until_ready(state)
            best = min(best, time.perf_counter() - started)
        row = {
            "experiment": args.experiment,
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


if __name__ == "__main__":
    sys.exit(main())
