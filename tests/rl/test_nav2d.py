"""The JAX 2D navigation rollout against a plain NumPy re-implementation, step by step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from metalearn.rl.envs import NAV2D, sample_goals
from metalearn.rl.policy import init_policy, policy_apply
from metalearn.rl.rollout import rollout, rollouts


def numpy_point_env(goal: np.ndarray, actions: np.ndarray):
    """cbfinn/maml_rl's PointEnvRandGoal inside rllab's normalize, for given policy actions."""
    lb, ub = -0.1, 0.1
    state = np.zeros(2)
    obs, rewards, dones = [], [], []
    for action in actions:
        obs.append(state.copy())
        scaled = np.clip(lb + (action + 1.0) * 0.5 * (ub - lb), lb, ub)
        state = state + scaled
        x, y = state - goal
        rewards.append(-((x**2 + y**2) ** 0.5))
        dones.append(abs(x) < 0.01 and abs(y) < 0.01)
    return np.array(obs), np.array(rewards), np.array(dones)


def numpy_policy_mean(params, obs: np.ndarray) -> np.ndarray:
    h = obs
    layers = [{k: np.asarray(v) for k, v in layer.items()} for layer in params["layers"]]
    for layer in layers[:-1]:
        h = np.maximum(h @ layer["w"] + layer["b"], 0.0)
    return h @ layers[-1]["w"] + layers[-1]["b"]


def test_goals_are_uniform_in_the_reference_square():
    goals = np.asarray(sample_goals(jax.random.key(0), 4000))
    assert goals.min() >= -0.5 and goals.max() <= 0.5
    np.testing.assert_allclose(goals.mean(0), 0.0, atol=0.02)
    np.testing.assert_allclose(goals.var(0), 1 / 12, rtol=0.08)


def test_rollout_equals_numpy_step_by_step():
    params = init_policy(jax.random.key(0), 2, 2)
    params["log_std"] = jnp.array([0.5, -0.3])
    goal = np.array([0.3, -0.2], np.float32)
    key = jax.random.key(1)
    traj = rollout(NAV2D, policy_apply, params, key, jnp.asarray(goal))
    actions = np.asarray(traj.actions)
    obs, rewards, _ = numpy_point_env(goal, actions)
    np.testing.assert_allclose(np.asarray(traj.obs), obs, atol=1e-5)
    np.testing.assert_allclose(np.asarray(traj.rewards), rewards, atol=1e-5)
    # The actions are the policy's Gaussian samples at those observations: mean + std * noise.
    noise = (actions - numpy_policy_mean(params, obs)) / np.exp(np.asarray(params["log_std"]))
    assert abs(noise.mean()) < 0.2 and 0.8 < noise.std() < 1.2
    # Clipped: no coordinate moves by more than 0.1 per step.
    assert np.abs(np.diff(obs, axis=0)).max() <= 0.1 + 1e-6


def test_episode_ends_at_the_goal_and_later_steps_are_masked():
    goal = np.array([0.25, -0.15], np.float32)

    def to_goal(params, obs):  # near-deterministic steps straight to the goal
        return 10.0 * (jnp.asarray(goal) - obs), jnp.full(obs.shape, -20.0)

    traj = rollout(NAV2D, to_goal, None, jax.random.key(0), jnp.asarray(goal))
    _, rewards, dones = numpy_point_env(goal, np.asarray(traj.actions))
    first_done = int(np.argmax(dones))
    assert dones.any() and first_done < 10
    expected_mask = (np.arange(NAV2D.horizon) <= first_done).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(traj.mask), expected_mask)
    np.testing.assert_allclose(
        np.asarray(traj.rewards)[: first_done + 1], rewards[: first_done + 1], atol=1e-6
    )


def test_rollouts_batch_over_rollouts_and_tasks():
    params = init_policy(jax.random.key(0), 2, 2, hidden=(8,))
    goals = sample_goals(jax.random.key(1), 3)
    keys = jax.random.split(jax.random.key(2), 3)
    batched = jax.vmap(lambda k, g: rollouts(NAV2D, policy_apply, params, k, g, 4))(keys, goals)
    assert batched.obs.shape == (3, 4, 100, 2)
    single = rollouts(NAV2D, policy_apply, params, keys[1], goals[1], 4)
    np.testing.assert_allclose(batched.rewards[1], single.rewards, atol=1e-6)
