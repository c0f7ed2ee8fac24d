"""MAML-RL meta-iteration benchmark on 2D navigation: metalearn against a PyTorch peer.

    python scripts/bench_rl.py --impl metalearn,torch --warmup 3 --iters 5 \\
        --json experiments/benchmarks/cpu_rl_nav2d.jsonl

Both sides run Finn et al.'s 2D-navigation meta-iteration with metalearn's defaults
(``MAMLRLConfig()``): 20 tasks, 20 pre-update rollouts and one VPG step of 0.1 per task, 20
post-update rollouts, horizon 100, the LVC meta-gradient and a TRPO step (CG 10 iterations on
KL Hessian-vector products, backtracking line search). metalearn's side is
:func:`metalearn.rl.maml_rl.make_meta_iteration`: one jitted call per meta-iteration, metrics
fetched to the host after it as a training loop does; ``--task-batching vmap,map`` gives a row
for each way of batching its tasks (``auto``, the default: a loop over them on a CPU). The
peer (``scripts/bench_rl_torch.py``) is the same algorithm written the way PyTorch MAML-RL code
is: a Python loop over tasks, a NumPy environment, one policy call per time step. Both start from
the same weights.

Each implementation runs in a fresh process. Reported per implementation: seconds per
meta-iteration (median of ``--iters`` timed iterations after ``--warmup`` untimed ones), env
steps per second (environment steps sampled per iteration over that median), compile seconds
(metalearn: lowering and compiling the iteration, apart from the warm-up), the first
iteration's seconds, and the 1-minute load average. ``--profile`` adds a breakdown of
metalearn's iteration into its jitted parts (sampling, meta-gradient, one Fisher-vector
product, the CG solve, one line-search evaluation, the TRPO step).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import bench  # scripts/bench.py: its child-process runner

IMPLS = ("metalearn", "torch")


def csv_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", type=csv_list, default=list(IMPLS), help="metalearn,torch")
    p.add_argument("--iters", type=int, default=5, help="timed meta-iterations (median)")
    p.add_argument("--warmup", type=int, default=3, help="untimed meta-iterations first")
    p.add_argument("--threads", type=int, default=2, help="torch threads (the peer)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tasks", type=int, default=20, help="meta-batch size (Finn et al.: 20)")
    p.add_argument("--rollouts", type=int, default=20, help="pre- and post-update, per task")
    p.add_argument(
        "--task-batching",
        type=csv_list,
        default=["auto"],
        help="metalearn: task batchings, one row each (auto,vmap,map,map2; auto: map on CPU)",
    )
    p.add_argument("--no-isolate", action="store_true", help="run both in this process")
    p.add_argument("--profile", action="store_true", help="metalearn: time its parts too")
    p.add_argument("--json", metavar="OUT", help="append one JSON object per line here")
    p.add_argument("--row", help=argparse.SUPPRESS)  # internal: run one spec (JSON), print row
    args = p.parse_args(argv)
    for impl in args.impl:
        if impl not in IMPLS:
            raise ValueError(f"unknown impl {impl!r}: give --impl with {', '.join(IMPLS)}")
    from metalearn.core.batching import TASK_BATCHING, is_task_batching

    for batching in args.task_batching:
        if not is_task_batching(batching):
            raise ValueError(f"--task-batching: {batching!r} is not one of {TASK_BATCHING}, map<k>")
    if min(args.iters, args.threads, args.tasks, args.rollouts) < 1 or args.warmup < 0:
        raise ValueError("--iters, --threads, --tasks and --rollouts must be at least 1")
    return args


def machine() -> dict[str, Any]:
    """Host, CPU model, load and library versions."""
    cpu = platform.processor() or "-"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "host": f"{platform.machine()} {os.cpu_count()} cpus",
        "cpu": cpu,
        "load_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
    }


def initial_weights(seed: int) -> list:
    """metalearn's initial policy, as NumPy arrays in the peer's order (w1, b1, ..., log_std)."""
    import jax
    import numpy as np

    from metalearn.rl.policy import init_policy

    params = init_policy(jax.random.key(seed), 2, 2)
    leaves = [x for layer in params["layers"] for x in (layer["w"], layer["b"])]
    return [np.asarray(x) for x in [*leaves, params["log_std"]]]


def env_steps_per_iteration(cfg) -> int:
    """Environment steps metalearn samples per iteration (every scan runs the full horizon)."""
    from metalearn.rl.envs import NAV2D

    rollouts = cfg.inner.num_rollouts * cfg.inner.num_steps + cfg.num_post_rollouts
    return cfg.num_tasks * rollouts * NAV2D.horizon


def run_metalearn(spec: dict[str, Any]) -> dict[str, Any]:
    """Compile, warm up and time metalearn's jitted meta-iteration."""
    import jax

    from metalearn.rl.envs import NAV2D
    from metalearn.rl.inner import InnerConfig
    from metalearn.rl.maml_rl import MAMLRLConfig, make_meta_iteration
    from metalearn.rl.policy import policy_apply

    cfg = MAMLRLConfig(
        num_tasks=spec["tasks"],
        num_post_rollouts=spec["rollouts"],
        inner=InnerConfig(num_rollouts=spec["rollouts"]),
        task_batching=spec.get("task_batching", "auto"),
    )
    init, iteration = make_meta_iteration(NAV2D, policy_apply, cfg)
    layers = initial_weights(spec["seed"])
    params = {
        "layers": [{"w": w, "b": b} for w, b in zip(layers[0:6:2], layers[1:6:2], strict=True)],
        "log_std": layers[6],
    }
    state, root = init(jax.tree.map(jax.numpy.asarray, params)), jax.random.key(spec["seed"])
    tic = time.perf_counter()
    compiled = iteration.lower(state, root).compile()
    compile_s = time.perf_counter() - tic
    seconds, metrics = [], {}
    for i in range(spec["warmup"] + spec["iters"]):
        tic = time.perf_counter()
        state, metrics = compiled(state, jax.random.fold_in(root, i))
        metrics = jax.device_get(metrics)  # what a training loop does each iteration
        seconds.append(time.perf_counter() - tic)
    timed = seconds[spec["warmup"] :]
    row = {
        "device": f"{jax.devices()[0].platform}:{jax.devices()[0].device_kind}",
        "compile_s": compile_s,
        "first_iter_s": seconds[0],
        "seconds": timed,
        "env_steps_per_iter": env_steps_per_iteration(cfg),
        "post_return_last": float(metrics["post_return"]),
        "strategy": cfg.strategy,
        "jax_version": jax.__version__,
    }
    if spec.get("profile"):
        from bench_rl_profile import compute_floor, profile_metalearn

        row["profile_ms"] = profile_metalearn(state.params, root, cfg)
        row["compute_floor"] = compute_floor(state.params, root, cfg)
    return row


def run_torch(spec: dict[str, Any]) -> dict[str, Any]:
    """Warm up and time the PyTorch peer."""
    import torch
    from bench_rl_torch import PeerConfig, run_peer

    cfg = PeerConfig(
        num_tasks=spec["tasks"], num_rollouts=spec["rollouts"], num_post_rollouts=spec["rollouts"]
    )
    row = run_peer(spec, initial_weights(spec["seed"]), cfg)
    row["device"] = "cpu"
    row["torch_version"] = torch.__version__
    return row


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """One implementation in this process: the spec, the measurements, the machine."""
    info = machine()
    if spec["impl"] == "metalearn":
        import jax

        cached = jax.config.jax_enable_compilation_cache
        jax.config.update("jax_enable_compilation_cache", False)  # time a real compile
        try:
            result = run_metalearn(spec)
        finally:
            jax.config.update("jax_enable_compilation_cache", cached)
    else:
        result = run_torch(spec)
    median = statistics.median(result["seconds"])
    row = {"case": "nav2d_maml_trpo", **spec, **info}
    row.update(result)
    row.update(
        s_per_iter=median,
        s_min=min(result["seconds"]),
        env_steps_per_s=result["env_steps_per_iter"] / median,
        load_1m_after=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    )
    return row


def run_isolated(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one implementation in a child process (its own compile and thread pools)."""
    return bench.run_isolated(spec, script=__file__)


def print_table(rows: list[dict[str, Any]], out=None) -> None:
    """Seconds per iteration, env steps/s, compile s; ratio = torch s / metalearn s."""
    out = out or sys.stdout
    ref = {r["impl"]: r.get("s_per_iter") for r in rows if "error" not in r}
    print(f"{'impl':<16} {'s/iter':>8} {'min s':>8} {'env steps/s':>12} {'compile s':>9} "
          f"{'first s':>8} {'ratio':>7} {'load':>5}", file=out)  # fmt: skip
    for r in rows:
        if "error" in r:
            print(f"{r['impl']:<16} ERROR {r['error'][:300]}", file=out)
            continue
        ratio = ""
        if r["impl"] == "metalearn" and ref.get("torch"):
            ratio = f"{ref['torch'] / r['s_per_iter']:.1f}x"
        name = r["impl"] + (f" ({r['strategy']})" if "strategy" in r else "")
        print(
            f"{name:<16} {r['s_per_iter']:8.3f} {r['s_min']:8.3f} "
            f"{r['env_steps_per_s']:12,.0f} {r['compile_s']:9.1f} {r['first_iter_s']:8.2f} "
            f"{ratio:>7} {r['load_1m']:5.1f}",
            file=out,
        )
        for part, ms in r.get("profile_ms", {}).items():
            print(f"    {part:<28} {ms:10.1f} ms", file=out)
        for part, value in r.get("compute_floor", {}).items():
            print(f"    {part:<58} {value:10.1f}", file=out)
        floor_ms = r.get("compute_floor", {}).get("floor: that work at that rate (ms)")
        if floor_ms and ref.get("torch"):
            print(
                f"    torch's s/iter over that floor: {1e3 * ref['torch'] / floor_ms:.1f}x, the "
                "most an implementation doing this arithmetic could gain on the peer here",
                file=out,
            )


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    try:
        args = parse_args(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.row:
        print(json.dumps(run_spec(json.loads(args.row))), flush=True)
        return []
    rows = []
    runs = [
        (impl, batching)
        for impl in args.impl
        for batching in (args.task_batching if impl == "metalearn" else [None])
    ]
    for impl, batching in runs:
        spec = {
            "impl": impl,
            "iters": args.iters,
            "warmup": args.warmup,
            "seed": args.seed,
            "tasks": args.tasks,
            "rollouts": args.rollouts,
            "torch_threads": args.threads,
            "profile": args.profile and impl == "metalearn",
        }
        if batching is not None:
            spec["task_batching"] = batching
        print(f"... {impl} {batching or ''}", file=sys.stderr, flush=True)
        row = run_spec(spec) if args.no_isolate else run_isolated(spec)
        rows.append(row)
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "a") as out:
                out.write(json.dumps(row) + "\n")
    print_table(rows)
    return rows


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
