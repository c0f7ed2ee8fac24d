"""Discounted returns and the linear feature baseline against NumPy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from metalearn.rl.baseline import (
    advantages,
    discounted_returns,
    fit_linear_baseline,
    ridge_solve,
)
from metalearn.rl.envs import NAV2D
from metalearn.rl.policy import init_policy, policy_apply
from metalearn.rl.rollout import Trajectories, rollouts


def _batch(num=5) -> Trajectories:
    params = init_policy(jax.random.key(0), 2, 2)
    traj = rollouts(NAV2D, policy_apply, params, jax.random.key(1), jnp.array([0.2, 0.4]), num)
    # Cut two rollouts short, as if they had reached the goal.
    mask = np.ones((num, 100), np.float32)
    mask[1, 40:] = 0.0
    mask[3, 75:] = 0.0
    return traj._replace(mask=jnp.asarray(mask))


def _numpy_paths(traj: Trajectories):
    for i in range(traj.obs.shape[0]):
        length = int(np.asarray(traj.mask[i]).sum())
        yield np.asarray(traj.obs[i, :length]), np.asarray(traj.rewards[i, :length])


def _numpy_returns(rewards, discount):
    out, running = np.zeros_like(rewards), 0.0
    for t in reversed(range(len(rewards))):
        running = rewards[t] + discount * running
        out[t] = running
    return out


def _rllab_features(obs):
    o = np.clip(obs, -10, 10)
    al = np.arange(len(obs)).reshape(-1, 1) / 100.0
    return np.concatenate([o, o**2, al, al**2, al**3, np.ones((len(obs), 1))], axis=1)


def test_discounted_returns_equal_a_python_loop():
    traj = _batch()
    returns = np.asarray(discounted_returns(traj.rewards, traj.mask, 0.99))
    for i, (_, rewards) in enumerate(_numpy_paths(traj)):
        np.testing.assert_allclose(returns[i, : len(rewards)], _numpy_returns(rewards, 0.99), 1e-5)
        assert np.all(returns[i, len(rewards) :] == 0.0)


def test_linear_baseline_equals_numpy_least_squares():
    traj = _batch()
    paths = list(_numpy_paths(traj))
    features = np.concatenate([_rllab_features(o) for o, _ in paths]).astype(np.float64)
    targets = np.concatenate([_numpy_returns(r, 0.99) for _, r in paths]).astype(np.float64)
    gram = features.T @ features + 1e-5 * np.eye(features.shape[1])
    expected = np.linalg.lstsq(gram, features.T @ targets, rcond=None)[0]
    returns = discounted_returns(traj.rewards, traj.mask, 0.99)
    coeffs = np.asarray(fit_linear_baseline(traj, returns))
    fitted, reference = features @ coeffs, features @ expected
    np.testing.assert_allclose(fitted, reference, atol=2e-3 * np.abs(reference).max())
    # And the advantages are the returns minus that fit, on valid steps only.
    adv = np.asarray(advantages(traj, 0.99, baseline=True))
    valid = np.asarray(traj.mask).astype(bool)
    np.testing.assert_allclose(adv[valid], targets - reference, atol=2e-3 * np.abs(reference).max())
    assert np.all(adv[~valid] == 0.0)


def test_normalized_advantages_have_zero_mean_unit_std_over_valid_steps():
    traj = _batch()
    adv = np.asarray(advantages(traj, 0.99, baseline=True, normalize=True))
    valid = np.asarray(traj.mask).astype(bool)
    np.testing.assert_allclose(adv[valid].mean(), 0.0, atol=1e-5)
    np.testing.assert_allclose(adv[valid].std(), 1.0, atol=1e-4)


def test_ridge_solve_matches_numpy_and_retries_a_failed_factorisation():
    rng = np.random.default_rng(0)
    m = rng.normal(size=(30, 12))
    gram, rhs = m.T @ m, rng.normal(size=12)
    got = np.asarray(
        ridge_solve(jnp.asarray(gram, jnp.float32), jnp.asarray(rhs, jnp.float32), 1e-5)
    )
    expected = np.linalg.solve(gram + 1e-5 * np.eye(12), rhs)
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4 * np.abs(expected).max())
    # Rank one, with a ridge below float32's rounding: the first factorisation fails (NaN), a
    # larger ridge succeeds, as rllab's baseline retries.
    v = jnp.array([1.0, 2.0, 3.0])
    singular = jnp.outer(v, v)
    assert not np.all(np.isfinite(np.asarray(ridge_solve(singular, v, 1e-10, tries=0))))
    x = np.asarray(ridge_solve(singular, v, 1e-10))
    assert np.all(np.isfinite(x))
    np.testing.assert_allclose(np.asarray(singular) @ x, np.asarray(v), rtol=1e-2)


def test_meta_iteration_on_nav2d_makes_no_lapack_call():
    # The baseline's solve is written in lax loops: jaxlib 0.10's batched LAPACK kernels can
    # deadlock XLA:CPU's thread pool (metalearn/rl/baseline.py), so nav2d's programs have none.
    import re

    from metalearn.rl.maml_rl import MAMLRLConfig, make_meta_iteration
    from metalearn.rl.trpo import TRPOConfig

    cfg = MAMLRLConfig(num_tasks=2, num_post_rollouts=2, trpo=TRPOConfig(cg_iters=2))
    init, iteration = make_meta_iteration(NAV2D, policy_apply, cfg)
    params = init_policy(jax.random.key(0), 2, 2, hidden=(8,))
    program = iteration.lower(init(params), jax.random.key(1)).compile().as_text()
    targets = set(re.findall(r'custom_call_target="([^"]+)"', program))
    assert not {t for t in targets if "lapack" in t}, targets
