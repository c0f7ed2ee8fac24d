"""MAML-RL on a locomotion task family (Finn et al. 2017, Section 5.3), sized for a CPU.

    python scripts/rl_locomotion.py --env cheetah_dir --out experiments/rl/cheetah_dir_cpu

Evaluates the initialisation, trains MAML with metalearn's jitted meta-iteration
(``metalearn.rl.maml_rl.make_meta_iteration``: TRPO outer step with KL ``--max-kl``, one inner
VPG step of 0.1 on ``--rollouts`` rollouts per task, ``--tasks`` tasks per meta-batch) for
``--meta-iters`` iterations or ``--minutes``, whichever comes first, then evaluates the trained
policy the same way: on ``--eval-tasks`` held-out tasks (a key stream training never uses), the
mean return of ``--eval-rollouts`` episodes after 0, 1, 2, 3 inner steps of 0.1, 0.05, 0.05
(Finn et al.'s evaluation rates), mean +- 95% CI over tasks. ``--params-in`` continues from the
parameters a previous run saved (``params.npz``). Writes ``results.json`` and ``params.npz``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import jax
import numpy as np

from metalearn.rl.envs.locomotion import BACKENDS, DEFAULT_BACKEND, FAMILIES, make_locomotion_env
from metalearn.rl.inner import InnerConfig
from metalearn.rl.maml_rl import MAMLRLConfig, make_adaptation_eval, make_meta_iteration
from metalearn.rl.policy import init_policy, policy_apply
from metalearn.rl.trpo import TRPOConfig
from metalearn.runner.evaluation import mean_and_ci95

EVAL_RATES = (0.1, 0.05, 0.05)  # Finn et al.: 0.1 for the first step, 0.05 afterwards


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="cheetah_dir", choices=sorted(FAMILIES))
    parser.add_argument("--backend", default=DEFAULT_BACKEND, choices=BACKENDS)
    parser.add_argument("--horizon", type=int, default=200)
    parser.add_argument("--meta-iters", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=9.0, help="training budget")
    parser.add_argument("--tasks", type=int, default=40, help="meta-batch size")
    parser.add_argument("--rollouts", type=int, default=20, help="rollouts per task and step")
    parser.add_argument("--max-kl", type=float, default=0.01)
    parser.add_argument("--estimator", default="lvc", choices=["dice", "lvc", "maml"])
    parser.add_argument("--eval-tasks", type=int, default=20)
    parser.add_argument("--eval-rollouts", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--params-in", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("experiments/rl/cheetah_dir_cpu"))
    args = parser.parse_args(argv)
    for name in ["horizon", "meta_iters", "tasks", "rollouts", "eval_rollouts"]:
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.eval_tasks < 2:
        raise ValueError("--eval-tasks must be at least 2 for a confidence interval")
    if args.minutes <= 0 or args.max_kl <= 0:
        raise ValueError("--minutes and --max-kl must be positive")
    if args.params_in is not None and not args.params_in.is_file():
        raise ValueError(f"--params-in {args.params_in} is not a file; give a saved params.npz")
    return args


def save_params(params, path: Path) -> None:
    leaves = jax.tree.leaves(params)
    np.savez(path, **{f"leaf{i}": np.asarray(x) for i, x in enumerate(leaves)})


def load_params(template, path: Path):
    """Parameters saved by :func:`save_params`, in the structure of ``template``."""
    with np.load(path) as data:
        leaves = [data[f"leaf{i}"] for i in range(len(data.files))]
    shapes = [np.shape(x) for x in jax.tree.leaves(template)]
    if [x.shape for x in leaves] != shapes:
        raise ValueError(f"{path} holds shapes {[x.shape for x in leaves]}, expected {shapes}")
    return jax.tree.unflatten(jax.tree.structure(template), leaves)


def evaluate_table(evaluate, params, key, tasks) -> list[tuple[float, float]]:
    """Mean +- 95% CI over tasks of the return after 0, 1, 2, 3 inner steps."""
    returns = np.asarray(evaluate(params, key, tasks))
    return [mean_and_ci95(returns[:, s]) for s in range(returns.shape[1])]


def train(iteration, state, seed: int, max_iters: int, budget_s: float):
    """Meta-iterations until ``max_iters`` or ``budget_s``; per-iteration metrics and seconds."""
    root, history, seconds = jax.random.key(seed), [], []
    start = time.perf_counter()
    for i in range(max_iters):
        tic = time.perf_counter()
        state, metrics = iteration(state, jax.random.fold_in(root, i))
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        seconds.append(time.perf_counter() - tic)
        history.append(metrics)
        print(
            f"  iter {i:3d}  pre {metrics.get('pre_return', float('nan')):8.2f}"
            f"  post {metrics['post_return']:8.2f}  {seconds[-1]:6.2f} s",
            flush=True,
        )
        if time.perf_counter() - start > budget_s:
            break
    return state, history, seconds


def run(args: argparse.Namespace) -> tuple[dict, object]:
    env = make_locomotion_env(args.env, args.backend, args.horizon)
    params = init_policy(jax.random.key(args.seed), env.obs_dim, env.action_dim)
    if args.params_in is not None:
        params = load_params(params, args.params_in)
    eval_inner = InnerConfig(num_steps=3, lrs=EVAL_RATES, num_rollouts=args.eval_rollouts)
    evaluate = make_adaptation_eval(env, policy_apply, eval_inner)
    eval_root = jax.random.key(10**6 + args.seed)  # a key stream that training never uses
    tasks = env.sample_tasks(jax.random.fold_in(eval_root, 0), args.eval_tasks)
    eval_key = jax.random.fold_in(eval_root, 1)
    print(f"{args.env} ({args.backend}); load {os.getloadavg()}", flush=True)
    tic = time.perf_counter()
    before = evaluate_table(evaluate, params, eval_key, tasks)
    eval_s = time.perf_counter() - tic
    print("before:", before, flush=True)

    cfg = MAMLRLConfig(
        num_tasks=args.tasks,
        num_post_rollouts=args.rollouts,
        inner=InnerConfig(num_rollouts=args.rollouts),
        estimator=args.estimator,
        trpo=TRPOConfig(max_kl=args.max_kl),
    )
    init, iteration = make_meta_iteration(env, policy_apply, cfg)
    state, history, seconds = train(
        iteration, init(params), args.seed, args.meta_iters, 60.0 * args.minutes
    )
    after = evaluate_table(evaluate, state.params, eval_key, tasks)
    print("after:", after, flush=True)
    steps = args.tasks * 2 * args.rollouts * args.horizon
    steady = float(np.median(seconds[1:])) if len(seconds) > 1 else seconds[0]
    results = {
        "command": "python scripts/rl_locomotion.py " + " ".join(sys.argv[1:]),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "eval_rates": EVAL_RATES,
        "eval_task_values": np.asarray(tasks).tolist(),
        "returns_after_steps": {
            "initialisation": before,
            f"MAML after {len(history)} meta-iterations": after,
        },
        "history": history,
        "timing": {
            "meta_iterations": len(history),
            "first_iteration_s (compile + run)": seconds[0],
            "seconds_per_meta_iteration (median after the first)": steady,
            "env_steps_per_meta_iteration": steps,
            "env_steps_per_s (whole meta-iteration)": steps / steady,
            "first_evaluation_s (compile + run)": eval_s,
            "load_average_at_end": os.getloadavg(),
        },
    }
    return results, state.params


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    results, params = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    save_params(params, args.out / "params.npz")
    print(json.dumps(results["timing"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
