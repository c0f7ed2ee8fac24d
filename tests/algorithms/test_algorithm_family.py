"""Every algorithm: registered, composable from conf/algorithm, validated, jit- and
vmap-compatible, and a few hundred meta-steps of it reduce the post-adaptation loss."""

import dataclasses
import os

import jax
import numpy as np
import optax
import pytest

import metalearn
from metalearn.config import to_objects
from metalearn.registry import ALGORITHMS
from tests.algorithms.problems import (
    CTX,
    WAYS,
    cluster_model,
    init_params,
    meta_train,
    sine_model,
    task_pool,
    to64,
)
from tests.conftest import compose_config

NAMES = [
    "maml",
    "fomaml",
    "reptile",
    "anil",
    "boil",
    "cavia",
    "meta_sgd",
    "mamlpp",
    "imaml",
    "protonet",
    "r2d2",
    "metaoptnet_svm",
    "baseline",
    "baseline_pp",
]
# Classification only, on the embedding (Gaussian-cluster tasks), with no inner loop.
CLASSIFIERS = ("protonet", "r2d2", "metaoptnet_svm", "baseline", "baseline_pp")
# Trained as classifiers over fixed classes, not on episodes: their learning is checked on
# class-labelled data in tests/algorithms/test_baseline.py.
PRETRAINED = ("baseline", "baseline_pp")
CONF_DIR = os.path.join(os.path.dirname(metalearn.__file__), "conf", "algorithm")


# Settings that fit the test models (CAVIA's FiLM on the sine MLP's first layer).
FITTING = {"cavia": {"film_module": "hidden_0", "num_context": 4, "inner_lr": 0.1}}


def build(name, **overrides):
    config = ALGORITHMS.entry(name).config_cls()
    config = dataclasses.replace(config, **{**FITTING.get(name, {}), **overrides})
    model = cluster_model() if name in CLASSIFIERS else sine_model()
    return ALGORITHMS.build(config, model.objective), model


# Registered for reinforcement-learning task families only (tests/rl/test_runner_rl.py).
RL_NAMES = ["maml_rl"]


def test_the_whole_family_is_registered_with_a_config_file_each():
    assert sorted(NAMES + RL_NAMES) == ALGORITHMS.names()
    files = {f[: -len(".yaml")] for f in os.listdir(CONF_DIR) if f.endswith(".yaml")}
    assert set(NAMES + RL_NAMES) <= files
    # Any other file is a variant of a registered algorithm (e.g. maml_sinusoid: MAML with the
    # reference code's sinusoid inner rate), composing and validating as that algorithm.
    for variant in sorted(files - set(NAMES + RL_NAMES)):
        cfg = to_objects(compose_config([f"algorithm={variant}"]))
        assert cfg.algorithm.name in NAMES, variant


@pytest.mark.parametrize("name", NAMES)
def test_config_file_composes_into_the_factory_defaults(name):
    cfg = to_objects(compose_config([f"algorithm={name}"]))
    assert cfg.algorithm == ALGORITHMS.entry(name).config_cls()
    build_model = cluster_model if name in CLASSIFIERS else sine_model
    ALGORITHMS.build(cfg.algorithm, build_model().objective)


BAD_VALUES = [
    (name, key, value)
    for name in NAMES
    for key, value in [("inner_lr", -0.01), ("inner_lr", 0.0), ("inner_steps", 0)]
    if key in {f.name for f in dataclasses.fields(ALGORITHMS.entry(name).config_cls)}
]


@pytest.mark.parametrize("name, key, value", BAD_VALUES)
def test_bad_values_raise_naming_the_key(name, key, value):
    with pytest.raises(ValueError, match=f"algorithm.{key}"):
        build(name, **{key: value})


# Every value check of an algorithm's settings, made by its config dataclass (__post_init__), so
# that metalearn.config.to_objects refuses the value: it was checked by the factory only, after
# the run directory's guard had compared the configs, so a rerun with algorithm.inner_lr=-1 was
# first told to accept the change with trainer.allow_changes, and refused only after that.
CONFIG_BAD_VALUES = [
    ("maml", "inner_lr", -1.0, "algorithm.inner_lr must be > 0, got -1.0"),
    ("maml", "inner_steps", 0, "algorithm.inner_steps must be an integer >= 1, got 0"),
    ("maml", "unroll", 0, "algorithm.unroll must be an integer >= 1, got 0"),
    ("fomaml", "inner_lr", 0.0, "algorithm.inner_lr must be > 0, got 0.0"),
    ("anil", "inner_steps", -1, "algorithm.inner_steps must be an integer >= 1, got -1"),
    ("meta_sgd", "inner_lr", -0.01, "algorithm.inner_lr must be > 0, got -0.01"),
    ("reptile", "inner_lr", -1.0, "algorithm.inner_lr must be > 0, got -1.0"),
    ("reptile", "inner_optimizer", "lbfgs", "algorithm.inner_optimizer must be one of"),
    ("reptile", "adam_b1", 1.0, "algorithm.adam_b1 must be < 1, got 1.0"),
    ("reptile", "adam_b1", -0.5, "algorithm.adam_b1 must be in [0, 1], got -0.5"),
    ("mamlpp", "inner_steps", 0, "algorithm.inner_steps must be an integer >= 1, got 0"),
    ("mamlpp", "msl_fraction", 1.5, "algorithm.msl_fraction must be in [0, 1], got 1.5"),
    ("mamlpp", "first_order_fraction", -0.1, "algorithm.first_order_fraction must be in [0, 1]"),
    ("imaml", "inner_lr", -1.0, "algorithm.inner_lr must be > 0, got -1.0"),
    ("imaml", "lam", 0.0, "algorithm.lam must be > 0, got 0.0"),
    ("imaml", "cg_iters", 0, "algorithm.cg_iters must be an integer >= 1, got 0"),
    ("imaml", "cg_tol", -1e-3, "algorithm.cg_tol must be >= 0, got -0.001"),
    ("imaml", "inner_optimizer", "lbfgs", "algorithm.inner_optimizer must be one of"),
    ("imaml", "curvature", "fisher", "algorithm.curvature must be one of"),
    ("boil", "inner_lr", 0.0, "algorithm.inner_lr must be > 0, got 0.0"),
    ("cavia", "num_context", 0, "algorithm.num_context must be an integer >= 1, got 0"),
    ("cavia", "film_module", "", "algorithm.film_module must name a parameter entry"),
    ("r2d2", "lambda_init", 0.0, "algorithm.lambda_init must be > 0, got 0.0"),
    ("r2d2", "form", "svd", "algorithm.form must be one of"),
    ("baseline", "finetune_lr", 0.0, "algorithm.finetune_lr must be > 0, got 0.0"),
    ("baseline_pp", "momentum", 1.5, "algorithm.momentum must be in [0, 1], got 1.5"),
    ("baseline", "weight_decay", -1e-3, "algorithm.weight_decay must be >= 0, got -0.001"),
]


@pytest.mark.parametrize("name, key, value, message", CONFIG_BAD_VALUES)
def test_the_config_refuses_a_bad_value_when_it_is_made(name, key, value, message):
    config_cls = ALGORITHMS.entry(name).config_cls
    for make in (
        lambda: config_cls(**{key: value}),  # as a user, or OmegaConf.to_object, makes it
        lambda: dataclasses.replace(config_cls(), **{key: value}),  # as with_config does
    ):
        with pytest.raises(ValueError) as err:
            make()
        assert str(err.value).startswith(message), str(err.value)


def test_fomaml_config_refuses_second_order():
    with pytest.raises(ValueError, match="algorithm=fomaml is first order; use algorithm=maml"):
        ALGORITHMS.entry("fomaml").config_cls(first_order=False)


def test_a_bad_algorithm_value_is_refused_by_to_objects():
    # What the run directory's guard calls before it compares a rerun's config with the run's.
    with pytest.raises(ValueError, match=r"^algorithm.inner_lr must be > 0, got -1.0$"):
        to_objects(compose_config(["+experiment=sinusoid_maml", "algorithm.inner_lr=-1"]))


@pytest.mark.parametrize("name", [n for n in NAMES if n not in CLASSIFIERS])
def test_a_rate_passed_as_data_is_the_rate_the_learner_is_built_with(name):
    # The runner builds the learner once, outside jit, and passes its hyperparameters back as
    # arguments of the compiled step (TaskContext.hyper): a rate passed so gives exactly the
    # learner built at that rate, through one compiled program for every rate. In float64, so
    # that "exactly" means to rounding (1e-11 here), whatever code XLA generates.
    overrides = {"inner_steps": 2} if name == "mamlpp" else {}
    learner, model = build(name, **overrides)
    assert set(learner.hyper) == {"inner_lr"}  # the config's hyperparameter() fields
    batches, _ = task_pool("sine")
    traces = []
    with jax.enable_x64(True):
        meta_params = to64(learner.init(jax.random.key(0), init_params(model, 1)))
        task = to64(jax.tree_util.tree_map(lambda x: x[0, 0], batches))

        def grad_and_metrics(rate):
            traces.append(rate)
            ctx = CTX._replace(hyper={"inner_lr": rate})
            return learner.task_grad(meta_params, task, ctx)[0], learner.evaluate(
                meta_params, task, ctx, (0, 1)
            )

        compiled = jax.jit(grad_and_metrics)
        for rate in (0.003, 0.02):
            passed = compiled(np.float64(rate))
            rebuilt, _ = build(name, **overrides, inner_lr=rate)
            own = (
                rebuilt.task_grad(meta_params, task, CTX)[0],
                rebuilt.evaluate(meta_params, task, CTX, (0, 1)),
            )
            for x, y in zip(
                jax.tree_util.tree_leaves(passed), jax.tree_util.tree_leaves(own), strict=True
            ):
                assert x.dtype == y.dtype == np.float64
                np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12)
    assert len(traces) == 1  # one trace, one compilation, for both rates


# The check: the post-adaptation query loss (after the algorithm's own inner_steps) on 96 held-out
# tasks, after 300 meta-steps on meta-batches of 8, is below 0.85 x the loss of the untrained
# model before adapting (sinusoid: a random 1-40-40-1 MLP, MSE ~3.4 on these tasks, about that of
# predicting zero; measured after training: 0.29 (reptile) to 0.81 (anil) of it), and adapting
# helps the trained initialisation (it does not help the untrained one: MAML's MSE after one step
# from the random initialisation is ~7). Protonet: cross-entropy and accuracy on Gaussian-cluster
# tasks (accuracy ~0.35 before, ~0.9 after); R2D2 on the same tasks (0.36 before, 0.81 after).
OUTER = {"reptile": optax.sgd(1.0)}  # epsilon = 1 on the meta-batch mean (Nichol et al.)
OVERRIDES = {
    "mamlpp": {"inner_steps": 2},  # compile time; annealing and LSLR stay on
    # The dual for the tasks' ways, not 25 classes, solved to 1e-4: the default 1e-6 doubles
    # the test's time (31 s against 15 s alone) for the same losses and accuracies; the solver's
    # tolerances are checked in test_metaoptnet.py.
    "metaoptnet_svm": {"max_ways": WAYS, "tolerance": 1e-4},
}


@pytest.mark.parametrize("name", [n for n in NAMES if n not in PRETRAINED])
def test_meta_training_under_jit_and_vmap_reduces_the_loss(name):
    learner, model = build(name, **OVERRIDES.get(name, {}))
    meta_params = learner.init(jax.random.key(0), init_params(model, 1))
    batches, held_out = task_pool("clusters" if name in CLASSIFIERS else "sine")
    inner_steps = getattr(learner_config(name), "inner_steps", 0)
    evaluate = jax.jit(jax.vmap(learner.evaluate, in_axes=(None, 0, None, None)), static_argnums=3)

    def mean_metrics(params):
        out = evaluate(params, held_out, CTX, (0, inner_steps))
        return {k: np.asarray(v).mean(0) for k, v in out.items()}

    before = mean_metrics(meta_params)
    optimizer = OUTER.get(name, optax.adam(1e-3))
    trained, metrics = meta_train(learner, meta_params, batches, optimizer)
    after = mean_metrics(trained)
    assert all(np.all(np.isfinite(x)) for x in jax.tree_util.tree_leaves((trained, metrics)))
    if name == "r2d2":  # its logits' scale starts at 1 and is learned slowly at Adam 1e-3
        assert after["loss"][0] < 0.8 * before["loss"][0]  # measured 0.66 x
        assert after["accuracy"][0] > 0.75 > before["accuracy"][0] + 0.3  # 0.36 -> 0.81
    elif name in CLASSIFIERS:
        assert after["loss"][0] < 0.5 * before["loss"][0]
        assert after["accuracy"][0] > 0.8 > before["accuracy"][0] + 0.2
    else:
        assert after["mse"][1] < 0.85 * before["mse"][0], (before, after)
        assert after["mse"][1] < after["mse"][0], (before, after)


def learner_config(name):
    return dataclasses.replace(ALGORITHMS.entry(name).config_cls(), **OVERRIDES.get(name, {}))
