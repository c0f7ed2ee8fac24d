"""MAML-RL through the Hydra runner: outputs, exact resume, sweeps, the baselines, bad input,
and the probes' loader of a run's policy."""

from __future__ import annotations

import dataclasses
import json
import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from omegaconf import OmegaConf

from metalearn.algorithms.base import TaskContext, context
from metalearn.config import to_objects
from metalearn.data.task import Task
from metalearn.rl.algorithm import MAMLRLAlgorithmConfig, meta_rl_config
from metalearn.rl.family import RLTasksConfig
from metalearn.rl.inner import InnerConfig
from metalearn.rl.probe import adaptation_rollouts, load_trained_policy, probe_tasks
from metalearn.rl.rollout import episode_returns
from metalearn.rl.trpo import TRPOConfig
from metalearn.runner.checkpoints import CheckpointStore
from metalearn.runner.loop import train_and_evaluate
from metalearn.runner.steps import trained
from tests.cli import RL_TINY, error_line, run_cli
from tests.conftest import compose_config, experiment_of, restore_latest_state

# The probes' streams, fixed for every version (a run's probes pair with an older run's task by
# task): metalearn.rl.probe's PROBE_TASKS_SEED and PROBE_KEYS_SEED, stated here, not imported.
PROBE_TASKS_SEED, PROBE_KEYS_SEED = 20261124, 7


def documented_probe_tasks(num: int) -> tuple[np.ndarray, list]:
    """What probe_tasks must return by its definition. The goals, computed apart from it and
    from nav2d's sampler: uniform in [-0.5, 0.5]^2 from the raw 32-bit stream of the key of
    PROBE_TASKS_SEED (23 random mantissa bits under exponent 0 give a float32 in [1, 2); less 1,
    times the width 1, plus the low end -0.5). The keys, as raw key data: the split of the key
    of PROBE_KEYS_SEED, the definition itself (a split has no simpler form)."""
    bits = np.asarray(jax.random.bits(jax.random.key(PROBE_TASKS_SEED), (num, 2), jnp.uint32))
    unit = ((bits >> np.uint32(9)) | np.uint32(0x3F800000)).view(np.float32) - np.float32(1)
    goals = unit * np.float32(1.0) + np.float32(-0.5)
    keys = jax.random.key_data(jax.random.split(jax.random.key(PROBE_KEYS_SEED), num))
    return goals, np.asarray(keys).tolist()


def rl_config(*overrides: str):
    return to_objects(compose_config([*RL_TINY, *overrides]))


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """One tiny run from the command line, as a user starts it: 4 meta-iterations of 2 tasks."""
    run_dir = tmp_path_factory.mktemp("rl") / "run"
    result = run_cli(*RL_TINY, "trainer.eval_every=0", f"hydra.run.dir={run_dir}", timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return run_dir


def test_cli_run_writes_the_return_after_0_to_3_inner_steps(cli_run):
    records = json.loads((cli_run / "eval.json").read_text())
    assert [(r["metric"], r["steps"]) for r in records] == [("return", k) for k in range(4)]
    # nav2d's reward is minus a distance within the unit square's reach: -1.5 to 0 per step.
    assert all(r["tasks"] == 4 and -150.0 < r["mean"] < 0.0 and r["ci95"] > 0 for r in records)
    lines = [json.loads(x) for x in (cli_run / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if x["split"] == "train"]
    assert [x["step"] for x in train] == [2, 4]
    config = OmegaConf.load(cli_run / "config.yaml")
    assert (config.algorithm.estimator, config.algorithm.outer) == ("lvc", "trpo")
    # TRPO's accepted steps keep the KL bound.
    assert all(0.0 <= x["train/kl"] <= config.algorithm.max_kl + 1e-6 for x in train)
    assert all(np.isfinite(x["train/post_return"]) for x in train)
    assert any((cli_run / "tensorboard").iterdir())
    assert CheckpointStore(str(cli_run / "checkpoints"), 2).latest_step() == 4
    # trainer.task_batching: auto loops over an RL family's tasks on a CPU (vmap elsewhere)
    summary = json.loads((cli_run / "summary.json").read_text())
    assert summary["task_batching"] == ("map" if jax.default_backend() == "cpu" else "vmap")
    assert summary["meta_params_changed"] is True


def test_a_run_whose_trpo_steps_are_never_accepted_says_so(tmp_path, caplog):
    """A step scaled to a KL bound of 1e30 with no backtracking fails the line search every time:
    the run trains nothing, and says so instead of ending silently untrained."""
    cfg = rl_config(
        "trainer.eval_every=0",
        "trainer.meta_steps=2",
        "algorithm.max_kl=1e30",
        "algorithm.max_backtracks=0",
    )
    with caplog.at_level("WARNING", logger="metalearn"):
        summary = train_and_evaluate(cfg, str(tmp_path))
    assert summary["meta_params_changed"] is False
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(
        w.startswith("the meta-parameters after step 2 are exactly those of step 0")
        and "check algorithm.max_kl (TRPO)" in w
        for w in warnings
    ), warnings
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["train/accepted"] for x in lines if x["split"] == "train"] == [0.0]


def test_resumed_run_equals_the_uninterrupted_one(cli_run, tmp_path):
    cfg = rl_config("trainer.eval_every=0", "trainer.allow_changes=[trainer.meta_steps]")
    train_and_evaluate(rl_config("trainer.eval_every=0", "trainer.meta_steps=2"), str(tmp_path))
    train_and_evaluate(cfg, str(tmp_path))
    straight = restore_latest_state(str(cli_run), cfg)
    resumed = restore_latest_state(str(tmp_path), cfg)
    assert int(straight.step) == int(resumed.step) == 4
    for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(a, b)
    assert json.loads((tmp_path / "eval.json").read_text()) == json.loads(
        (cli_run / "eval.json").read_text()
    )


def test_random_baseline_evaluates_the_initialisation_maml_starts_from(tmp_path):
    cfg = rl_config("trainer.meta_steps=0")
    summary = train_and_evaluate(cfg, str(tmp_path))
    assert summary["step"] == 0 and not summary["interrupted"]
    assert [r["steps"] for r in summary["eval"]] == [0, 1, 2, 3]
    maml_start = experiment_of(rl_config()).initial_state
    store = CheckpointStore(str(tmp_path / "best"), 1)
    evaluated, metadata = store.restore_intact(trained(maml_start))
    store.close()
    assert metadata["step"] == 0
    for a, b in zip(
        jax.tree.leaves(evaluated.meta_params), jax.tree.leaves(maml_start.meta_params), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def test_probe_loads_the_runs_policy_and_its_evaluation_inner_loop(cli_run):
    cfg = rl_config("trainer.eval_every=0")
    latest = load_trained_policy(str(cli_run), "latest")
    assert (latest.which, latest.step) == ("latest", 4)
    saved = restore_latest_state(str(cli_run), cfg).meta_params
    for a, b in zip(jax.tree.leaves(latest.params), jax.tree.leaves(saved), strict=True):
        np.testing.assert_array_equal(a, b)
    init = load_trained_policy(str(cli_run), "init", num_steps=1)
    assert (init.which, init.step, init.inner.num_steps) == ("init", 0, 1)
    start = experiment_of(cfg).initial_state.meta_params
    for a, b in zip(jax.tree.leaves(init.params), jax.tree.leaves(start), strict=True):
        np.testing.assert_array_equal(a, b)


def test_probe_adapts_as_the_runs_evaluation_does(tmp_path):
    # Settings off their defaults, so that a probe falling back to a default shows.
    overrides = ["data.discount=0.9", "algorithm.eval_lrs=[0.3,0.2]", "algorithm.eval_rollouts=3"]
    OmegaConf.save(compose_config([*RL_TINY, *overrides]), tmp_path / "config.yaml")
    policy = load_trained_policy(str(tmp_path), "init")
    inner = policy.inner
    assert (inner.num_steps, inner.lrs, inner.num_rollouts) == (3, (0.3, 0.2, 0.2), 3)
    assert inner.discount == 0.9
    # Its batches' mean returns are the returns the run's evaluation (eval.json) computes for
    # the same task and key.
    exp = experiment_of(rl_config(*overrides))
    tasks, keys = probe_tasks(policy.env, 2)
    for key, task in zip(keys, tasks, strict=True):
        trajs, _ = jax.jit(lambda k, t: adaptation_rollouts(policy, k, t))(key, task)
        probed = [float(np.mean(episode_returns(t))) for t in trajs]
        evaluate = lambda k, t: exp.learner.evaluate(  # noqa: E731
            policy.params, Task(support=t, query=t), context(key=k), (0, 1, 2, 3)
        )["return"]
        # Two compiled programs: float32 sums may round apart (a few 1e-5 relative).
        np.testing.assert_allclose(probed, jax.jit(evaluate)(key, task), rtol=1e-4)
        some = lambda k, t: exp.learner.evaluate(  # noqa: E731
            policy.params, Task(support=t, query=t), context(key=k), (0, 3)
        )["return"]  # the step counts asked for, not the first ones
        np.testing.assert_allclose([probed[0], probed[3]], jax.jit(some)(key, task), rtol=1e-4)


def test_every_trpo_setting_reaches_the_trpo_step():
    c = MAMLRLAlgorithmConfig(
        max_kl=0.02, cg_iters=7, cg_damping=0.003, backtrack_ratio=0.6, max_backtracks=9
    )
    trpo = meta_rl_config(c, InnerConfig()).trpo
    assert trpo == TRPOConfig(
        max_kl=0.02, cg_iters=7, damping=0.003, backtrack_ratio=0.6, max_backtracks=9
    )


def test_probe_rollouts_after_each_inner_step_on_tasks_fixed_for_every_run(cli_run):
    policy = load_trained_policy(str(cli_run), "latest")
    tasks, keys = probe_tasks(policy.env, 3)
    # The same goals and keys in every process and version (two runs' probes pair task by
    # task): those of the documented seeds, three distinct tasks.
    goals, key_data = documented_probe_tasks(3)
    np.testing.assert_array_equal(np.asarray(tasks), goals)
    assert np.asarray(jax.random.key_data(keys)).tolist() == key_data
    assert len({tuple(g) for g in goals.tolist()}) == 3 and len({tuple(k) for k in key_data}) == 3
    trajs, adapted = jax.jit(lambda k, t: adaptation_rollouts(policy, k, t))(keys[0], tasks[0])
    assert len(trajs) == 4  # before adaptation and after each of 3 steps
    assert all(t.mask.shape == (policy.inner.num_rollouts, 100) for t in trajs)
    assert not np.array_equal(adapted["log_std"], policy.params["log_std"])  # the steps moved it
    # The batch before adaptation is sampled from the loaded parameters: standardised by the
    # loaded policy's Gaussian, its actions are standard normal.
    mean, log_std = policy.policy_apply(policy.params, trajs[0].obs)
    z = ((trajs[0].actions - mean) / np.exp(log_std))[trajs[0].mask > 0]
    assert z.size > 100 and abs(float(np.mean(z))) < 0.2 and abs(float(np.std(z)) - 1.0) < 0.2


@pytest.mark.parametrize(
    ("which", "num_steps", "fragment"),
    [("bset", 3, "which='bset': choose best, latest or init"), ("init", -1, "num_steps=-1")],
)
def test_probe_refuses_a_bad_which_or_step_count(cli_run, which, num_steps, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        load_trained_policy(str(cli_run), which, num_steps)


def test_probe_refuses_a_run_that_is_not_maml_rl(tmp_path):
    OmegaConf.save(compose_config(["+experiment=sinusoid_maml"]), tmp_path / "config.yaml")
    with pytest.raises(ValueError, match="is a maml run; a probe needs algorithm=maml_rl"):
        load_trained_policy(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="a metalearn run directory"):
        load_trained_policy(str(tmp_path / "missing"))


def _flat(experiment: str) -> dict:
    composed = compose_config([f"+experiment={experiment}"])
    return _flatten(OmegaConf.to_container(composed, resolve=True))


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def test_baselines_differ_from_maml_only_where_figure_5_says():
    maml = _flat("rl_nav2d_maml")
    # The paper's settings: 20 rollouts, inner rate 0.1, TRPO KL 0.01, meta-batch 20, horizon
    # 100 (nav2d's own), 100 meta-iterations; evaluation after 0-3 inner steps.
    paper = {
        "data.env": "nav2d",
        "data.rollouts": 20,
        "algorithm.post_rollouts": 20,
        "algorithm.inner_lr": 0.1,
        "algorithm.inner_steps": 1,
        "algorithm.max_kl": 0.01,
        "algorithm.outer": "trpo",
        "algorithm.estimator": "lvc",
        "trainer.meta_batch_size": 20,
        "trainer.meta_steps": 100,
        "eval.steps": [0, 1, 2, 3],
        "model.hidden_sizes": [100, 100],
    }
    assert {k: maml[k] for k in paper} == paper
    for experiment, changed in [
        ("rl_nav2d_pretrained", {"algorithm.inner_steps": 0}),
        ("rl_nav2d_random", {"trainer.meta_steps": 0}),
    ]:
        flat = _flat(experiment)
        diff = {k: flat[k] for k in flat if flat[k] != maml.get(k)}
        assert diff == {**changed, "name": experiment, "run_name": experiment}, experiment


def test_sweep_over_two_estimators(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = run_cli(
        "-m",
        *RL_TINY,
        "trainer.meta_steps=2",
        "algorithm.estimator=lvc,maml",
        f"hydra.sweep.dir={sweep_dir}",
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    estimators = [OmegaConf.load(p / "config.yaml").algorithm.estimator for p in runs]
    assert sorted(estimators) == ["lvc", "maml"]
    for run in runs:
        records = json.loads((run / "eval.json").read_text())
        assert [r["steps"] for r in records] == [0, 1, 2, 3]


def test_data_horizon_sets_the_episode_length():
    """data.horizon=7 shortens every rollout the run samples; 0 keeps the environment's own."""
    from metalearn.rl.rollout import rollouts

    short = experiment_of(rl_config("data.horizon=7")).objective
    own = experiment_of(rl_config()).objective
    assert (short.env.horizon, own.env.horizon) == (7, 100)
    params, _ = short.model.init(jax.random.key(0))
    task = short.env.sample_tasks(jax.random.key(1), 1)[0]
    traj = rollouts(short.env, short.policy_apply, params, jax.random.key(2), task, 3)
    assert traj.rewards.shape == (3, 7)


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (["data.horizon=-1"], ["data.horizon must be an integer >= 0", "-1"]),
        (["data.rollouts=-3"], ["data.rollouts must be an integer >= 1", "-3"]),
        (["algorithm.post_rollouts=0"], ["algorithm.post_rollouts"]),
        (["algorithm.estimator=reinforce"], ["algorithm.estimator", "dice", "reinforce"]),
        (["algorithm.outer=sgd"], ["algorithm.outer", "trpo"]),
        (["data.env=cartpole"], ["data.env", "nav2d", "cartpole"]),
        (["model=mlp"], ["(mean, log_std)", "model=gaussian_mlp"]),
    ],
    ids=["horizon", "rollouts", "post_rollouts", "estimator", "outer", "env", "model"],
)
def test_bad_rl_values_are_one_error_line(overrides, fragments, tmp_path):
    result = run_cli(*RL_TINY, *overrides, f"hydra.run.dir={tmp_path / 'run'}", timeout=300)
    error_line(result, *fragments)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(estimator="reinforce"), "algorithm.estimator must be one of ['dice', 'lvc', 'maml']"),
        (dict(outer="sgd"), "algorithm.outer must be one of ['trpo', 'ppo'], got 'sgd'"),
        (dict(inner_steps=-1), "algorithm.inner_steps must be an integer >= 0, got -1"),
        (dict(inner_lr=-1.0), "algorithm.inner_lr must be > 0, got -1.0"),
        (dict(post_rollouts=0), "algorithm.post_rollouts must be an integer >= 1, got 0"),
        (dict(max_kl=-1.0), "algorithm.max_kl must be > 0, got -1.0"),
        (dict(cg_damping=-1.0), "algorithm.cg_damping must be >= 0, got -1.0"),
        (dict(backtrack_ratio=1.0), "algorithm.backtrack_ratio must be in (0, 1), got 1.0"),
        (dict(eval_lrs=(0.1, 0.0)), "algorithm.eval_lrs must be positive rates, got [0.1, 0.0]"),
        (
            dict(outer="ppo", max_kl=0.05),
            "algorithm.max_kl=0.05 is used by algorithm.outer=trpo only, and algorithm.outer=ppo: "
            "set algorithm.outer=trpo, or leave max_kl at 0.01",
        ),
    ],
)
def test_the_algorithm_config_refuses_a_bad_value_when_it_is_made(kwargs, message):
    # metalearn.config.to_objects makes it: refused before a rerun's config is compared with its
    # run directory's (a rerun with algorithm.max_kl=-1 was told to accept the change with
    # trainer.allow_changes, and refused only after that, when the learner was built).
    for make in (
        lambda: MAMLRLAlgorithmConfig(**kwargs),
        lambda: dataclasses.replace(MAMLRLAlgorithmConfig(), **kwargs),
    ):
        with pytest.raises(ValueError) as err:
            make()
        assert str(err.value).startswith(message), str(err.value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(env="cartpole"), "data.env must be one of ['ant_dir', 'cheetah_dir', "),
        (dict(rollouts=0), "data.rollouts must be an integer >= 1, got 0"),
        (dict(discount=1.5), "data.discount must be in (0, 1], got 1.5"),
        (dict(horizon=-1), "data.horizon must be an integer >= 0 (0: the env's own), got -1"),
    ],
)
def test_the_task_family_config_refuses_a_bad_value_when_it_is_made(kwargs, message):
    with pytest.raises(ValueError) as err:
        RLTasksConfig(**kwargs)
    assert str(err.value).startswith(message), str(err.value)


UNUSED = "unused with algorithm.inner_steps=0 (the pretrained baseline)"


@pytest.mark.parametrize(
    "overrides, warned",
    [
        (
            ["algorithm.inner_steps=0", "algorithm.inner_lr=0.05", "algorithm.estimator=dice"],
            "algorithm.inner_lr=0.05 and algorithm.estimator=dice are ",
        ),
        (["algorithm.inner_steps=0", "algorithm.inner_lr=0.05"], "algorithm.inner_lr=0.05 is "),
        (["algorithm.inner_steps=0"], None),  # the pretrained baseline as it ships
        (["algorithm.inner_lr=0.05", "algorithm.estimator=dice"], None),  # an inner step reads them
    ],
    ids=["rate-and-estimator", "rate", "pretrained", "one-inner-step"],
)
def test_inner_steps_0_warns_once_of_the_settings_it_leaves_unused(overrides, warned, caplog):
    # Not refused: a sweep over algorithm.inner_steps=0,1 with algorithm.inner_lr=0.05 must run.
    with caplog.at_level(logging.WARNING, logger="metalearn"):
        exp = experiment_of(rl_config(*overrides))
        # The runner builds the learner once and passes its inner rate into the compiled step
        # as data: tracing the step again, at another rate, warns no more.
        task = exp.tasks.sample(exp.tasks.splits["train"], jax.random.key(0), 1)
        params = exp.initial_state.meta_params

        def grad(lr):
            ctx = TaskContext(0, 1, {}, jax.random.key(1), {"inner_lr": lr})
            return exp.learner.task_grad(params, task, ctx)[0]

        jax.jit(grad)(exp.hyper.learner["inner_lr"])
        jax.jit(grad)(exp.hyper.learner["inner_lr"] + 1.0)
    lines = [r.getMessage() for r in caplog.records if UNUSED in r.getMessage()]
    if warned is None:
        assert lines == []
        return
    assert lines == [
        f"{warned}{UNUSED}: training takes no inner step, and evaluation's inner steps are plain "
        "policy-gradient steps at algorithm.eval_lrs=[0.1, 0.05, 0.05], whatever the estimator"
    ]


def test_maml_rl_on_supervised_data_is_one_error_line(tmp_path):
    result = run_cli(
        "+experiment=sinusoid_maml", "algorithm=maml_rl", f"hydra.run.dir={tmp_path / 'run'}"
    )
    error_line(result, "algorithm=maml_rl needs a reinforcement-learning task family")


def test_the_run_name_says_which_environment_runs():
    # It said rl_nav2d_maml (its outputs/ directory too) for a run on Ant.
    changed = compose_config(["+experiment=rl_nav2d_maml", "data.env=ant_dir"])
    assert changed.run_name == "rl_nav2d_maml-data.env=ant_dir"
    same = compose_config(["+experiment=rl_cheetah_dir_maml", "data.env=cheetah_dir"])
    assert same.run_name == "rl_cheetah_dir_maml"
