"""The PyTorch MAML-RL peer (scripts/bench_rl_torch.py) computes what metalearn computes.

Checked against metalearn's own functions: the NumPy environment step by step, a rollout's
early termination and mask, and, fed the same weights and the same sampled rollouts, the
advantages, the inner-step adapted parameters, the meta-gradient, the KL Fisher-vector product
and the whole TRPO step.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.rl.envs import NAV2D
from metalearn.rl.estimators import adapted_params, collect_task_batch, meta_surrogate, post_kl
from metalearn.rl.inner import InnerConfig
from metalearn.rl.policy import init_policy, policy_apply
from metalearn.rl.rollout import rollout
from metalearn.rl.trpo import TRPOConfig, fisher_vector_product, trpo_step

REL32 = 3e-4
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch is an optional extra for the benchmark peers: pip install torch==2.13.0 "
    "(the CPU build), then pip install -e '.[bench]'",
)


@pytest.fixture(scope="module")
def peer():
    import sys

    sys.path.insert(0, str(SCRIPTS))
    try:
        import bench_rl_torch
    finally:
        sys.path.remove(str(SCRIPTS))
    return bench_rl_torch


def to_torch(params, torch):
    leaves = [x for layer in params["layers"] for x in (layer["w"], layer["b"])]
    return [torch.tensor(np.asarray(x)).requires_grad_() for x in [*leaves, params["log_std"]]]


def flat_jax(tree) -> np.ndarray:
    leaves = [x for layer in tree["layers"] for x in (layer["w"], layer["b"])]
    return np.concatenate([np.asarray(x).ravel() for x in [*leaves, tree["log_std"]]])


def flat_torch(tensors) -> np.ndarray:
    return np.concatenate([t.detach().numpy().ravel() for t in tensors])


def assert_close(actual: np.ndarray, expected: np.ndarray, rel: float) -> None:
    """Every entry within ``rel`` times the largest magnitude of ``expected``."""
    scale = float(np.max(np.abs(expected)))
    assert scale > 0
    err = float(np.max(np.abs(np.asarray(actual) - np.asarray(expected))))
    assert err <= rel * scale, f"max |diff| {err:.3g} > {rel:g} x {scale:.3g}"


def test_env_equals_metalearn_step_by_step(peer):
    rng = np.random.default_rng(0)
    goals = np.array([[0.3, -0.2], [0.0, 0.0], [-0.45, 0.5], [0.1, 0.1]], np.float32)
    actions = (3.0 * rng.standard_normal((100, len(goals), 2))).astype(np.float32)
    actions[:3, 3] = [1.0, 1.0]  # the last goal is reached in one step (done)
    env = peer.Nav2dEnv(goals, len(goals))
    env.reset()
    state = jax.vmap(NAV2D.reset, in_axes=(None, 0))(jax.random.key(0), jnp.asarray(goals))
    step = jax.jit(jax.vmap(NAV2D.step))
    clipped = dones = 0
    for action in actions:
        obs, reward, done = env.step(action)
        state, jobs, jreward, jdone = step(state, jnp.asarray(action))
        np.testing.assert_allclose(obs, np.asarray(jobs), rtol=0, atol=1e-7)
        np.testing.assert_allclose(reward, np.asarray(jreward), rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(done, np.asarray(jdone))
        clipped += int(np.sum(np.abs(action) > 1.0))
        dones += int(done.sum())
    assert clipped > 100 and dones >= 1  # both branches were exercised


def test_rollout_terminates_and_masks_like_metalearn(peer):
    import torch

    params = init_policy(jax.random.key(0), 2, 2)
    params["layers"][-1]["w"] = jnp.zeros((100, 2))
    params["layers"][-1]["b"] = jnp.array([1.0, 1.0])  # every action (1, 1): a move of 0.1
    params["log_std"] = jnp.full(2, -30.0)  # no noise
    goal = np.array([0.3, 0.3], np.float32)  # reached after three steps
    traj = rollout(NAV2D, policy_apply, params, jax.random.key(1), jnp.asarray(goal))
    batch = peer.sample_rollouts(to_torch(params, torch), goal, 2, np.random.default_rng(0))
    expected = np.zeros(100)
    expected[:3] = 1.0
    np.testing.assert_array_equal(np.asarray(traj.mask), expected)
    for row in range(2):
        np.testing.assert_array_equal(batch.mask[row].numpy(), expected)
        valid = slice(0, 3)
        np.testing.assert_allclose(batch.obs[row, valid], np.asarray(traj.obs)[valid], atol=1e-7)
        np.testing.assert_allclose(
            batch.rewards[row, valid], np.asarray(traj.rewards)[valid], atol=1e-6
        )
    assert int(batch.mask.any(0).sum()) == 3  # the peer stopped stepping once all had ended


# (precision, relative tolerance): float64 on both sides agrees to rounding; in float32 the
# baseline's ridge solve (features up to t^3, regulariser 1e-5) is ill-conditioned enough that the
# two libraries' solvers differ in the fourth or fifth digit, with the torch build: 1.4e-4 of the
# advantages' scale with torch 2.13.0+cpu as installed 2026-11-24 20:33 (this bound was 1e-4,
# met by the build before; CI has no torch and skips these tests).
PRECISIONS = {"float64": 1e-9, "float32": REL32}


@pytest.fixture(scope="module", params=list(PRECISIONS))
def shared(peer, request):
    """Three tasks sampled by metalearn; the peer is fed the same rollouts and weights."""
    x64 = request.param == "float64"
    with jax.enable_x64(x64):
        return dict(collect(peer), x64=x64, rel=PRECISIONS[request.param])


def collect(peer) -> dict:
    import torch

    inner = InnerConfig()
    params = init_policy(jax.random.key(0), 2, 2)
    goals = NAV2D.sample_tasks(jax.random.key(1), 3)
    keys = jax.random.split(jax.random.key(2), 3)
    batches = [
        collect_task_batch(NAV2D, policy_apply, params, k, g, inner, 20)
        for k, g in zip(keys, goals, strict=True)
    ]
    tparams = to_torch(params, torch)
    cfg = peer.PeerConfig(num_tasks=3)

    def to_batch(traj):
        return peer.Batch(*(torch.tensor(np.asarray(x)) for x in traj))

    tasks = []
    for b in batches:
        pre = to_batch(b.pre[0])
        pre_adv, adapted = peer.inner_update(tparams, pre, cfg)
        tasks.append(peer.task_data(pre, pre_adv, adapted, to_batch(b.post), cfg))
    return dict(inner=inner, params=params, batches=batches, tparams=tparams, cfg=cfg, tasks=tasks)


def test_advantages_and_adapted_params_match(peer, shared):
    with jax.enable_x64(shared["x64"]):
        check_adaptation(peer, shared, shared["rel"])


def check_adaptation(peer, shared, rel: float) -> None:
    # Compiled as programs, not op by op: the subject is the values, not eager execution.
    adapt = jax.jit(lambda p, b: adapted_params(policy_apply, p, b, shared["inner"], "lvc"))
    for b, data in zip(shared["batches"], shared["tasks"], strict=True):
        assert_close(data.pre_adv.numpy(), np.asarray(b.pre_adv[0]), rel)
        assert_close(data.post_adv.numpy(), np.asarray(b.post_adv), rel)
        assert_close(data.post_logp.numpy(), np.asarray(b.post_logp), rel)
        path = adapt(shared["params"], b)
        _, adapted = peer.inner_update(shared["tparams"], data.pre, shared["cfg"])
        assert_close(flat_torch(adapted), flat_jax(path[-1]), rel)
        assert np.max(np.abs(flat_jax(path[-1]) - flat_jax(shared["params"]))) > 1e-3  # it moved


def objectives(shared):
    def over_tasks(fn):
        return lambda p: jnp.mean(jnp.stack([fn(p, b) for b in shared["batches"]]))

    inner = shared["inner"]
    surrogate = over_tasks(lambda p, b: meta_surrogate(policy_apply, p, b, inner, "lvc"))
    kl = over_tasks(lambda p, b: post_kl(policy_apply, p, b, inner, "lvc"))
    return surrogate, kl


def test_meta_gradient_and_fisher_vector_product_match(peer, shared):
    with jax.enable_x64(shared["x64"]):
        check_meta_gradient(peer, shared, shared["rel"])


def check_meta_gradient(peer, shared, rel: float) -> None:
    import torch

    surrogate, kl = objectives(shared)
    params = shared["params"]
    value, grads, fvp = peer.natural_gradient_parts(
        shared["tparams"], shared["tasks"], shared["cfg"]
    )
    # at the sampling parameters the surrogate is the mean of sum_t A_t, nearly 0 by the baseline's
    # fit: compare on the scale of the summed terms (mean over rollouts of sum_t |A_t|), not
    # relative to the tiny mean
    scale = np.mean([np.sum(np.abs(b.post_adv * b.post.mask), -1) for b in shared["batches"]])
    own_value, own_grads = jax.jit(jax.value_and_grad(surrogate))(params)
    assert abs(float(value.detach()) - float(own_value)) <= rel * scale
    assert_close(grads.numpy(), flat_jax(own_grads), rel)
    v = jax.tree.map(lambda x: jnp.cos(jnp.arange(x.size, dtype=x.dtype).reshape(x.shape)), params)
    expected = jax.jit(lambda p, v: fisher_vector_product(kl, p, v, damping=1e-5))(params, v)
    assert_close(fvp(torch.tensor(flat_jax(v))).numpy(), flat_jax(expected), rel)


def test_trpo_step_matches(peer, shared):
    with jax.enable_x64(shared["x64"]):
        check_trpo(peer, shared, shared["rel"])


def check_trpo(peer, shared, rel: float) -> None:
    surrogate, kl = objectives(shared)
    new, info = trpo_step(surrogate, kl, shared["params"], TRPOConfig())
    tnew, tinfo = peer.trpo_step(shared["tparams"], shared["tasks"], shared["cfg"])
    assert bool(info.accepted) and tinfo["accepted"]
    assert tinfo["backtracks"] == int(info.backtracks)
    step = flat_jax(new) - flat_jax(shared["params"])
    # float32: CG (damping 1e-5) amplifies the rounding differences of two solvers of the
    # baseline's ridge system (metalearn's Cholesky in lax loops, torch's LU) to 4e-3 (torch
    # build before) and 8.8e-3 (2.13.0+cpu as installed 2026-11-24 20:33) of the step; in
    # float64 the two agree within this bound too (5e-8 of the step)
    assert_close(flat_torch(tnew) - flat_torch(shared["tparams"]), step, 50 * rel)
