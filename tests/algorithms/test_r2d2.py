"""R2D2: the ridge head against NumPy's solve in float64, its meta-gradient against finite
differences, padding, the linear-head equivalence of ``adapt`` and the one-line refusals."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.algorithms.r2d2 import R2D2Config, r2d2, ridge_head
from metalearn.data.task import Task, WeightedBatch
from metalearn.models.base import ModelParts, model_from_flax
from metalearn.models.mlp import MLP
from tests.algorithms.problems import (
    CTX,
    WAYS,
    cluster_model,
    cluster_task,
    init_params,
    problem,
    random_like,
    sine_model,
    sine_task,
    to64,
    tree_vdot,
)

# The reference code's head options (bertinetto/r2d2: scripts/train/conf/fewshots.yaml).
REFERENCE = dict(learn_lambda=False, lambda_init=50.0, solved_bias=True, support_normalised=True)


def numpy_ridge(x, y, lam):
    """``(X^T X + lambda I)^-1 X^T Y`` and ``X^T (X X^T + lambda I)^-1 Y`` in float64."""
    n, d = x.shape
    primal = np.linalg.solve(x.T @ x + lam * np.eye(d), x.T @ y)
    dual = x.T @ np.linalg.solve(x @ x.T + lam * np.eye(n), y)
    return primal, dual


@pytest.mark.parametrize("n, d", [(12, 5), (5, 12)])
def test_ridge_head_equals_numpy_in_both_forms(n, d):
    rng = np.random.default_rng(n)
    x, y, lam = rng.normal(size=(n, d)), np.eye(3)[rng.integers(0, 3, n)], 0.7
    primal, dual = numpy_ridge(x, y, lam)
    np.testing.assert_allclose(primal, dual, rtol=1e-9, atol=1e-12)  # Woodbury's identity
    ridge = jax.jit(ridge_head, static_argnums=3)  # one compiled program per form, not op by op
    with jax.enable_x64(True):
        for form in ("primal", "dual", "auto"):
            got = np.asarray(ridge(jnp.asarray(x), jnp.asarray(y), lam, form))
            np.testing.assert_allclose(got, primal, rtol=1e-10, atol=1e-12)
    # float32, as training runs: the two forms agree to float32 rounding
    forms = [
        ridge(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32), lam, f)
        for f in ("primal", "dual")
    ]
    np.testing.assert_allclose(forms[0], primal, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(forms[1], primal, rtol=1e-4, atol=1e-5)


def reference_logits(model, meta_params, task, num_classes):
    """The query logits by NumPy: embed, solve the primal system in float64, scale and offset."""
    embed = jax.jit(lambda params, x: model.model.embed(params, {}, None, x, True)[0])
    emb = lambda x: np.asarray(embed(meta_params["params"], x), np.float64)  # noqa: E731
    xs, xq = emb(task.support[0]), emb(task.query[0])
    y = np.eye(num_classes)[np.asarray(task.support[1])]
    head = {k: float(v) for k, v in meta_params["head"].items()}
    w, _ = numpy_ridge(xs, y, np.exp(head["log_lambda"]))
    logits = head["scale"] * xq @ w + head["bias"]
    return np.where(y.sum(0) > 0, logits, -np.inf)


@pytest.mark.parametrize("shots, form", [(1, "auto"), (10, "auto"), (2, "primal"), (2, "dual")])
def test_query_loss_equals_the_numpy_head(shots, form):
    model = cluster_model()  # embedding of 32 features: 5 support examples -> dual, 50 -> primal
    learner = r2d2(model.objective, form=form, lambda_init=0.5, scale_init=2.0, bias_init=0.3)
    meta_params = learner.init(None, init_params(model))
    task = cluster_task(jax.random.key(shots), shots=shots, queries=3)
    _, aux = jax.jit(learner.task_grad)(meta_params, task, CTX)
    logits = reference_logits(model, meta_params, task, WAYS * shots)
    want = jax.jit(model.loss)(jnp.asarray(logits, jnp.float32), task.query[1])
    np.testing.assert_allclose(aux.metrics["loss"], want, rtol=2e-4)


@functools.cache
def tiny_model():
    parts = ModelParts(head="head", embed="embed")
    return problem(model_from_flax(MLP((6, 4), 3, "tanh"), (3,), parts), "classification")


def tiny_task(shots, seed=0):
    rng = np.random.default_rng(seed)
    labels = np.tile(np.arange(3), shots)
    xs, xq = rng.normal(size=(3 * shots, 3)), rng.normal(size=(6, 3))
    return Task(
        (jnp.asarray(xs), jnp.asarray(labels)), (jnp.asarray(xq), jnp.tile(jnp.arange(3), 2))
    )


@pytest.mark.parametrize("shots", [1, 3])  # 3 < 4 features: dual; 9 >= 4: primal
def test_meta_gradient_equals_finite_differences_in_float64(shots):
    model = tiny_model()
    with jax.enable_x64(True):
        learner = r2d2(model.objective, lambda_init=0.8, scale_init=1.5, bias_init=0.2)
        meta_params = to64(learner.init(None, init_params(model)))
        task = jax.tree_util.tree_map(
            lambda a: a if jnp.issubdtype(a.dtype, jnp.integer) else jnp.asarray(a, jnp.float64),
            tiny_task(shots),
        )
        task_grad = jax.jit(learner.task_grad)  # compiled once, for the differences too
        grads, _ = task_grad(meta_params, task, CTX)
        loss = lambda mp: task_grad(mp, task, CTX)[1].metrics["loss"]  # noqa: E731
        eps = 1e-6
        for name in ("scale", "bias", "log_lambda"):  # each learned scalar on its own
            step = lambda s, n=name: {  # noqa: E731
                **meta_params,
                "head": {**meta_params["head"], n: meta_params["head"][n] + s},
            }
            numeric = (loss(step(eps)) - loss(step(-eps))) / (2 * eps)
            np.testing.assert_allclose(grads["head"][name], numeric, rtol=1e-6, atol=1e-9)
            if name == "bias":  # one offset on every logit: the softmax does not see it
                assert abs(float(grads["head"][name])) < 1e-12
            else:  # the check has something to compare
                assert abs(float(grads["head"][name])) > 1e-6
        direction = random_like(meta_params["params"], jax.random.key(3))

        @jax.jit  # one compiled program, not op by op
        def moved(s):
            shift = lambda p, v: p + s * v  # noqa: E731
            return {
                **meta_params,
                "params": jax.tree_util.tree_map(shift, meta_params["params"], direction),
            }

        numeric = (loss(moved(eps)) - loss(moved(-eps))) / (2 * eps)
        analytic = jax.jit(tree_vdot)(grads["params"], direction)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-6)
        np.testing.assert_array_equal(grads["params"]["head"]["kernel"], 0.0)  # head not used


@pytest.mark.parametrize("options", [{}, REFERENCE], ids=["default", "reference"])
def test_padded_episode_equals_the_unpadded_one(options):
    model = cluster_model()
    learner = r2d2(model.objective, **options)
    meta_params = learner.init(None, init_params(model))
    task = cluster_task(jax.random.key(4), shots=2, queries=3)
    pad = lambda batch, k: WeightedBatch(  # noqa: E731
        jnp.concatenate([batch[0], 5.0 + jnp.zeros((k, batch[0].shape[1]))]),
        jnp.concatenate([batch[1], -jnp.ones(k, batch[1].dtype)]),
        jnp.concatenate([jnp.ones(len(batch[1])), jnp.zeros(k)]),
    )
    padded = Task(pad(task.support, 3), pad(task.query, 2))
    grads, aux = jax.jit(learner.task_grad)(meta_params, task, CTX)
    padded_grads, padded_aux = jax.jit(learner.task_grad)(meta_params, padded, CTX)
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(padded_aux.metrics[key], aux.metrics[key], rtol=1e-5)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6), padded_grads, grads
    )


def reference_form_logits(model, meta_params, task, num_classes, lam=50.0):
    """The reference code's head (bertinetto/r2d2 ``RRNet.loss``) by NumPy in float64: a column
    of ones appended, X and Y divided by sqrt(n), lambda fixed; ``scale * (X_q W + b) +
    offset``."""
    embed = jax.jit(lambda params, x: model.model.embed(params, {}, None, x, True)[0])
    emb = lambda x: np.asarray(embed(meta_params["params"], x), np.float64)  # noqa: E731
    xs, xq = emb(task.support[0]), emb(task.query[0])
    n = len(xs)
    y = np.eye(num_classes)[np.asarray(task.support[1])]
    wb = np.linalg.solve(  # the primal system, as the reference's rr_standard
        (a := np.hstack([xs, np.ones((n, 1))]) / np.sqrt(n)).T @ a + lam * np.eye(a.shape[1]),
        a.T @ (y / np.sqrt(n)),
    )
    out = xq @ wb[:-1] + wb[-1]
    head = {k: float(v) for k, v in meta_params["head"].items()}
    return np.where(y.sum(0) > 0, head["scale"] * out + head["bias"], -np.inf)


@pytest.mark.parametrize("shots", [1, 10])  # 5 < 33 columns: dual; 50: primal
def test_the_reference_codes_head_equals_numpy_and_its_gradient_finite_differences(shots):
    """``solved_bias``, ``support_normalised`` and a fixed lambda: the query loss equals the
    reference's computation in NumPy (float64), lambda is no meta-parameter, and the gradient
    equals central differences through the solved bias."""
    model = cluster_model()
    with jax.enable_x64(True):
        learner = r2d2(model.objective, scale_init=0.7, bias_init=0.1, **REFERENCE)
        meta_params = to64(learner.init(None, init_params(model)))
        assert sorted(meta_params["head"]) == ["bias", "scale"]
        task = jax.tree_util.tree_map(
            lambda a: a if jnp.issubdtype(a.dtype, jnp.integer) else jnp.asarray(a, jnp.float64),
            cluster_task(jax.random.key(shots), shots=shots, queries=3),
        )
        task_grad = jax.jit(learner.task_grad)  # compiled once, for the differences too
        grads, aux = task_grad(meta_params, task, CTX)
        logits = reference_form_logits(model, meta_params, task, WAYS * shots)
        want = jax.jit(model.loss)(jnp.asarray(logits), task.query[1])
        np.testing.assert_allclose(aux.metrics["loss"], want, rtol=1e-10)
        loss = lambda mp: task_grad(mp, task, CTX)[1].metrics["loss"]  # noqa: E731
        direction = random_like(meta_params["params"], jax.random.key(7))

        @jax.jit  # one compiled program, not op by op
        def moved(s):
            shift = lambda p, v: p + s * v  # noqa: E731
            return {
                **meta_params,
                "params": jax.tree_util.tree_map(shift, meta_params["params"], direction),
            }

        numeric = (loss(moved(1e-6)) - loss(moved(-1e-6))) / 2e-6
        analytic = jax.jit(tree_vdot)(grads["params"], direction)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-6)
    # adapt writes the solved bias into the model's head
    learner = r2d2(model.objective, scale_init=3.0, bias_init=-0.5, **REFERENCE)
    meta_params = learner.init(None, init_params(model))
    task = cluster_task(jax.random.key(5), shots=3, queries=4)
    adapted = jax.jit(learner.adapt, static_argnums=3)(meta_params, task.support, CTX, 0)
    logits = reference_form_logits(model, meta_params, task, WAYS)
    predicted = jax.jit(model.apply)(adapted, task.query[0])
    np.testing.assert_allclose(predicted, logits, rtol=1e-3, atol=1e-4)


def test_adapted_head_predicts_like_the_ridge_head():
    model = cluster_model()
    learner = r2d2(model.objective, scale_init=3.0, bias_init=-0.5)
    meta_params = learner.init(None, init_params(model))
    task = cluster_task(jax.random.key(5), shots=3, queries=4)
    adapted = jax.jit(learner.adapt, static_argnums=3)(meta_params, task.support, CTX, 0)
    logits = reference_logits(model, meta_params, task, WAYS)
    predicted = jax.jit(model.apply)(adapted, task.query[0])
    np.testing.assert_allclose(predicted, logits, rtol=1e-3, atol=1e-4)
    body = {k: v for k, v in adapted.items() if k != "head"}
    jax.tree_util.tree_map(
        np.testing.assert_array_equal,
        body,
        {k: v for k, v in meta_params["params"].items() if k != "head"},
    )


def test_regression_family_is_refused_in_one_line():
    model = sine_model()
    learner = r2d2(model.objective)
    meta_params = learner.init(None, init_params(model))
    with pytest.raises(
        ValueError,
        match=r"^algorithm=r2d2 needs a classification task family "
        r"\(integer class labels.*regression tasks such as sinusoid have no classes"
        r"[^\n]*targets of\)",
    ):
        jax.jit(learner.task_grad)(meta_params, sine_task(1), CTX)  # refused while tracing


def test_model_without_an_embedding_is_refused():
    model = problem(model_from_flax(MLP((8,), 3), (4,), ModelParts(head="head")), "classification")
    with pytest.raises(
        ValueError,
        match=r"^algorithm=r2d2 needs a model that declares an "
        r"embedding \(ModelParts\(embed=\.\.\.\)",
    ):
        r2d2(model.objective)


@pytest.mark.parametrize(
    "kwargs, key", [({"lambda_init": 0.0}, "lambda_init"), ({"form": "svd"}, "form")]
)
def test_bad_config_values_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=rf"^algorithm\.{key} must be"):
        R2D2Config(**kwargs)
