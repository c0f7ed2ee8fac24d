"""The whole meta-iteration: every variant compiles once and runs; the adaptation evaluation."""

from __future__ import annotations

import chex
import jax
import numpy as np
import pytest

from metalearn.rl.envs import NAV2D, sample_goals
from metalearn.rl.inner import InnerConfig
from metalearn.rl.maml_rl import MAMLRLConfig, make_adaptation_eval, make_meta_iteration
from metalearn.rl.policy import init_policy, policy_apply
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


def test_adaptation_eval_returns_the_mean_return_of_each_step():
    inner = InnerConfig(num_steps=1, lrs=(0.0,), num_rollouts=5)
    evaluate = make_adaptation_eval(NAV2D, policy_apply, inner)
    goals = sample_goals(jax.random.key(1), 2)
    returns = np.asarray(evaluate(_params(), jax.random.key(2), goals))
    assert returns.shape == (2, 2) and np.all(returns < 0)
    # A zero inner rate leaves the policy unchanged: both columns estimate the same return.
    gap = np.abs(returns[:, 0] - returns[:, 1])
    assert np.all(gap < 0.5 * np.abs(returns[:, 0]))
