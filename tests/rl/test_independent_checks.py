"""The RL building blocks against closed forms and NumPy re-implementations.

Each test here was written for a change that the rest of the suite let pass (a hand mutation
review): terms that vanish on the horizon-1, undiscounted bandit of ``test_estimators.py``, a
fixed standard deviation, a TRPO step that never meets its bound.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import norm

from metalearn.rl.baseline import advantages
from metalearn.rl.envs import NAV2D, sample_goals
from metalearn.rl.envs.nav2d import reset, step
from metalearn.rl.estimators import _dice_weight, collect_task_batch
from metalearn.rl.inner import InnerConfig, inner_step, inner_surrogate
from metalearn.rl.maml_rl import adaptation_batches
from metalearn.rl.policy import gaussian_kl, gaussian_log_prob, init_policy, policy_apply
from metalearn.rl.rollout import Trajectories, log_probs
from metalearn.rl.trpo import TRPOConfig, trpo_step
from tests.rl.test_nav2d import numpy_point_env


@pytest.fixture(autouse=True)
def float64():
    with jax.enable_x64(True):  # the setting as it was is restored after each test
        yield


def test_gaussian_log_prob_is_scipys_with_any_standard_deviation():
    rng = np.random.default_rng(0)
    mean, log_std, action = rng.normal(size=(3, 5, 3))
    expected = norm.logpdf(action, mean, np.exp(log_std)).sum(-1)
    got = gaussian_log_prob(jnp.asarray(mean), jnp.asarray(log_std), jnp.asarray(action))
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_gaussian_kl_is_the_closed_form_in_its_order():
    # KL(N(0, 1) || N(0, 2^2)) = ln 2 + 1/8 - 1/2; the reverse is ln(1/2) + 4/2 - 1/2.
    kl = jax.jit(gaussian_kl)  # one compiled program for the three pairs
    forward = kl(jnp.zeros(1), jnp.zeros(1), jnp.zeros(1), jnp.full(1, math.log(2)))
    backward = kl(jnp.zeros(1), jnp.full(1, math.log(2)), jnp.zeros(1), jnp.zeros(1))
    assert float(forward) == pytest.approx(math.log(2) + 1 / 8 - 1 / 2, rel=1e-12)
    assert float(backward) == pytest.approx(-math.log(2) + 2 - 1 / 2, rel=1e-12)
    # With means apart: ln(2 / 0.5) + (0.5^2 + 2^2) / (2 * 2^2) - 1/2
    value = kl(jnp.ones(1), jnp.full(1, math.log(0.5)), -jnp.ones(1), jnp.full(1, math.log(2)))
    assert float(value) == pytest.approx(math.log(4) + 4.25 / 8 - 0.5, rel=1e-12)


def _trajectories(rng, num=3, horizon=6, ends=(6, 3, 5)):
    mask = np.array([[1.0 if t < end else 0.0 for t in range(horizon)] for end in ends[:num]])
    return Trajectories(
        jnp.asarray(rng.normal(size=(num, horizon, 2))),
        jnp.asarray(rng.normal(size=(num, horizon, 1))),
        jnp.asarray(rng.normal(size=(num, horizon))),
        jnp.asarray(mask),
    )


def test_dice_weight_equals_numpy_with_discounting_and_early_ends():
    rng = np.random.default_rng(1)
    traj = _trajectories(rng)
    discount, post_return = 0.9, 2.5
    cfg = InnerConfig(discount=discount, baseline=False, normalize=False)
    rewards, mask = np.asarray(traj.rewards), np.asarray(traj.mask)
    num, horizon = rewards.shape
    to_go = np.zeros_like(rewards)  # returns to go over the valid steps
    for i in range(num):
        for t in range(horizon):
            to_go[i, t] = (
                sum(discount ** (k - t) * rewards[i, k] * mask[i, k] for k in range(t, horizon))
                * mask[i, t]
            )
    own_return = to_go[:, 0].mean()  # the return of each rollout from its first step
    expected = (post_return - own_return + discount ** np.arange(horizon) * to_go / num) * mask
    got = jax.jit(_dice_weight, static_argnums=2)(traj, jnp.asarray(post_return), cfg)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)


def test_lvc_adds_the_score_outer_products_to_the_inner_hessian():
    # Policy N(mu, 1) on every step: d log pi / d mu = a - mu, d2 = -1. The plain surrogate's
    # Hessian is mean(A * -1); ProMP's LVC form adds mean(A * (a - mu)^2).
    rng = np.random.default_rng(2)
    traj = _trajectories(rng, horizon=4, ends=(4, 2, 3))
    traj = traj._replace(obs=traj.obs[..., :1])
    adv = jnp.asarray(rng.normal(size=traj.mask.shape)) * traj.mask
    apply = lambda p, obs: (jnp.broadcast_to(p, obs.shape), jnp.zeros(obs.shape))  # noqa: E731
    mu = 0.2
    a, m, A = np.asarray(traj.actions[..., 0]), np.asarray(traj.mask), np.asarray(adv)
    plain = np.sum(A * m * -1.0) / m.sum()
    lvc = np.sum(A * m * ((a - mu) ** 2 - 1.0)) / m.sum()
    for flag, expected in ((False, plain), (True, lvc)):
        surrogate = lambda p, flag=flag: inner_surrogate(apply, p, traj, adv, lvc=flag)  # noqa: E731
        hessian = jax.jit(jax.hessian(surrogate))(mu)
        assert float(hessian) == pytest.approx(expected, rel=1e-10), flag


def test_trpo_backtracks_until_the_kl_bound_holds():
    # The KL's quadratic model allows a step of length sqrt(2 * 0.01); its quartic term makes
    # that step's KL 0.05, so the line search must shrink it.
    kl = lambda x: 0.5 * jnp.sum(x**2) + 100.0 * jnp.sum(x**2) ** 2  # noqa: E731
    surrogate = lambda x: jnp.dot(jnp.array([1.0, 2.0]), x)  # noqa: E731
    cfg = TRPOConfig(max_kl=0.01)
    new, info = jax.jit(lambda p: trpo_step(surrogate, kl, p, cfg))(jnp.zeros(2))
    assert bool(info.accepted) and int(info.backtracks) > 0
    assert float(kl(new)) <= cfg.max_kl and float(info.kl) == pytest.approx(float(kl(new)))
    assert float(info.surrogate_after) == pytest.approx(float(surrogate(new)))
    assert float(info.surrogate_after) > 0
    longer = jnp.asarray(new) / cfg.backtrack_ratio  # the step tried before it broke the bound
    assert float(kl(longer)) > cfg.max_kl


def test_trpo_keeps_the_parameters_when_no_step_improves():
    surrogate = lambda x: jnp.dot(jnp.array([1.0, 0.0]), x) - 1e6 * jnp.sum(x**2)  # noqa: E731
    kl = lambda x: 0.5 * jnp.sum(x**2)  # noqa: E731
    params = jnp.array([0.0, 0.0])
    new, info = jax.jit(lambda p: trpo_step(surrogate, kl, p, TRPOConfig()))(params)
    assert not bool(info.accepted)
    np.testing.assert_array_equal(new, params)
    assert float(info.kl) == 0.0 and float(info.surrogate_after) == float(info.surrogate_before)


@pytest.mark.parametrize(
    "offset", [(0.009, 0.009), (0.011, 0.0), (0.0, -0.0101), (-0.0099, 0.0), (0.009, 0.0105)]
)
def test_nav2d_ends_an_episode_where_the_reference_does(offset):
    # cbfinn/maml_rl's point environment ends when |x| < 0.01 and |y| < 0.01 (a box, not a disc).
    action = np.array([0.5, -0.3])
    goal = 0.1 * action - np.asarray(offset)
    _, _, dones = numpy_point_env(goal, action[None])
    state = reset(jax.random.key(0), jnp.asarray(goal))
    _, _, _, done = step(state, jnp.asarray(action))
    assert bool(done) == bool(dones[0])


def test_each_batch_is_sampled_from_the_parameters_of_its_step():
    # Batch k of an adaptation (the last one: after the final step) must come from theta_k: it
    # is then likelier under theta_k than under any other theta_j (Gibbs' inequality, paired on
    # the same samples). Large rates make the thetas far apart.
    inner = InnerConfig(num_steps=2, lrs=(3.0, 3.0), num_rollouts=40)
    params = init_policy(jax.random.key(0), 2, 2, hidden=(8,))
    goal = sample_goals(jax.random.key(1), 1)[0]

    @jax.jit  # one compiled program, not op by op
    def sample_and_replay(params, key, goal):
        batches, adapted = adaptation_batches(NAV2D, policy_apply, params, key, goal, inner)
        path = [params]
        for k in range(inner.num_steps):
            adv = advantages(batches[k], inner.discount, normalize=inner.normalize)
            path.append(inner_step(policy_apply, path[-1], batches[k], adv, inner.lrs[k]))
        likelihood = jnp.array(
            [[jnp.sum(log_probs(policy_apply, theta, b) * b.mask) for theta in path]
             for b in batches]
        )  # fmt: skip
        return adapted, path, likelihood

    adapted, path, likelihood = sample_and_replay(params, jax.random.key(2), goal)
    chex.assert_trees_all_close(adapted, path[-1])
    likelihood = np.asarray(likelihood)
    assert likelihood.argmax(axis=1).tolist() == [0, 1, 2], likelihood


def test_trpo_damps_a_given_kl_hessian_product_as_its_own():
    # The cheaper product a caller passes (post_kl_fisher) gets the same damping as the
    # default one; with rllab's 1e-5 a missing damping went unseen, so damp heavily here.
    surrogate = lambda x: jnp.dot(jnp.array([1.0, -2.0, 0.5]), x)  # noqa: E731
    metric = jnp.array([[2.0, 0.3, 0.0], [0.3, 1.0, 0.1], [0.0, 0.1, 0.5]])
    kl = lambda x: 0.5 * jnp.dot(x, metric @ x)  # noqa: E731
    params, cfg = jnp.zeros(3), TRPOConfig(damping=1.0)
    default, _ = jax.jit(lambda p: trpo_step(surrogate, kl, p, cfg))(params)
    given, _ = jax.jit(
        lambda p: trpo_step(
            surrogate, kl, p, cfg, kl_hvp=lambda v: jax.jvp(jax.grad(kl), (p,), (v,))[1]
        )
    )(params)
    np.testing.assert_allclose(given, default, rtol=1e-10)


def test_the_post_update_return_is_the_discounted_return_from_the_first_step():
    cfg = InnerConfig(num_rollouts=4, discount=0.9)
    params = init_policy(jax.random.key(0), 2, 2, hidden=(8,))
    goal = sample_goals(jax.random.key(1), 1)[0]
    collect = jax.jit(collect_task_batch, static_argnums=(0, 1, 5, 6))
    batch = collect(NAV2D, policy_apply, params, jax.random.key(2), goal, cfg, 5)
    rewards, mask = np.asarray(batch.post.rewards), np.asarray(batch.post.mask)
    discounts = cfg.discount ** np.arange(rewards.shape[1])
    expected = np.mean(np.sum(discounts * rewards * mask, axis=1))
    assert float(batch.post_return) == pytest.approx(expected, rel=1e-10)
