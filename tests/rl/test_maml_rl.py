"""The whole meta-iteration: every variant compiles once and runs; the adaptation evaluation."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from metalearn.rl.envs import NAV2D, sample_goals
from metalearn.rl.inner import InnerConfig
from metalearn.rl.maml_rl import (
    MAMLRLConfig,
    collect_meta_batch,
    make_adaptation_eval,
    make_meta_iteration,
    outer_update,
    surrogate_value_and_grad,
    trpo_objectives,
)
from metalearn.rl.policy import init_policy, policy_apply
from metalearn.rl.ppo import PPOConfig, clipped_surrogate
from metalearn.rl.trpo import TRPOConfig

SMALL = {"num_tasks": 3, "num_post_rollouts": 3, "trpo": TRPOConfig(cg_iters=3)}


def _params():
    return init_policy(jax.random.key(0), 2, 2, hidden=(8,))


@pytest.mark.parametrize(
    "overrides",
    [
        {"estimator": "dice", "outer": "trpo"},
        {"estimator": "maml", "outer": "trpo", "inner": InnerConfig(num_steps=2, lrs=(0.1, 0.05))},
        {"estimator": "lvc", "outer": "ppo"},
        {"estimator": "dice", "outer": "trpo", "inner": InnerConfig(num_steps=0, lrs=())},
    ],
    ids=["dice-trpo", "maml-trpo-2steps", "lvc-ppo", "pretrain-trpo"],
)
def test_meta_iteration_runs_and_changes_the_policy(overrides):
    overrides.setdefault("inner", InnerConfig(num_rollouts=3))
    init, iteration = make_meta_iteration(NAV2D, policy_apply, MAMLRLConfig(**SMALL, **overrides))
    state = init(_params())
    counted = chex.assert_max_traces(iteration.__wrapped__, n=1)
    step = jax.jit(counted)
    for i in range(2):
        new_state, metrics = step(state, jax.random.key(i))
        moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), new_state.params, state.params)
        assert max(float(m) for m in jax.tree.leaves(moved)) > 0.0
        assert np.isfinite(float(metrics["post_return"]))
        state = new_state
    chex.clear_trace_counter()


def test_bad_estimator_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="dice"):
        MAMLRLConfig(estimator="reinforce")
    with pytest.raises(ValueError, match="task_batching must be one of .*'vmap'.*got 'pmap'"):
        MAMLRLConfig(task_batching="pmap")


@pytest.mark.parametrize("outer", ["trpo", "ppo"])
def test_every_task_batching_takes_the_same_meta_iteration(outer):
    """vmap over the tasks, one loop over them, two loops side by side (of 2 and 3 tasks): the
    same samples, the same step (in float64, so that the comparison is tight)."""
    results = {}
    with jax.enable_x64(True):
        params = jax.tree.map(lambda x: x.astype(np.float64), _params())
        for strategy in ("vmap", "map", "map2"):
            cfg = MAMLRLConfig(
                num_tasks=5,
                num_post_rollouts=3,
                inner=InnerConfig(num_rollouts=3),
                outer=outer,
                trpo=TRPOConfig(cg_iters=3),
                task_batching=strategy,
            )
            init, iteration = make_meta_iteration(NAV2D, policy_apply, cfg)
            results[strategy] = iteration(init(params), jax.random.key(3))
    (state, metrics) = results["vmap"]
    moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), state.params, params)
    assert max(float(m) for m in jax.tree.leaves(moved)) > 1e-4  # a real step
    for strategy in ("map", "map2"):
        other_state, other_metrics = results[strategy]
        chex.assert_trees_all_close(other_state.params, state.params, rtol=1e-9, atol=1e-12)
        chex.assert_trees_all_close(other_metrics, metrics, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("estimator", ["lvc", "dice", "maml"])
def test_the_mean_of_the_tasks_gradients_is_the_gradient_of_the_mean_surrogate(estimator):
    params = _params()
    tasks = sample_goals(jax.random.key(1), 3)
    # compiled programs, not op by op
    collect = jax.jit(collect_meta_batch, static_argnums=(0, 1, 2))

    @functools.partial(jax.jit, static_argnums=0)
    def both_gradients(cfg, params, batch):
        surrogate, _ = trpo_objectives(policy_apply, cfg, batch)
        mean_of_gradients = surrogate_value_and_grad(policy_apply, cfg, batch)(params)
        return mean_of_gradients, jax.value_and_grad(surrogate)(params)

    for strategy in ("vmap", "map"):
        cfg = MAMLRLConfig(
            num_post_rollouts=3,
            inner=InnerConfig(num_rollouts=3),
            estimator=estimator,
            task_batching=strategy,
        )
        keys = jax.random.split(jax.random.key(2), 3)
        batch = collect(NAV2D, policy_apply, cfg, params, keys, tasks)
        (value, grads), (expected_value, expected) = both_gradients(cfg, params, batch)
        np.testing.assert_allclose(value, expected_value, rtol=1e-5, atol=1e-7)
        chex.assert_trees_all_close(grads, expected, rtol=1e-4, atol=1e-6)
        assert max(float(np.abs(g).max()) for g in jax.tree.leaves(grads)) > 1e-3


def test_a_ppo_epoch_ascends_the_gradient_of_the_mean_clipped_objective():
    # One epoch of SGD at rate 1: the update is the gradient the epoch took, which must be that
    # of the tasks' mean clipped objective (each task differentiated on its own).
    params = _params()
    cfg = MAMLRLConfig(
        num_post_rollouts=3,
        inner=InnerConfig(num_rollouts=3),
        outer="ppo",
        ppo=PPOConfig(num_epochs=1),
        task_batching="map",
    )
    keys = jax.random.split(jax.random.key(2), 3)
    # compiled programs, not op by op
    batch = jax.jit(collect_meta_batch, static_argnums=(0, 1, 2))(
        NAV2D, policy_apply, cfg, params, keys, sample_goals(jax.random.key(1), 3)
    )
    optimizer = optax.sgd(1.0)
    update = jax.jit(
        lambda p: outer_update(policy_apply, cfg, p, optimizer.init(p), optimizer, batch)
    )
    new, _, _ = update(params)

    def objective(p):
        one = lambda b: clipped_surrogate(policy_apply, p, b, cfg.inner, "lvc", cfg.ppo.clip)  # noqa: E731
        return jnp.mean(jax.vmap(one)(batch))

    expected = jax.jit(jax.grad(objective))(params)
    step = jax.tree.map(jnp.subtract, new, params)
    chex.assert_trees_all_close(step, expected, rtol=1e-4, atol=1e-4)
    assert max(float(np.abs(g).max()) for g in jax.tree.leaves(expected)) > 1e-3


def test_adaptation_eval_returns_the_mean_return_of_each_step():
    inner = InnerConfig(num_steps=1, lrs=(0.0,), num_rollouts=5)
    evaluate = make_adaptation_eval(NAV2D, policy_apply, inner)
    goals = sample_goals(jax.random.key(1), 2)
    returns = np.asarray(evaluate(_params(), jax.random.key(2), goals))
    for strategy in ("vmap", "map"):  # the tasks batched either way: the same returns
        other = make_adaptation_eval(NAV2D, policy_apply, inner, task_batching=strategy)
        np.testing.assert_allclose(other(_params(), jax.random.key(2), goals), returns, rtol=1e-5)
    assert returns.shape == (2, 2) and np.all(returns < 0)
    # A zero inner rate leaves the policy unchanged: both columns estimate the same return.
    gap = np.abs(returns[:, 0] - returns[:, 1])
    assert np.all(gap < 0.5 * np.abs(returns[:, 0]))


def _blowing_up_env():
    """A 2-D point that ends its episode once both coordinates pass 1 in size and whose state
    turns NaN two steps later (as a fallen Ant's physics did): only masked steps see NaN."""
    import jax.numpy as jnp

    from metalearn.rl.envs.base import Env

    def step(state, action):
        x, t, ended_at = state
        x = x + 0.5 + 0.1 * jnp.tanh(action)
        t = t + 1
        done = jnp.all(jnp.abs(x) > 1.0)
        ended_at = jnp.where(done & (ended_at < 0), t, ended_at)
        x = jnp.where((ended_at >= 0) & (t >= ended_at + 2), jnp.nan, x)
        return (x, t, ended_at), x, -jnp.sum(x**2), done

    return Env(
        reset=lambda key, task: (task + 0.0 * jax.random.normal(key, (2,)), 0, -1),
        observation=lambda state: state[0],
        step=step,
        sample_tasks=lambda key, n: jax.random.uniform(key, (n, 2), minval=-0.2, maxval=0.2),
        obs_dim=2,
        action_dim=2,
        horizon=12,
    )


def test_nan_after_an_episode_ends_reaches_no_metric_or_update():
    # Masked steps are recorded as zeros, so the blow-up after each episode's end cannot reach
    # the returns, the baseline fit, the advantages or the TRPO step; the valid steps are as
    # the environment gave them.
    env = _blowing_up_env()
    init, iteration = make_meta_iteration(env, policy_apply, MAMLRLConfig(**SMALL))
    state, metrics = iteration(init(_params()), jax.random.key(1))
    assert all(np.isfinite(float(v)) for v in jax.tree.leaves(metrics)), metrics
    assert bool(metrics["accepted"])
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(state.params))
    from metalearn.rl.rollout import rollout

    traj = rollout(env, policy_apply, _params(), jax.random.key(2), jax.numpy.zeros(2))
    mask = np.asarray(traj.mask)
    assert 0 < mask.sum() < env.horizon  # the episode ended inside the horizon
    assert np.all(np.isfinite(np.asarray(traj.obs))) and np.all(
        np.asarray(traj.obs)[mask == 0] == 0
    )
    x = np.zeros(2)  # the valid rewards, recomputed: the point moves by 0.5 + 0.1 tanh(a)
    for t in range(int(mask.sum())):
        x = x + 0.5 + 0.1 * np.tanh(np.asarray(traj.actions)[t])
        np.testing.assert_allclose(np.asarray(traj.rewards)[t], -np.sum(x**2), rtol=1e-5)
