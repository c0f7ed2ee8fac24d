"""The settings declared read in training only (``TRAINING_ONLY``) do not change an evaluation,
which is what lets ``metalearn.evaluate`` refuse them as overrides (tests/test_cli_errors.py).

Before, ``evaluate RUN seed=3`` (or ``algorithm.inner_steps=5``, ``eval.select_best=false``, an RL
run's ``data.rollouts=40``) evaluated exactly as without it and recorded the override in the
evaluation's ``overrides``, as if it had changed the numbers.
"""

import contextlib

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from metalearn.config import Config, to_objects, training_only_reason
from metalearn.runner.steps import trained
from tests.cli import RL_TINY
from tests.conftest import compose_config, runner_of
from tests.data.test_task_registry import IMAGE_SHAPES, fake_data_source

# A value other than every config's default, for each setting some config declares read in
# training only; all of them are changed at once. A new declaration needs a row here.
CHANGED = {
    "seed": "7",
    "name": "other",
    "run_name": "other",
    "optimizer.lr": "0.5",
    "optimizer.grad_clip_norm": "1.0",
    "trainer.meta_steps": "9",
    "trainer.meta_batch_size": "3",
    "trainer.shots": "3",
    "trainer.steps_per_call": "3",
    "trainer.log_every": "3",
    "trainer.eval_every": "3",
    "trainer.checkpoint_every": "3",
    "trainer.keep_checkpoints": "5",
    "trainer.resume": "false",
    "trainer.allow_changes": "[trainer.meta_steps]",
    "trainer.progress_bar": "bar",
    "eval.val_tasks": "7",
    "eval.select_best": "false",
    "algorithm.inner_steps": "4",
    "algorithm.first_order": "true",
    "algorithm.remat": "true",
    "algorithm.inner_lr": "0.123",
    "algorithm.cg_iters": "3",
    "algorithm.cg_tol": "0.1",
    "algorithm.curvature": "hessian",
    "algorithm.msl_fraction": "0.5",
    "algorithm.first_order_fraction": "0.9",
    "algorithm.estimator": "dice",
    "algorithm.outer": "ppo",
    "algorithm.post_rollouts": "3",
    "algorithm.max_kl": "0.5",
    "algorithm.cg_damping": "0.1",
    "algorithm.backtrack_ratio": "0.3",
    "algorithm.max_backtracks": "2",
    "algorithm.ppo_clip": "0.1",
    "algorithm.ppo_epochs": "2",
    "data.rollouts": "3",
}
# Settings a case's config refuses to change (fomaml is first order; an RL task takes 1 shot).
KEPT = {"fomaml": {"algorithm.first_order"}, "maml_rl": {"trainer.shots"}}
# Settings of one outer step each, refused together (a TRPO setting with algorithm.outer=ppo;
# the optimizer is PPO's): changed in two evaluations, one without each part.
APART = (
    {"algorithm.outer", "algorithm.ppo_clip", "algorithm.ppo_epochs", "optimizer.lr"}
    | {"optimizer.grad_clip_norm"},
    {"algorithm.max_kl", "algorithm.cg_iters", "algorithm.cg_damping", "algorithm.backtrack_ratio"}
    | {"algorithm.max_backtracks"},
)


def declared(cfg: Config) -> list[str]:
    """Every setting of ``cfg`` that its classes declare read in training only."""
    keys = [k for k in Config.TRAINING_ONLY if k not in ("optimizer", "distributed")]
    # distributed.* cannot be changed alone: enabled=true would start a multi-process run.
    keys += ["optimizer.lr", "optimizer.grad_clip_norm"]
    for section in ("algorithm", "data", "trainer", "eval"):
        names = getattr(type(getattr(cfg, section)), "TRAINING_ONLY", {})
        keys += [f"{section}.{name}" for name in names]
    return keys


CASES = {
    **{
        a: ["+experiment=sinusoid_maml", "+debug=tiny", f"algorithm={a}", "eval.steps=[0,1,3]"]
        for a in ("maml", "fomaml", "anil", "meta_sgd", "imaml", "mamlpp", "reptile")
    },
    # without RL_TINY's cg_iters, which the evaluation with algorithm.outer=ppo could not take
    "maml_rl": [o for o in RL_TINY if "cg_iters" not in o],
    "omniglot": [
        "+experiment=omniglot_5w1s",
        "+debug=tiny",
        "model.filters=8",
        "eval.steps=[0,1]",
        "eval.shots=[1]",
    ],
}


def evaluate_init(overrides: list[str], params, workdir) -> tuple[list[dict], object]:
    """The test records of ``params`` (or, when None, of the run's own initialisation) under
    the config of ``overrides``, and those parameters."""
    cfg = to_objects(compose_config(overrides))
    runner = runner_of(cfg, workdir)
    try:
        params = trained(runner.initial_state) if params is None else params
        return runner.evaluate(params, "test", 4)[0], params
    finally:
        runner.close()


@pytest.mark.parametrize("case", list(CASES))
def test_training_only_settings_do_not_change_an_evaluation(case, tmp_path):
    base = CASES[case]
    if case == "omniglot":
        base = [*base, f"data.data_dir={tmp_path / 'tfds'}"]
        source = fake_data_source(IMAGE_SHAPES["omniglot"])
        mock = lambda: tfds.testing.mock_data(as_data_source_fn=source)  # noqa: E731
    else:
        mock = contextlib.nullcontext
    keys = declared(to_objects(compose_config(base)))
    missing = [k for k in keys if k not in CHANGED]
    assert not missing, f"give these a changed value in CHANGED: {missing}"
    keys = [k for k in keys if k not in KEPT.get(case, ())]
    apart = APART if all(part & set(keys) for part in APART) else (set(),)
    with mock():
        before, params = evaluate_init(base, None, tmp_path / "a")
        for i, left_out in enumerate(apart):
            changes = [f"{k}={CHANGED[k]}" for k in keys if k not in left_out]
            after, _ = evaluate_init([*base, *changes], params, tmp_path / f"b{i}")
            assert len(before) == len(after) > 0
            for b, a in zip(before, after, strict=True):
                assert b.keys() == a.keys()
                for key in b:
                    np.testing.assert_array_equal(np.asarray(b[key]), np.asarray(a[key]), key)
    # The evaluation is not constant: a setting it reads does change it.
    read = {"maml_rl": "algorithm.eval_rollouts=3", "omniglot": "eval.seed=5"}
    with mock():
        other, _ = evaluate_init([*base, read.get(case, "eval.seed=5")], params, tmp_path / "c")
    assert [r.get("mean") for r in other] != [r.get("mean") for r in before]
    jax.clear_caches()


def test_a_setting_an_evaluation_reads_is_no_training_setting():
    cfg = to_objects(compose_config(["+experiment=sinusoid_maml"]))
    for key in (
        "eval.num_tasks",
        "eval.seed",
        "eval.steps",
        "algorithm.inner_lr",
        "data.num_queries",
    ):
        assert training_only_reason(cfg, key) is None, key
