"""MAML-RL on 2D navigation (Finn et al. 2017, Section 5.3 and Figure 5) on this machine.

    python scripts/rl_nav2d.py --minutes 12 --out experiments/rl

Trains MAML (TRPO outer step, KL 0.01; 20 tasks per meta-batch, 20 pre- and 20 post-update
rollouts of 100 steps; one inner VPG step of 0.1) for ``--meta-iters`` meta-iterations or
``--minutes`` of training, whichever comes first; trains the "pretrained" policy (TRPO on the
task distribution, no inner step) for as many iterations; then evaluates MAML, pretrained and a
random initialisation on held-out goals (another key stream): the mean return of
``--eval-rollouts`` episodes after 0, 1, 2, 3 inner steps of 0.1, 0.05, 0.05 (Finn et al.'s
evaluation rates), mean +- 95% CI over goals. Writes ``nav2d_results.json`` and
``nav2d_returns.png`` to ``--out``, and reports env steps/s and seconds per meta-iteration.
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

from metalearn.rl.envs import NAV2D, sample_goals
from metalearn.rl.inner import InnerConfig
from metalearn.rl.maml_rl import MAMLRLConfig, make_adaptation_eval, make_meta_iteration
from metalearn.rl.policy import init_policy, policy_apply
from metalearn.rl.rollout import rollouts
from metalearn.runner.evaluation import mean_and_ci95

EVAL_RATES = (0.1, 0.05, 0.05)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--meta-iters", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=12.0, help="training budget per method")
    parser.add_argument("--tasks", type=int, default=20, help="meta-batch size")
    parser.add_argument("--rollouts", type=int, default=20, help="rollouts per task and step")
    parser.add_argument("--hidden", type=int, nargs="+", default=[100, 100])
    parser.add_argument("--estimator", default="lvc", choices=["dice", "lvc", "maml"])
    parser.add_argument("--outer", default="trpo", choices=["trpo", "ppo"])
    parser.add_argument("--eval-goals", type=int, default=100)
    parser.add_argument("--eval-rollouts", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("experiments/rl"))
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    for name in ["meta_iters", "tasks", "rollouts", "eval_goals", "eval_rollouts"]:
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.eval_goals < 2:
        raise ValueError("--eval-goals must be at least 2 for a confidence interval")
    if args.minutes <= 0 or any(h < 1 for h in args.hidden):
        raise ValueError("--minutes and every --hidden width must be positive")
    return args


def train(cfg: MAMLRLConfig, params, seed: int, max_iters: int, budget_s: float):
    """Meta-iterations until ``max_iters`` or ``budget_s``; history and timings."""
    init, iteration = make_meta_iteration(NAV2D, policy_apply, cfg)
    state, root = init(params), jax.random.key(seed)
    history, seconds = [], []
    start = time.perf_counter()
    for i in range(max_iters):
        tic = time.perf_counter()
        state, metrics = iteration(state, jax.random.fold_in(root, i))
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        seconds.append(time.perf_counter() - tic)
        history.append(metrics)
        print(
            f"  iter {i:3d}  pre {metrics['pre_return']:8.2f}  post {metrics['post_return']:8.2f}"
            f"  {seconds[-1]:6.2f} s",
            flush=True,
        )
        if time.perf_counter() - start > budget_s:
            break
    return state.params, history, seconds


def sampling_throughput(params, tasks: int, num: int) -> float:
    """Env steps/s of sampling alone: ``tasks x num`` rollouts of 100 steps in one call."""
    goals = sample_goals(jax.random.key(0), tasks)

    @jax.jit
    def sample(key):
        keys = jax.random.split(key, tasks)
        batch = jax.vmap(lambda k, g: rollouts(NAV2D, policy_apply, params, k, g, num))(keys, goals)
        return batch.rewards.sum()

    sample(jax.random.key(0)).block_until_ready()
    tic, reps = time.perf_counter(), 5
    for r in range(reps):
        sample(jax.random.key(r + 1)).block_until_ready()
    return reps * tasks * num * NAV2D.horizon / (time.perf_counter() - tic)


def plot(table: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, rows in table.items():
        steps = np.arange(len(rows))
        means, cis = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
        ax.errorbar(steps, means, yerr=cis, marker="o", capsize=3, label=name)
    ax.set(xlabel="number of gradient steps", ylabel="average return", title="2D navigation")
    ax.set_xticks(range(len(next(iter(table.values())))))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def run(args: argparse.Namespace) -> dict:
    hidden = tuple(args.hidden)
    params = init_policy(jax.random.key(args.seed), NAV2D.obs_dim, NAV2D.action_dim, hidden)
    inner = InnerConfig(num_rollouts=args.rollouts)
    common = {"num_tasks": args.tasks, "num_post_rollouts": args.rollouts, "outer": args.outer}
    budget = 60.0 * args.minutes
    maml_cfg = MAMLRLConfig(inner=inner, estimator=args.estimator, **common)
    print(f"MAML ({args.estimator}, {args.outer}); load: {os.getloadavg()}", flush=True)
    maml, maml_hist, maml_s = train(maml_cfg, params, args.seed, args.meta_iters, budget)
    pre_cfg = MAMLRLConfig(inner=InnerConfig(num_steps=0, lrs=()), **common)
    print(f"pretrained ({len(maml_hist)} iterations)", flush=True)
    pre, pre_hist, pre_s = train(pre_cfg, params, args.seed, len(maml_hist), budget)

    eval_inner = InnerConfig(num_steps=3, lrs=EVAL_RATES, num_rollouts=args.eval_rollouts)
    evaluate = make_adaptation_eval(NAV2D, policy_apply, eval_inner)
    eval_root = jax.random.key(10**6 + args.seed)  # a key stream that training never uses
    goals = sample_goals(jax.random.fold_in(eval_root, 0), args.eval_goals)
    table = {}
    for name, p in [("MAML", maml), ("pretrained", pre), ("random", params)]:
        returns = np.asarray(evaluate(p, jax.random.fold_in(eval_root, 1), goals))
        table[name] = [mean_and_ci95(returns[:, s]) for s in range(returns.shape[1])]
        cells = "  ".join(f"{m:7.2f} ± {c:5.2f}" for m, c in table[name])
        print(f"{name:>10}: {cells}", flush=True)

    steps_per_iter = args.tasks * 2 * args.rollouts * NAV2D.horizon
    steady = float(np.median(maml_s[1:])) if len(maml_s) > 1 else float(maml_s[0])
    return {
        "command": "python scripts/rl_nav2d.py " + " ".join(sys.argv[1:]),
        "settings": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "inner_lr": inner.lrs[0],
            "eval_rates": EVAL_RATES,
            "max_kl": maml_cfg.trpo.max_kl,
            "discount": inner.discount,
        },
        "returns_after_steps": {n: [[m, c] for m, c in rows] for n, rows in table.items()},
        "maml_history": maml_hist,
        "pretrained_history": pre_hist,
        "timing": {
            "maml_meta_iterations": len(maml_hist),
            "first_iteration_s (compile + run)": maml_s[0],
            "seconds_per_meta_iteration (median after the first)": steady,
            "env_steps_per_meta_iteration": steps_per_iter,
            "env_steps_per_s (whole meta-iteration)": steps_per_iter / steady,
            "env_steps_per_s (sampling only)": sampling_throughput(
                maml, args.tasks, 2 * args.rollouts
            ),
            "pretrained_seconds_per_iteration": float(np.median(pre_s[1:] or pre_s)),
            "load_average_at_end": os.getloadavg(),
        },
    }


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    results = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nav2d_results.json").write_text(json.dumps(results, indent=1) + "\n")
    if not args.no_plot:
        table = {n: [tuple(r) for r in rows] for n, rows in results["returns_after_steps"].items()}
        plot(table, args.out / "nav2d_returns.png")
    print(json.dumps(results["timing"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
