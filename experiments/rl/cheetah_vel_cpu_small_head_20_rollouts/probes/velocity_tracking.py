"""Whether HalfCheetah-velocity adaptation tracks the task's goal: on held-out tasks, each task's
forward speed (the root's x velocity in the observation, index 8, averaged over an episode's
steps) before and after 1-3 inner steps (the run's evaluation rates and rollouts), the mean
distance |v - g| to the goal velocity g, and the least-squares slope of speed against goal across
tasks (0: one speed for every goal; 1: the speed follows the goal).
``python velocity_tracking.py RUN_DIR [best|latest|init] [TASKS]`` (``init``: the run's untrained
initialisation); prints one JSON line."""

import json
import sys

from metalearn.runner.cpu_backend import schedule_lapack_calls_serially

schedule_lapack_calls_serially()  # before JAX's first computation

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from metalearn.evaluate import load_run_config  # noqa: E402
from metalearn.rl.algorithm import evaluation_inner  # noqa: E402
from metalearn.rl.inner import InnerConfig, sample_adaptation  # noqa: E402
from metalearn.rl.rollout import rollouts  # noqa: E402
from metalearn.runner.loop import load_for_evaluation  # noqa: E402

run_dir = sys.argv[1]
which = sys.argv[2] if len(sys.argv) > 2 else "latest"
num_tasks = int(sys.argv[3]) if len(sys.argv) > 3 else 40
cfg = load_run_config(run_dir, [])
runner, saved = load_for_evaluation(cfg, run_dir, which)
params = saved.meta_params
env, policy_apply = runner.exp.objective.env, runner.exp.objective.policy_apply
inner = evaluation_inner(cfg.algorithm, InnerConfig(), 3)


def speed(traj):
    """Mean over valid steps of the root's forward velocity."""
    return jnp.sum(traj.obs[..., 8] * traj.mask) / jnp.sum(traj.mask)


@jax.jit
def measure(key, task):
    inner_key, last_key = jax.random.split(key)
    batches, _, adapted = sample_adaptation(env, policy_apply, params, inner_key, task, inner)
    last = rollouts(env, policy_apply, adapted, last_key, task, inner.num_rollouts)
    return jnp.stack([speed(t) for t in [*batches, last]])  # (steps + 1,)


def mean_ci(x):
    half = 1.96 * jnp.std(x, ddof=1) / len(x) ** 0.5
    return [round(float(jnp.mean(x)), 3), round(float(half), 3)]


tasks = env.sample_tasks(jax.random.key(20261124), num_tasks)
keys = jax.random.split(jax.random.key(7), num_tasks)
speeds = jnp.stack([measure(k, t) for k, t in zip(keys, tasks, strict=True)])  # (tasks, 4)
goals = jnp.asarray(tasks).reshape(num_tasks)
centred = goals - jnp.mean(goals)
slopes = [float(jnp.sum(centred * (s - jnp.mean(s))) / jnp.sum(centred**2)) for s in speeds.T]
print(
    json.dumps(
        {
            "run": run_dir,
            "which": runner.loaded,
            "step": runner.loaded_step,
            "tasks": num_tasks,
            "rollouts": inner.num_rollouts,
            "lrs": list(inner.lrs),
            "speed": [mean_ci(s) for s in speeds.T],
            "distance_to_goal": [mean_ci(jnp.abs(s - goals)) for s in speeds.T],
            "slope_speed_on_goal": [round(s, 3) for s in slopes],
        }
    )
)
