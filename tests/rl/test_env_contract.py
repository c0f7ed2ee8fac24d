"""The environment contract (``metalearn.rl.envs.base.env_problem``): the library's environments
keep it, each way of breaking it in a researcher's environment is one line naming what broke,
and such an environment trains and evaluates through the command line."""

from __future__ import annotations

import json
import os
import textwrap
from typing import NamedTuple

import jax
import jax.numpy as jnp
import pytest

from metalearn.registry import OTHER_PARTS, user_code_error
from metalearn.rl.envs.base import ENVS, Env, env_problem, make_env, register_env
from tests.cli import RL_TINY, run_cli

LIBRARY_ENVS = sorted(n for n, f in ENVS.items() if f.__module__.startswith("metalearn."))


@pytest.fixture
def restored_envs():
    """The environments registered during a test are forgotten after it."""
    envs, parts = dict(ENVS), dict(OTHER_PARTS.get("data.env", {}))
    yield
    ENVS.clear(), ENVS.update(envs)
    OTHER_PARTS["data.env"] = parts


@pytest.mark.parametrize("name", LIBRARY_ENVS)
def test_the_librarys_environments_keep_the_contract(name):
    if name in ("cheetah_dir", "cheetah_vel", "ant_dir"):
        pytest.importorskip("brax", reason="the locomotion extra: pip install -e '.[locomotion]'")
    assert env_problem(ENVS[name]()) is None


class Point(NamedTuple):
    position: jax.Array
    goal: jax.Array


def _step(state, action):
    position = state.position + 0.1 * action
    return Point(position, state.goal), position, -jnp.sum((position - state.goal) ** 2), False


GOOD = Env(
    reset=lambda key, goal: Point(jnp.zeros(2), goal),
    observation=lambda state: state.position,
    step=_step,
    sample_tasks=lambda key, num: jax.random.uniform(key, (num, 2)),
    obs_dim=2,
    action_dim=2,
    horizon=5,
)


def _step_returning(**changes):
    def step(state, action):
        new, obs, reward, done = _step(state, action)
        parts = {"state": new, "obs": obs, "reward": reward, "done": done, **changes}
        parts = {k: (v(state) if callable(v) else v) for k, v in parts.items()}
        return parts["state"], parts["obs"], parts["reward"], parts["done"]

    return step


BROKEN = {
    "observation of another shape": (
        GOOD._replace(observation=lambda s: jnp.concatenate([s.position, s.goal])),
        "its observation has shape (4,), not (obs_dim,) = (2,)",
    ),
    "obs_dim that is not the observation's": (
        GOOD._replace(obs_dim=3),
        "its observation has shape (2,), not (obs_dim,) = (3,)",
    ),
    "horizon 0": (GOOD._replace(horizon=0), "its horizon must be an integer >= 1, got 0"),
    "action_dim as a float": (
        GOOD._replace(action_dim=2.0),
        "its action_dim must be an integer >= 1, got 2.0",
    ),
    "tasks without the task axis": (
        GOOD._replace(sample_tasks=lambda key, num: jax.random.uniform(key, (2,))),
        "sample_tasks(key, 3) gave leaves of shapes [(2,)]; it must give the 3 tasks stacked",
    ),
    "a step of three values": (
        GOOD._replace(step=lambda s, a: _step(s, a)[:3]),
        "step(state, action) returned (Point(position=(2,), goal=(2,)), (2,), ()), not (state, "
        "obs, reward, done)",
    ),
    "a reward per coordinate": (
        GOOD._replace(step=_step_returning(reward=lambda s: -jnp.abs(s.position - s.goal))),
        "step's reward has shape (2,): it must be a scalar per step",
    ),
    "done per coordinate": (
        GOOD._replace(step=_step_returning(done=lambda s: s.position > 1)),
        "step's done has shape (2,): it must be a scalar per step",
    ),
    "a state that grows": (
        GOOD._replace(
            step=_step_returning(state=lambda s: Point(jnp.concatenate([s.position] * 2), s.goal))
        ),
        "step(state, action) returned a state Point(position=(4,), goal=(2,)) unlike reset's "
        "Point(position=(2,), goal=(2,))",
    ),
    "an observation from step of another shape": (
        GOOD._replace(step=_step_returning(obs=lambda s: s.position[:1])),
        "step's observation has shape (1,), not (2,)",
    ),
    "a factory that returns a tuple": (tuple(GOOD), "its factory returned a tuple, not a"),
}


def test_the_good_environment_keeps_the_contract():
    assert env_problem(GOOD) is None


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_broken_contract_is_named(case):
    env, expected = BROKEN[case]
    problem = env_problem(env)
    assert problem is not None and problem.startswith(expected), problem


def test_a_researchers_environment_is_checked_when_built_and_its_errors_name_their_line(
    restored_envs,
):
    register_env("contract_test_obs_dim")(lambda: GOOD._replace(obs_dim=3))
    with pytest.raises(ValueError, match=r"^data.env=contract_test_obs_dim: its observation"):
        make_env("contract_test_obs_dim")

    def broken_step(state, action):
        return undefined_name  # noqa: F821

    register_env("contract_test_name_error")(lambda: GOOD._replace(step=broken_step))
    with pytest.raises(NameError) as err:
        make_env("contract_test_name_error")
    message = user_code_error(err.value)
    assert message is not None and "in your code:" in message and __file__ in message
    assert "in broken_step" in message


def test_a_name_already_registered_is_refused(restored_envs):
    with pytest.raises(ValueError, match="data.env=nav2d is already registered by metalearn"):
        register_env("nav2d")(lambda: GOOD)
    assert make_env("nav2d").obs_dim == 2  # still the library's


LINE_ENV = textwrap.dedent(
    """
    from typing import NamedTuple

    import jax
    import jax.numpy as jnp

    from metalearn.rl.envs import Env, register_env


    class LineState(NamedTuple):
        position: jax.Array
        goal: jax.Array


    def step(state, action):
        position = state.position + 0.1 * jnp.clip(action, -1.0, 1.0)
        distance = jnp.abs(position - state.goal)[0]
        return LineState(position, state.goal), position, -distance, distance < 0.01


    @register_env("line1d")
    def line1d():
        return Env(
            reset=lambda key, goal: LineState(jnp.zeros(1), goal),
            observation=lambda state: state.position,
            step=step,
            sample_tasks=lambda key, num: jax.random.uniform(key, (num, 1), minval=-1, maxval=1),
            obs_dim=OBS_DIM,
            action_dim=1,
            horizon=10,
        )
    """
)


def _plugin(tmp_path, obs_dim: int) -> dict:
    (tmp_path / "line_env.py").write_text(LINE_ENV.replace("OBS_DIM", str(obs_dim)))
    return {"METALEARN_PLUGINS": "line_env", "PYTHONPATH": str(tmp_path)}


def test_a_researchers_environment_trains_and_evaluates_from_the_command_line(tmp_path):
    env = {**os.environ, **_plugin(tmp_path, obs_dim=1)}
    run = tmp_path / "run"
    result = run_cli(*RL_TINY, "data.env=line1d", f"hydra.run.dir={run}", env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    records = json.loads((run / "eval.json").read_text())
    assert sorted(r["steps"] for r in records) == [0, 1, 2, 3]
    assert all(r["metric"] == "return" and -20.0 <= r["mean"] <= 0.0 for r in records)
    out = tmp_path / "again.json"
    result = run_cli(str(run), "--out", str(out), module="metalearn.evaluate", env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert [r["mean"] for r in json.loads(out.read_text())] == [r["mean"] for r in records]


def test_a_researchers_broken_environment_is_one_line_before_the_run(tmp_path):
    env = {**os.environ, **_plugin(tmp_path, obs_dim=2)}
    result = run_cli(*RL_TINY, "data.env=line1d", f"hydra.run.dir={tmp_path / 'run'}", env=env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: data.env=line1d: its observation has shape (1,), not (obs_dim,) = (2,); see "
        "docs/extending.md (an RL environment)"
    ]
    checkpoints = tmp_path / "run" / "checkpoints"
    assert not checkpoints.exists() or not any(p.name.isdigit() for p in checkpoints.iterdir())


def test_python_numbers_as_reward_and_done_roll_out():
    # A constant reward written as a Python float passed the contract and then failed in the
    # rollout: "AttributeError: 'float' object has no attribute 'dtype'".
    from metalearn.rl.policy import init_policy, policy_apply
    from metalearn.rl.rollout import rollout

    env = GOOD._replace(step=lambda s, a: (*_step(s, a)[:2], -1.0, False))
    assert env_problem(env) is None
    params = init_policy(jax.random.key(0), env.obs_dim, env.action_dim)
    traj = rollout(env, policy_apply, params, jax.random.key(1), jnp.array([0.5, 0.5]))
    assert traj.rewards.tolist() == [-1.0] * env.horizon and traj.mask.tolist() == [1.0] * 5
