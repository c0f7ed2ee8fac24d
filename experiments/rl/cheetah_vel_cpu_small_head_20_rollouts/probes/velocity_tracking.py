"""Whether HalfCheetah-velocity adaptation tracks the task's goal: on held-out tasks, each task's
forward speed (the root's x velocity in the observation, index 8, averaged over an episode's
steps) before and after 1-3 inner steps (the run's evaluation rates and rollouts), the mean
distance |v - g| to the goal velocity g, and the least-squares slope of speed against goal across
tasks (0: one speed for every goal; 1: the speed follows the goal). The episode return is split
into its two terms, the control cost ``0.05 sum |clip(a)|^2`` and the tracking term
``-sum |v_t - g|`` (their difference), and the policy's exploration standard deviation
(``exp(log_std)``, mean over the action's dimensions) is given before and after the steps; each
task's mean return after 0-3 steps is kept (tasks and keys are the same in every run, so two
runs' lines can be compared task by task).
``python velocity_tracking.py RUN_DIR [best|latest|init] [TASKS]`` (``init``: the run's untrained
initialisation); prints one JSON line."""

import json
import sys

import jax
import jax.numpy as jnp

from metalearn.rl.envs.locomotion import FAMILIES, brax_env
from metalearn.rl.probe import adaptation_rollouts, load_trained_policy, probe_tasks
from metalearn.rl.rollout import episode_returns
from metalearn.statistics import mean_and_ci95

run_dir = sys.argv[1]
num_tasks = int(sys.argv[3]) if len(sys.argv) > 3 else 40
# Loaded first: it sets XLA:CPU's flags for the locomotion family before JAX computes.
policy = load_trained_policy(run_dir, sys.argv[2] if len(sys.argv) > 2 else "latest")
ctrl_cost = FAMILIES["cheetah_vel"].ctrl_cost
ctrl_range = brax_env("halfcheetah", "generalized").sys.actuator.ctrl_range


def speed(traj):
    """Mean over valid steps of the root's forward velocity."""
    return jnp.sum(traj.obs[..., 8] * traj.mask) / jnp.sum(traj.mask)


def control_cost(traj):
    """Mean over rollouts of the episode's control cost (the env's clip and weight)."""
    clipped = jnp.clip(traj.actions, ctrl_range[:, 0], ctrl_range[:, 1])
    per_step = ctrl_cost * jnp.sum(clipped**2, axis=-1) * traj.mask
    return jnp.mean(jnp.sum(per_step, axis=-1))


def std(p):
    return jnp.mean(jnp.exp(p["log_std"]))


@jax.jit
def measure(key, task):
    trajs, adapted = adaptation_rollouts(policy, key, task)
    return (
        jnp.stack([speed(t) for t in trajs]),  # (steps + 1,)
        jnp.stack([jnp.mean(episode_returns(t)) for t in trajs]),
        jnp.stack([control_cost(t) for t in trajs]),
        jnp.stack([std(policy.params), std(adapted)]),
    )


def mean_ci(x):
    return [round(value, 3) for value in mean_and_ci95(x)]


tasks, keys = probe_tasks(policy.env, num_tasks)
measured = [measure(k, t) for k, t in zip(keys, tasks, strict=True)]
speeds, returns, costs, stds = (jnp.stack(m) for m in zip(*measured, strict=True))  # (tasks, 4)
goals = jnp.asarray(tasks).reshape(num_tasks)
centred = goals - jnp.mean(goals)
slopes = [float(jnp.sum(centred * (s - jnp.mean(s))) / jnp.sum(centred**2)) for s in speeds.T]
print(
    json.dumps(
        {
            "run": run_dir,
            "which": policy.which,
            "step": policy.step,
            "tasks": num_tasks,
            "rollouts": policy.inner.num_rollouts,
            "lrs": list(policy.inner.lrs),
            "speed": [mean_ci(s) for s in speeds.T],
            "distance_to_goal": [mean_ci(jnp.abs(s - goals)) for s in speeds.T],
            "slope_speed_on_goal": [round(s, 3) for s in slopes],
            "episode_return": [mean_ci(r) for r in returns.T],
            "control_cost": [mean_ci(c) for c in costs.T],
            "tracking_term": [mean_ci(r + c) for r, c in zip(returns.T, costs.T, strict=True)],
            "policy_std_before_after": [round(float(jnp.mean(s)), 3) for s in stds.T],
            "episode_return_per_task": [[round(float(r), 2) for r in row] for row in returns.T],
        }
    )
)
