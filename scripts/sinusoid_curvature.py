"""Sharpness of the sinusoid support loss along meta-training, against 2/alpha.

    PYTHONPATH=. python scripts/sinusoid_curvature.py RUN_DIR --every 10000 --out curv.json \
        [--from-checkpoints] [key=value ...]

With ``--from-checkpoints``, reads the meta-parameters saved in RUN_DIR/checkpoints at every
``--every`` steps (train with ``trainer.keep_checkpoints`` large enough to keep them all);
otherwise re-trains the run (its ``config.yaml``, with any overrides such as ``seed=1`` or
``model.kernel_init=truncated_normal``) exactly as the runner does, in a temporary directory.
At step 0 and every ``--every`` steps it evaluates ``--tasks`` fixed validation tasks (or, with
``--split test``, the evaluation's own test tasks, to explain its diverged ones) with
``--shots`` support points:

- ``lam0``: the top Hessian eigenvalue of the support loss at the meta-learned parameters
  (``metalearn.top_hessian_eigenvalue``: Lanczos on Hessian-vector products);
- ``lam1``: the same after one inner step (where MAML's training objective stops looking);
- ``lam_traj``: the largest top eigenvalue met along the ``--inner-steps`` SGD steps of
  adaptation at the run's inner rate alpha;
- the share of tasks where each exceeds 2/alpha, the step size's stability threshold for
  gradient descent on a quadratic (|1 - alpha lam| > 1);
- ``diverged``: tasks whose query MSE after the inner steps has blown up, as the evaluation
  records count them (``metalearn.statistics.summarize``), and ``diverged_tasks``: each
  one's index and its ``lam0``, ``lam1`` and ``lam_traj`` in units of 2/alpha;
- the median query MSE after the inner steps.

Writes one JSON object per checkpoint (a list) to ``--out`` and prints a line per checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from omegaconf import OmegaConf

from metalearn import adapt_trajectory, top_hessian_eigenvalue
from metalearn.algorithms.base import context, inner_loss, query_loss
from metalearn.config import to_objects
from metalearn.runner import build, resolve
from metalearn.runner.evaluation import evaluation_keys
from metalearn.runner.run import Runner
from metalearn.runner.rundir import RunDirectory
from metalearn.runner.steps import sample_tasks_from_keys, trained
from metalearn.statistics import diverged_mask, summarize


def make_probe(objective, inner_lr: float, inner_steps: int, lanczos_iters: int):
    """Jitted ``(trained, tasks, key) -> per-task arrays`` of eigenvalues and losses.

    The support loss is the one MAML adapts on (:func:`metalearn.algorithms.base.inner_loss`),
    the query loss the one it evaluates (``objective.loss`` in evaluation mode); the loss is
    the objective's, whatever its name.
    """

    def one_task(trained, task, key):
        ctx = context(trained.model_state, key)
        support_loss_fn = inner_loss(objective, ctx)

        def support_loss(p):
            return support_loss_fn(p, task.support)

        trajectory = adapt_trajectory(
            support_loss_fn,
            trained.meta_params,
            task.support,
            inner_lr=inner_lr,
            num_steps=inner_steps,
        )
        lams = jax.vmap(
            lambda p: top_hessian_eigenvalue(support_loss, p, key, num_iters=lanczos_iters)
        )(trajectory)
        query = jax.vmap(lambda p: query_loss(objective, p, ctx, task.query, train=False)[0])(
            trajectory
        )
        return {
            "lam0": lams[0],
            "lam1": lams[1],
            "lam_traj": jnp.max(lams),
            "before": query[0],
            "after": query[-1],
        }

    def probe(trained, tasks, key):
        keys = jax.random.split(key, jax.tree_util.tree_leaves(tasks.support)[0].shape[0])
        return jax.vmap(one_task, in_axes=(None, 0, 0))(trained, tasks, keys)

    return jax.jit(probe)


def summarize_probe(step: int, out: dict, threshold: float) -> dict:
    out = {k: np.asarray(v, np.float64) for k, v in out.items()}
    after = summarize(out["after"], out["before"])
    row = {"step": step, "two_over_alpha": threshold, "tasks": int(out["after"].size)}
    for name in ("lam0", "lam1", "lam_traj"):
        lam = out[name]
        row[f"{name}_median"] = float(np.nanmedian(lam))
        row[f"{name}_p90"] = float(np.nanpercentile(lam, 90))
        row[f"{name}_max"] = float(np.nanmax(lam))
        row[f"{name}_above"] = float(np.mean(lam > threshold))
    row["diverged"] = after["diverged"]
    row["median_mse_after"] = after["median"]
    # Which tasks blew up, and how sharp their support loss was (in units of 2/alpha).
    blown = np.flatnonzero(diverged_mask(out["after"], out["before"]))
    row["diverged_tasks"] = [
        {
            "task": int(i),
            **{name: float(out[name][i] / threshold) for name in ("lam0", "lam1", "lam_traj")},
        }
        for i in blown
    ]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--every", type=int, default=10000)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--shots", type=int, default=5)
    parser.add_argument(
        "--split",
        choices=("val", "test"),
        default="val",
        help="whose tasks (test: to explain an evaluation's diverged tasks, never to choose)",
    )
    parser.add_argument("--inner-steps", type=int, default=10)
    parser.add_argument("--lanczos-iters", type=int, default=30)
    parser.add_argument("--out", required=True)
    parser.add_argument("--from-checkpoints", action="store_true")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_intermixed_args(argv)
    config_path = os.path.join(args.run_dir, "config.yaml")
    if not os.path.exists(config_path):
        sys.exit(f"error: {config_path} not found: is {args.run_dir!r} a metalearn run directory?")
    cfg = to_objects(
        OmegaConf.merge(OmegaConf.load(config_path), OmegaConf.from_dotlist(args.overrides))
    )
    if cfg.data.name != "sinusoid" or cfg.algorithm.name not in ("maml", "fomaml"):
        sys.exit("error: this diagnostic is for MAML on sinusoid runs (data=sinusoid)")
    if args.every % cfg.trainer.steps_per_call:
        sys.exit(
            f"error: --every must be a multiple of steps_per_call={cfg.trainer.steps_per_call}"
        )
    alpha = float(cfg.algorithm.inner_lr)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        workdir = args.run_dir if args.from_checkpoints else scratch
        runner = Runner(build(resolve(cfg)), RunDirectory(workdir, cfg))
        probe = make_probe(runner.exp.objective, alpha, args.inner_steps, args.lanczos_iters)
        keys = evaluation_keys(cfg.eval.seed, args.split, args.shots, args.tasks)
        tasks = sample_tasks_from_keys(
            runner.exp.tasks, runner.splits[args.split], keys, args.shots
        )
        probe_key = jax.random.key(cfg.eval.seed)
        state = runner.initial_state
        for step in range(0, cfg.trainer.meta_steps + 1, args.every):
            if args.from_checkpoints and step:
                state, _ = runner.checkpoints[0].restore(runner.initial_state, step)
            while int(state.step) < step:
                state, _ = runner.train_call(state, cfg.trainer.steps_per_call)
            # MAML's meta-parameters are the model's initial parameters themselves.
            row = summarize_probe(step, probe(trained(state), tasks, probe_key), 2.0 / alpha)
            rows.append(row)
            print(json.dumps(row), flush=True)
        runner.close()
    with open(args.out, "w") as f:
        json.dump({"config_overrides": args.overrides, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
