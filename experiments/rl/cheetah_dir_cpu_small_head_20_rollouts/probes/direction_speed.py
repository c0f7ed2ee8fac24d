"""What an inner step changes on HalfCheetah direction: the speed along the task's direction and
the control cost, before and after 1-3 inner steps (the evaluation's rates 0.1, 0.05, 0.05 and
rollouts), on held-out tasks. The speed is the root's x velocity in the observation (index 8:
``qd[0]`` after the eight ``q[1:]``) times the task's direction, averaged over an episode's steps.
``python direction_speed.py RUN_DIR [best|latest|init] [TASKS]`` (``init``: the run's untrained
initialisation); prints one JSON line."""

import json
import sys

import jax
import jax.numpy as jnp

from metalearn.rl.envs.locomotion import FAMILIES
from metalearn.rl.probe import adaptation_rollouts, load_trained_policy, probe_tasks
from metalearn.statistics import mean_and_ci95

run_dir = sys.argv[1]
num_tasks = int(sys.argv[3]) if len(sys.argv) > 3 else 40
# Loaded first: it sets XLA:CPU's flags for the locomotion family before JAX computes.
policy = load_trained_policy(run_dir, sys.argv[2] if len(sys.argv) > 2 else "latest")
ctrl_weight = FAMILIES["cheetah_dir"].ctrl_cost


def per_step(traj, task):
    """Mean over valid steps of the directional speed and of the control cost."""
    valid = traj.mask
    speed = jnp.sum(task * traj.obs[..., 8] * valid) / jnp.sum(valid)
    ctrl = ctrl_weight * jnp.sum(jnp.clip(traj.actions, -1, 1) ** 2, axis=-1)
    return speed, jnp.sum(ctrl * valid) / jnp.sum(valid)


@jax.jit
def measure(key, task):
    trajs, _ = adaptation_rollouts(policy, key, task)
    return jnp.array([per_step(t, task) for t in trajs])  # (steps + 1, 2)


tasks, keys = probe_tasks(policy.env, num_tasks)
values = jnp.stack([measure(k, t) for k, t in zip(keys, tasks, strict=True)])  # (tasks, 4, 2)
gain = values[:, 1:, 0] - values[:, :1, 0]


def mean_ci(x, digits):
    return [round(value, digits) for value in mean_and_ci95(x)]


print(
    json.dumps(
        {
            "run": run_dir,
            "which": policy.which,
            "step": policy.step,
            "tasks": num_tasks,
            "rollouts": policy.inner.num_rollouts,
            "speed": [mean_ci(v, 3) for v in values[:, :, 0].T],
            "ctrl_cost": [mean_ci(v, 4) for v in values[:, :, 1].T],
            "speed_gain": [mean_ci(g, 3) for g in gain.T],
        }
    )
)
