"""Locomotion task families on Brax: rewards against the physics state, task distributions,
batching over tasks, termination. Short horizons keep the compile times small."""

from __future__ import annotations

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("brax", reason="the locomotion extra: pip install -e '.[locomotion]'")

from metalearn.rl.envs import BATCHED_LINALG_ENVS, ENVS, make_env  # noqa: E402
from metalearn.rl.envs.locomotion import (  # noqa: E402
    DEFAULT_BACKEND,
    MASS_MATRIX_SIZE,
    brax_env,
    make_locomotion_env,
    sample_directions,
    sample_velocities,
)
from metalearn.rl.policy import init_policy, policy_apply  # noqa: E402
from metalearn.rl.rollout import rollout  # noqa: E402
from tests.cli import checkout_env, finished, run_cli  # noqa: E402

STEPS = 6
# The original (rllab) coefficients, written out again: control cost, survive bonus.
COSTS = {"cheetah_dir": (0.05, 0.0), "cheetah_vel": (0.05, 0.0), "ant_dir": (0.005, 0.05)}
ROBOT = {"cheetah_dir": "halfcheetah", "cheetah_vel": "halfcheetah", "ant_dir": "ant"}


def scripted(env, key, task, actions):
    """Step ``env`` through ``actions`` from ``reset(key, task)``; root q, rewards, dones."""

    def body(state, action):
        state, obs, reward, done = env.step(state, action)
        return state, (state.pipeline_state.q, obs, reward, done)

    start = env.reset(key, task)
    _, (q, obs, rewards, dones) = jax.lax.scan(body, start, actions)
    return start.pipeline_state.q, q, obs, rewards, dones


@functools.cache
def scripted_runner(name: str):
    """The family's environment and its jitted :func:`scripted` (compiled once per module)."""
    env = make_locomotion_env(name, horizon=STEPS)
    return env, jax.jit(lambda key, task, actions: scripted(env, key, task, actions))


@pytest.fixture(params=sorted(COSTS))
def family(request):
    return (request.param, *scripted_runner(request.param))


def test_registered_names_build_the_families():
    assert {"cheetah_dir", "cheetah_vel", "ant_dir", "nav2d"} <= set(ENVS)
    env = make_env("cheetah_dir")
    assert (env.obs_dim, env.action_dim, env.horizon) == (17, 6, 200)


def test_bad_names_and_backends_are_refused():
    with pytest.raises(ValueError, match="locomotion env must be one of"):
        make_locomotion_env("cheetah_sideways")
    with pytest.raises(ValueError, match="backend must be one of"):
        make_locomotion_env("cheetah_dir", backend="bullet")


def test_reward_is_the_task_reward_of_the_root_displacement(family):
    name, env, run = family
    brax = brax_env(ROBOT[name], DEFAULT_BACKEND)
    dt = float(brax.dt)
    assert dt == pytest.approx(0.05)  # simulated seconds per step: timestep x frame skip
    ctrl, survive = COSTS[name]
    # Actions partly outside the control range [-1, 1]: the cost is on the clipped action.
    actions = 1.5 * jax.random.uniform(jax.random.key(3), (STEPS, env.action_dim), minval=-1)
    clipped = np.clip(np.asarray(actions), -1.0, 1.0)
    for task in [-1.0, 1.0] if name.endswith("dir") else [0.3, 1.7]:
        q0, q, _, rewards, _ = map(np.asarray, run(jax.random.key(1), jnp.array(task), actions))
        x = np.concatenate([q0[None, 0], q[:, 0]])  # root x: a slide or free joint's first q
        velocity = np.diff(x) / dt
        task_term = task * velocity if name.endswith("dir") else -np.abs(velocity - task)
        expected = task_term - ctrl * np.sum(clipped**2, axis=1) + survive
        np.testing.assert_allclose(rewards, expected, rtol=1e-4, atol=1e-4)


def test_clipping_happens_before_the_physics(family):
    _, env, run = family
    # Both strongly typed float32, like the other tests' actions: one compiled program.
    big = jnp.full((STEPS, env.action_dim), 3.0, jnp.float32)
    one = jnp.ones((STEPS, env.action_dim), jnp.float32)
    key = jax.random.key(2)
    pairs = zip(run(key, jnp.array(1.0), big), run(key, jnp.array(1.0), one), strict=True)
    for a, b in pairs:
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_observations_are_finite_positions_and_velocities(family):
    name, env, run = family
    actions = jax.random.normal(jax.random.key(4), (STEPS, env.action_dim))
    _, q, obs, _, _ = map(np.asarray, run(jax.random.key(5), jnp.array(1.0), actions))
    assert obs.shape == (STEPS, env.obs_dim) and np.all(np.isfinite(obs))
    skip = 1 if ROBOT[name] == "halfcheetah" else 2  # root x (and y) are left out
    np.testing.assert_allclose(obs[:, : q.shape[1] - skip], q[:, skip:], rtol=1e-6)


def test_opposite_directions_share_the_physics():
    _, run = scripted_runner("cheetah_dir")
    actions = jax.random.uniform(jax.random.key(6), (STEPS, 6), minval=-1)
    key = jax.random.key(7)
    (_, q_fwd, _, r_fwd, _) = run(key, jnp.array(1.0), actions)
    (_, q_bwd, _, r_bwd, _) = run(key, jnp.array(-1.0), actions)
    np.testing.assert_array_equal(q_fwd, q_bwd)
    ctrl = 0.05 * np.sum(np.asarray(actions) ** 2, axis=1)
    np.testing.assert_allclose(r_fwd + r_bwd, -2 * ctrl, rtol=1e-5, atol=1e-5)


def test_ant_ends_when_the_torso_leaves_the_healthy_height():
    env = make_locomotion_env("ant_dir", horizon=STEPS)
    brax = brax_env("ant", DEFAULT_BACKEND)
    state = jax.jit(env.reset)(jax.random.key(0), jnp.array(1.0))
    q = state.pipeline_state.q.at[2].set(3.0)  # torso 3 m up: above the range [0.2, 1.0]
    high = state._replace(pipeline_state=jax.jit(brax.pipeline_init)(q, state.pipeline_state.qd))
    step = jax.jit(env.step)
    assert bool(step(high, jnp.zeros(8))[3])
    assert not bool(step(state, jnp.zeros(8))[3])


@pytest.mark.parametrize("name", ["ant_dir", "cheetah_dir"])
def test_a_step_into_a_non_finite_state_ends_the_episode_and_earns_nothing(name):
    # Brax's physics can blow up (a fallen Ant's did, after its episode had ended): such a step
    # is the last of its episode and its reward is 0, not NaN.
    env = make_locomotion_env(name, horizon=STEPS)
    brax = brax_env(ROBOT[name], DEFAULT_BACKEND)
    state = jax.jit(env.reset)(jax.random.key(0), jnp.array(1.0))
    qd = state.pipeline_state.qd.at[0].set(jnp.nan)
    broken = state._replace(pipeline_state=jax.jit(brax.pipeline_init)(state.pipeline_state.q, qd))
    _, obs, reward, done = jax.jit(env.step)(broken, jnp.zeros(env.action_dim))
    assert not np.all(np.isfinite(np.asarray(obs)))
    assert bool(done) and float(reward) == 0.0


def test_task_distributions():
    n = 20_000
    d = np.asarray(sample_directions(jax.random.key(0), n))
    assert set(np.unique(d)) == {-1.0, 1.0}
    assert abs(np.mean(d == 1.0) - 0.5) < 4 * np.sqrt(0.25 / n)
    v = np.asarray(sample_velocities(jax.random.key(1), n))
    assert v.min() >= 0.0 and v.max() <= 2.0
    # Uniform on [0, 2]: every fifth of the interval holds a fifth of the draws.
    counts = np.histogram(v, bins=5, range=(0.0, 2.0))[0] / n
    np.testing.assert_allclose(counts, 0.2, atol=4 * np.sqrt(0.2 * 0.8 / n))


def test_vmap_over_tasks_equals_a_loop_and_jits():
    """In float64: in float32 the batched and the single program round differently, and the
    contact dynamics amplify it (1e-4 apart after 6 steps, where float64 agrees to 1e-12)."""
    with jax.enable_x64(True):
        env = make_locomotion_env("cheetah_vel", horizon=STEPS)
        params = init_policy(jax.random.key(0), env.obs_dim, env.action_dim, hidden=(16,))
        params = jax.tree.map(lambda x: x.astype(jnp.float64), params)
        tasks = env.sample_tasks(jax.random.key(1), 3)
        keys = jax.random.split(jax.random.key(2), 3)
        one = jax.jit(lambda k, t: rollout(env, policy_apply, params, k, t))
        batched = jax.jit(jax.vmap(lambda k, t: rollout(env, policy_apply, params, k, t)))(
            keys, tasks
        )
        assert batched.obs.dtype == jnp.float64
        for i in range(3):
            single = one(keys[i], tasks[i])
            for field in ("obs", "actions", "rewards", "mask"):
                np.testing.assert_allclose(
                    getattr(batched, field)[i], getattr(single, field), rtol=1e-9, atol=1e-10
                )
        assert np.all(np.isfinite(np.asarray(batched.obs)))


def test_building_an_env_leaves_no_log_file_and_prints_nothing(tmp_path):
    # MuJoCo, left to itself, writes MUJOCO_LOG.TXT into the working directory (its compiler
    # warns about Brax's models) and prints "Failed to import warp" when its GPU backend is absent.
    code = (
        "import logging, mujoco\n"
        "logging.basicConfig(level=logging.INFO)  # as train's log: root INFO lines would show\n"
        "logging.getLogger('jax._src.xla_bridge').setLevel(logging.WARNING)  # as train does\n"
        "from metalearn.rl.envs.locomotion import make_locomotion_env\n"
        "env = make_locomotion_env('ant_dir', horizon=5)\n"
        "assert mujoco.get_mju_user_warning() is None  # MuJoCo's own handler is back\n"
    )
    result = finished([sys.executable, "-c", code], 600, cwd=tmp_path, env=checkout_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == ""
    # Nor Brax's "not actively being maintained" UserWarning, nor MJX's root-logger INFO line.
    assert result.stderr == ""
    assert list(tmp_path.iterdir()) == []


def test_registered_linear_system_sizes_are_the_robots_mass_matrices():
    for robot, size in MASS_MATRIX_SIZE.items():
        assert brax_env(robot, "generalized").sys.qd_size() == size
    assert BATCHED_LINALG_ENVS == {"cheetah_dir": 9, "cheetah_vel": 9, "ant_dir": 14}


def test_a_device_batch_that_would_deadlock_is_refused_in_one_line(tmp_path):
    # On two XLA:CPU devices, 5 Ant tasks x 15 rollouts per device (75 mass matrices in one
    # batched solve) hung in the first meta-iteration with no step done in 240 s; 5 x 14 (70)
    # ran (experiments/rl/locomotion/README.md). The run is refused before it compiles.
    tiny = ["data.horizon=5", "trainer.meta_batch_size=10", "trainer.meta_steps=1"]
    env = {"JAX_NUM_CPU_DEVICES": "2", "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}
    result = run_cli(
        "+experiment=rl_ant_dir_maml",
        *tiny,
        "data.rollouts=15",
        "algorithm.post_rollouts=15",
        f"hydra.run.dir={tmp_path / 'run'}",
        env={**os.environ, **env},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(
        "error: ant_dir on 2 XLA:CPU devices: each would step 75 rollouts at once (5 tasks x 15)"
    ), lines
    assert "Traceback" not in result.stderr
    # Refused before anything is written: no checkpoint store, no record of a run.
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
