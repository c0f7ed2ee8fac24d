"""Every experiment composes; bad config values fail early with a message naming the key."""

import re
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from metalearn.config import OptimizerConfig, to_objects
from metalearn.runner.experiment import build_optimizer
from tests.cli import checkout_env, communicated, finished, run_in_process
from tests.conftest import EXPERIMENTS, compose_config, experiment_of


def test_there_are_experiments():
    assert "sinusoid_maml" in EXPERIMENTS


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_validates(experiment):
    cfg = to_objects(compose_config([f"+experiment={experiment}"]))
    # 0 meta-steps: a baseline that evaluates the initialisation (rl_nav2d_random).
    assert cfg.trainer.meta_steps >= 1 or experiment.endswith("_random")
    assert cfg.algorithm.name and cfg.model.name and cfg.data.name


def test_sinusoid_maml_is_the_papers_setup():
    cfg = to_objects(compose_config(["+experiment=sinusoid_maml"]))
    assert cfg.data.amplitude_range == (0.1, 5.0)
    assert cfg.data.phase_range == pytest.approx((0.0, 3.14159265))
    assert cfg.data.input_range == (-5.0, 5.0)
    assert cfg.model.hidden_sizes == (40, 40) and cfg.model.activation == "relu"
    # cbfinn/maml: tf.truncated_normal(stddev=0.01) weights (maml.py), update_lr 1e-3 (main.py).
    assert (cfg.model.kernel_init, cfg.model.kernel_std) == ("truncated_normal", 0.01)
    assert (cfg.trainer.shots, cfg.data.num_queries) == (10, 10)
    assert cfg.algorithm.name == "maml"
    assert (cfg.algorithm.inner_lr, cfg.algorithm.inner_steps) == (0.001, 1)
    assert not cfg.algorithm.first_order
    assert (cfg.trainer.meta_batch_size, cfg.trainer.meta_steps) == (25, 70_000)
    assert (cfg.optimizer.name, cfg.optimizer.lr) == ("adam", 0.001)
    assert cfg.eval.num_tasks == 600 and cfg.eval.shots == [5, 10, 20]


@pytest.mark.parametrize(
    "override, message",
    [
        ("optimizer.lr=-0.1", "optimizer.lr must be > 0"),
        ("trainer.meta_steps=-1", "trainer.meta_steps must be >= 0"),
        # Beyond int32: an OverflowError traceback (meta_steps, eval.shots) or an XLA abort,
        # exit 134 (trainer.shots).
        ("trainer.meta_steps=10000000000", "trainer.meta_steps=10000000000 is beyond the 32-bit"),
        ("trainer.shots=10000000000", "trainer.shots=10000000000 is beyond the 32-bit"),
        # Settings the chosen option ignores: each ran silently, eval.json identical to a run
        # without them.
        ("distributed.num_processes=4", "distributed.num_processes=4 is used with distributed"),
        (  # an IndexError traceback from inside jax.distributed.initialize
            "distributed.coordinator_address=notaport",
            "distributed.coordinator_address=notaport is not HOST:PORT",
        ),
        ("eval.shots=[1,10000000000]", "eval.shots=10000000000 is beyond the 32-bit"),
        ("trainer.task_batching=magic", "trainer.task_batching must be one of"),
        ("eval.steps=[-1]", "eval.steps must be >= 0"),
        ("eval.steps=[]", "eval.steps must be a non-empty list"),  # said "must be >= 0"
        ("eval.shots=[]", "eval.shots must be a non-empty list"),
        # eval.json held the same records twice
        ("eval.steps=[3,1,1]", re.escape("eval.steps lists a value twice ([3, 1, 1])")),
        ("eval.shots=[5,5]", re.escape("eval.shots lists a value twice ([5, 5])")),
    ],
)
def test_bad_values_are_named(override, message):
    with pytest.raises(ValueError, match=message):
        to_objects(compose_config(["+experiment=sinusoid_maml", override]))


@pytest.mark.parametrize(
    "overrides, message",
    [  # each ran silently, eval.json identical to a run without the setting
        (["model=mlp", "model.kernel_std=5.0"], "is used by model.kernel_init=truncated_normal"),
        (["algorithm=reptile", "algorithm.adam_b1=0.9"], "is used by algorithm.inner_optimizer"),
    ],
)
def test_a_setting_the_chosen_option_ignores_is_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        to_objects(compose_config(["+experiment=sinusoid_maml", *overrides]))
    fixed = [o.replace("model=mlp", "model.kernel_init=truncated_normal") for o in overrides]
    fixed = [o.replace("algorithm=reptile", "algorithm.inner_optimizer=adam") for o in fixed]
    if "algorithm.inner_optimizer=adam" in fixed:
        fixed.insert(0, "algorithm=reptile")
    to_objects(compose_config(["+experiment=sinusoid_maml", *fixed]))  # as the message says


@pytest.mark.parametrize(
    "override, message",
    [
        ("algorithm.inner_lr=-0.01", "algorithm.inner_lr must be > 0"),
        ("algorithm.inner_steps=0", "algorithm.inner_steps must be"),
    ],
)
def test_bad_algorithm_settings_fail_when_the_config_is_made(override, message):
    # By the algorithm's config dataclass, in to_objects (they failed when the learner was built,
    # after the run directory's guard had compared a rerun's config with the run's).
    with pytest.raises(ValueError, match=message):
        to_objects(compose_config(["+experiment=sinusoid_maml", override]))


def test_misspelt_key_and_wrong_type_fail_at_composition():
    with pytest.raises(ConfigCompositionException, match="inner_lrr"):
        compose_config(["+experiment=sinusoid_maml", "algorithm.inner_lrr=0.1"])
    with pytest.raises((ConfigCompositionException, ValidationError, ConfigKeyError), match="lr"):
        compose_config(["+experiment=sinusoid_maml", "optimizer.lr=fast"])


def test_unknown_algorithm_fails_at_composition():
    with pytest.raises(ConfigCompositionException, match="algorithm/no_such_algorithm"):
        compose_config(["+experiment=sinusoid_maml", "algorithm=no_such_algorithm"])


def run_cli(*overrides):
    return run_in_process("+experiment=sinusoid_maml", *overrides)


def test_cli_reports_a_bad_value_in_one_line_before_compiling(tmp_path):
    result = run_cli("optimizer.lr=-1", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: optimizer.lr must be > 0, got -1.0"]
    assert "compiled" not in result.stdout + result.stderr


def test_a_final_rate_no_schedule_reads_is_said_and_the_run_goes_on(tmp_path):
    """optimizer.final_lr_fraction without schedule=cosine changed nothing, silently."""
    result = run_cli("+debug=tiny", "optimizer.final_lr_fraction=0.1", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stdout + result.stderr
    assert "optimizer.final_lr_fraction=0.1 is unused: only optimizer.schedule=cosine" in output
    cosine = run_cli(
        "+debug=tiny",
        "optimizer.schedule=cosine",
        "optimizer.final_lr_fraction=0.1",
        f"hydra.run.dir={tmp_path / 'cosine'}",
    )
    assert cosine.returncode == 0 and "is unused" not in cosine.stdout + cosine.stderr


def test_cli_reports_an_unwritable_output_directory(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "run").write_text("a file where the run directory should be")
    result = run_cli(f"hydra.run.dir={locked / 'run'}")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: output directory")
    assert str(locked / "run") in lines[0]
    assert f"{locked / 'run'} is a file, not a directory" in lines[0]  # said "File exists"
    assert "compiled" not in result.stdout + result.stderr


# One process checking the output directory over and over for a second and a half, from the
# moment every process has imported metalearn (each marks itself ready, then waits for the rest).
CHECKING = """
import os, sys, time
from metalearn.runner.layout import check_writable
run, ready, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
open(os.path.join(ready, str(os.getpid())), "w").close()
deadline = time.monotonic() + 300  # a safety limit only
while len(os.listdir(ready)) < count:
    if time.monotonic() > deadline:
        sys.exit(f"only {len(os.listdir(ready))} of {count} processes got ready in 300 s")
    time.sleep(0.001)
end = time.monotonic() + 1.5
while time.monotonic() < end:
    check_writable(run)
"""


def test_processes_that_check_one_output_directory_at_once_all_pass(tmp_path):
    # The processes of a distributed run check the same run directory together: each wrote and
    # removed the same probe file, and one removing another's made that one fail with
    # "cannot be written (No such file or directory)" (1 or 2 of 3 processes, in 3 of 4 trials).
    ready = tmp_path / "ready"
    ready.mkdir()
    command = [sys.executable, "-c", CHECKING, str(tmp_path / "run"), str(ready), "3"]
    procs = [
        subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=checkout_env())
        for _ in range(3)
    ]
    errors = [communicated(p, 400)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    assert list((tmp_path / "run").iterdir()) == []  # no probe left behind


@pytest.mark.parametrize(
    "algorithm",
    [
        "maml",
        "fomaml",
        "reptile",
        "anil",
        "meta_sgd",
        "mamlpp",
        "imaml",
        "protonet",
        "metaoptnet_svm",
    ],
)
def test_every_algorithm_composes_with_the_sinusoid_experiment(algorithm):
    cfg = to_objects(compose_config(["+experiment=sinusoid_maml", f"algorithm={algorithm}"]))
    assert cfg.algorithm.name == algorithm


def test_the_recommended_schedule_reaches_the_optimizer():
    """MAML++'s recommended cosine (conf/algorithm/mamlpp.yaml) is built by the one home of the
    outer schedule, build_optimizer, from optimizer.*; warmup_steps is honoured with it."""
    import jax
    import jax.numpy as jnp

    from metalearn.runner.experiment import learning_rate

    overrides = ["+experiment=sinusoid_maml", "algorithm=mamlpp", "trainer.meta_steps=100"]
    for extra in ([], ["optimizer.warmup_steps=20"]):
        cfg = to_objects(compose_config(overrides + extra))
        exp = experiment_of(cfg)
        params = {"w": jnp.zeros(3)}
        grads = {"w": jnp.ones(3)}  # constant gradient: each Adam update is -lr(t) exactly
        state = exp.optimizer.init(params)
        update = jax.jit(exp.optimizer.update)
        for _ in range(51):
            updates, state = update(grads, state, params)
        schedule = learning_rate(cfg.optimizer, 100)
        assert float(schedule(50)) < 0.75 * cfg.optimizer.lr  # the cosine is below the peak
        assert float(-updates["w"][0]) == pytest.approx(float(schedule(50)), rel=1e-3)
    assert float(schedule(0)) == 0.0  # the warm-up starts from zero


@pytest.mark.parametrize(
    "old, new",
    [
        ("algorithm.num_steps=5", "algorithm.inner_steps"),
        ("trainer.num_steps=5", "trainer.meta_steps"),
        ("algorithm.meta_lr_schedule=cosine", "optimizer.schedule"),
    ],
)
def test_renamed_keys_fail_naming_the_new_key(old, new):
    import sys

    result = finished(
        [sys.executable, "-m", "metalearn.train", "+experiment=sinusoid_maml", old],
        120,
        env=checkout_env(),
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {old.split('=')[0]} was renamed {new}"


@pytest.mark.parametrize(
    "overrides, message",
    [
        # Non-finite floats passed the range checks (inf > 0) and ended in a NaN much later.
        (["algorithm.eval_lrs=[0.1,nan]"], "algorithm.eval_lrs must be a finite number, got nan"),
        (["algorithm.max_kl=inf"], "algorithm.max_kl must be a finite number"),
        (["optimizer.momentum=nan"], "optimizer.momentum must be a finite number"),
        # A value outside a setting's range is refused by its config when made, before this
        # check: model.init_std=inf said "must be a finite number".
        (["model.init_std=inf"], "model.init_std must be in [1e-06, 1e+06], got inf"),
    ],
)
def test_non_finite_settings_are_refused(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        to_objects(compose_config(["+experiment=rl_nav2d_maml", *overrides]))


@pytest.mark.parametrize(
    "override, message",
    [
        # Finite but beyond float32: a NaN at the first step, blamed on the learning rates.
        ("model.init_std=1e300", "model.init_std must be in [1e-06, 1e+06], got 1e+300"),
        ("model.init_std=1e-300", "model.init_std must be in [1e-06, 1e+06], got 1e-300"),
        ("model.head_init_scale=1e30", "model.head_init_scale must be in (0, 1e+06], got 1e+30"),
    ],
)
def test_policy_scales_beyond_float32_are_refused(override, message):
    rl = ["+experiment=rl_nav2d_maml", "+debug=tiny", "model.hidden_sizes=[8]"]
    with pytest.raises(ValueError, match=re.escape(message)):
        experiment_of(to_objects(compose_config([*rl, override])))


@pytest.mark.parametrize(
    "overrides, message",
    [
        # Adam ignored weight_decay, Adam and AdamW ignored momentum: silently.
        (["optimizer.weight_decay=0.1"], "used by optimizer.name=adamw or sgd only"),
        (["optimizer.name=adamw", "optimizer.weight_decay=-1"], "weight_decay must be >= 0"),
        (["optimizer.momentum=0.9"], "used by optimizer.name=sgd only"),
        (["optimizer.name=sgd", "optimizer.momentum=1.5"], "momentum must be in [0, 1)"),
        (["optimizer.nesterov=true"], "optimizer.nesterov=true needs optimizer.name=sgd with"),
        (["optimizer.name=sgd", "optimizer.nesterov=true"], "with optimizer.momentum > 0"),
        (
            ["optimizer.step_boundaries=[10]", "optimizer.step_factors=[0.1]"],
            "read by optimizer.schedule=step only, and optimizer.schedule=constant",
        ),
        (["optimizer.schedule=step"], "needs as many step_factors as step_boundaries (at least"),
        (
            ["optimizer.schedule=step", "optimizer.step_boundaries=[10,5]"]
            + ["optimizer.step_factors=[0.1,0.01]"],
            "step_boundaries must be increasing meta-steps > 0, got [10, 5]",
        ),
        (
            ["optimizer.schedule=step", "optimizer.step_boundaries=[10]"]
            + ["optimizer.step_factors=[0]"],
            "step_factors must be > 0, got [0.0]",
        ),
    ],
)
def test_optimizer_settings_the_optimizer_does_not_use_are_refused(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        to_objects(compose_config(["+experiment=sinusoid_maml", *overrides]))
    for used in (["optimizer.name=adamw"], ["optimizer.name=sgd", "optimizer.momentum=0.9"]):
        overrides = [*used, "optimizer.weight_decay=0.1"]
        to_objects(compose_config(["+experiment=sinusoid_maml", *overrides]))  # accepted


def test_sgd_with_nesterov_weight_decay_and_steps_takes_pytorchs_updates():
    """Three updates of optimizer.name=sgd with Nesterov momentum, weight decay and a step
    schedule against PyTorch's SGD algorithm written out in NumPy (torch.optim.SGD's docs)."""
    cfg = OptimizerConfig(
        name="sgd",
        lr=0.1,
        momentum=0.9,
        nesterov=True,
        weight_decay=5e-4,
        schedule="step",
        step_boundaries=[1, 2],
        step_factors=[0.06, 0.012],
    )
    optimizer = build_optimizer(cfg, meta_steps=3)
    params = {"w": jnp.array([1.0, -2.0])}
    state = optimizer.init(params)
    w, buf = np.array([1.0, -2.0]), None
    for step, grad in enumerate([[0.5, 0.25], [-1.0, 2.0], [0.3, -0.7]]):
        update, state = optimizer.update({"w": jnp.array(grad)}, state, params)
        params = optax.apply_updates(params, update)
        g = np.array(grad) + 5e-4 * w
        buf = g if buf is None else 0.9 * buf + g
        w = w - 0.1 * [1.0, 0.06, 0.012][step] * (g + 0.9 * buf)
        np.testing.assert_allclose(np.asarray(params["w"]), w, rtol=1e-6)


def test_clipping_by_value_clamps_each_entry_before_the_norm_and_the_momentum():
    """optimizer.grad_clip_value clamps every gradient entry (PyTorch's ``clamp_``, as CAVIA's
    reference does), then grad_clip_norm rescales; against the same steps written in NumPy."""
    cfg = OptimizerConfig(name="sgd", lr=0.1, momentum=0.9, grad_clip_value=1.0, grad_clip_norm=0.5)
    optimizer = build_optimizer(cfg, meta_steps=2)
    params = {"w": jnp.array([1.0, -2.0])}
    state = optimizer.init(params)
    w, buf = np.array([1.0, -2.0]), None
    for grad in ([3.0, -0.5], [-0.25, 0.5]):
        update, state = optimizer.update({"w": jnp.array(grad)}, state, params)
        params = optax.apply_updates(params, update)
        g = np.clip(grad, -1.0, 1.0)
        g = g * min(1.0, 0.5 / np.linalg.norm(g))
        buf = g if buf is None else 0.9 * buf + g
        w = w - 0.1 * buf
        np.testing.assert_allclose(np.asarray(params["w"]), w, rtol=1e-6)
    with pytest.raises(ValueError, match="optimizer.grad_clip_value must be >= 0, got -1.0"):
        OptimizerConfig(grad_clip_value=-1.0)


def test_maml_rl_with_trpo_refuses_optimizer_settings_it_would_ignore():
    # TRPO's step is bounded by algorithm.max_kl; optimizer.lr=1e30 ran and changed nothing.
    rl = ["+experiment=rl_nav2d_maml", "+debug=tiny", "model.hidden_sizes=[8]"]
    with pytest.raises(ValueError, match=r"optimizer.lr=1e\+30 would have no effect"):
        experiment_of(to_objects(compose_config([*rl, "optimizer.lr=1e30"])))
    # the optimizer's name too: optimizer.name=sgd ran as the default did
    with pytest.raises(ValueError, match=r"optimizer.name=sgd would have no effect"):
        experiment_of(to_objects(compose_config([*rl, "optimizer.name=sgd"])))
    experiment_of(to_objects(compose_config([*rl, "algorithm.outer=ppo", "optimizer.lr=0.01"])))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["algorithm.outer=ppo", "algorithm.max_kl=0.05"],
            "algorithm.max_kl=0.05 is used by "
            "algorithm.outer=trpo only, and algorithm.outer=ppo: set algorithm.outer=trpo, or "
            "leave max_kl at 0.01",
        ),
        (["algorithm.outer=ppo", "algorithm.cg_iters=5"], "algorithm.cg_iters=5 is used by"),
        (["algorithm.ppo_clip=0.1"], "algorithm.ppo_clip=0.1 is used by algorithm.outer=ppo only"),
        (["algorithm.ppo_epochs=3"], "algorithm.ppo_epochs=3 is used by algorithm.outer=ppo only"),
    ],
)
def test_maml_rl_refuses_settings_of_the_outer_step_it_does_not_take(overrides, message):
    # Accepted and ignored: PPO never reads TRPO's settings, nor TRPO PPO's.
    rl = ["+experiment=rl_nav2d_maml", "+debug=tiny", "model.hidden_sizes=[8]"]
    with pytest.raises(ValueError, match=re.escape(message)):
        experiment_of(to_objects(compose_config([*rl, *overrides])))
    experiment_of(
        to_objects(compose_config([*rl, "algorithm.outer=ppo", "algorithm.ppo_clip=0.1"]))
    )
