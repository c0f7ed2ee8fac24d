"""MetaOptNet-SVM: the dual's solution against scipy's SLSQP and the KKT conditions, the implicit
gradient against central finite differences, padding, the linear-head equivalence, the errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import minimize

from metalearn.algorithms.metaoptnet import (
    MetaOptNetSVMConfig,
    metaoptnet_svm,
    project_rows,
    svm_dual,
    svm_logits,
)
from metalearn.data.task import Task, WeightedBatch
from tests.algorithms.problems import (
    CTX,
    WAYS,
    cluster_model,
    cluster_task,
    init_params,
    sine_model,
    sine_task,
)

C = 0.1


def episode(seed, n_per_class=3, ways=3, dim=6, absent=0):
    """Support features [n, dim] and one-hot labels [n, ways + absent] (absent: empty columns)."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(ways), n_per_class)
    means = rng.normal(size=(ways, dim))
    x = means[labels] + 0.8 * rng.normal(size=(labels.size, dim))
    return x, np.eye(ways + absent)[labels]


def scipy_dual(x, onehot, c=C):
    """The dual solved by SLSQP in float64, on the flattened ``n * classes`` variables."""
    n, k = onehot.shape
    hessian = np.kron(x @ x.T + np.eye(n), np.eye(k))  # variable (i, k) at i * k + k
    target = onehot.ravel()
    present = np.repeat(onehot.sum(0)[None] > 0, n, axis=0).ravel()
    constraints = [
        {
            "type": "eq",
            "fun": lambda a: a.reshape(n, k).sum(1),
            "jac": lambda a: np.kron(np.eye(n), np.ones(k)),
        },
        {"type": "ineq", "fun": lambda a: c * target - a, "jac": lambda a: -np.eye(n * k)},
    ]
    bounds = [(None, None) if p else (0.0, 0.0) for p in present]
    result = minimize(
        lambda a: 0.5 * a @ hessian @ a - target @ a,
        np.zeros(n * k),
        jac=lambda a: hessian @ a - target,
        constraints=constraints,
        bounds=bounds,
        method="SLSQP",
        options={"ftol": 1e-15, "maxiter": 1000},
    )
    assert result.success, result.message
    return result.x.reshape(n, k)


def solve64(x, onehot, tolerance=1e-12, iterations=20000):
    with jax.enable_x64(True):
        gram = jnp.asarray(x @ x.T, jnp.float64)
        alpha, residual, steps = jax.jit(svm_dual, static_argnums=(2, 3, 4, 5))(
            gram, jnp.asarray(onehot, jnp.float64), C, iterations, tolerance, 2000
        )
        return np.asarray(alpha), float(residual), int(steps)


def test_projection_equals_a_hand_computation():
    z = jnp.array([[0.5, 0.2, 3.0], [1.0, 1.0, 1.0], [0.3, -0.1, 0.0]])
    got = jax.jit(project_rows)(z, jnp.array([1.0, 0.3, 0.0]), jnp.array([True, True, False]))
    # Row 1: the masked 3.0 drops; 0.5 and 0.2 shift by 0.15 to sum to 1. Row 2: 1, 1 shift by
    # 0.85 to sum to 0.3. Row 3: radius 0 leaves nothing.
    np.testing.assert_allclose(
        got, [[0.65, 0.35, 0.0], [0.15, 0.15, 0.0], [0.0, 0.0, 0.0]], atol=1e-6
    )


@pytest.mark.parametrize("seed,absent", [(0, 0), (1, 0), (2, 2), (3, 1)])
def test_solution_equals_slsqp_and_satisfies_kkt(seed, absent):
    x, onehot = episode(seed, absent=absent)
    alpha, residual, _ = solve64(x, onehot)
    reference = scipy_dual(x, onehot)
    np.testing.assert_allclose(alpha, reference, atol=1e-7)
    assert residual < 1e-12
    # KKT: feasibility; stationarity with one multiplier per example on its free coordinates,
    # and nonnegative bound multipliers on the active ones.
    np.testing.assert_allclose(alpha.sum(1), 0.0, atol=1e-12)
    assert np.all(alpha <= C * onehot + 1e-12)
    grad = (x @ x.T + np.eye(len(x))) @ alpha - onehot
    present = onehot.sum(0) > 0
    for i in range(len(x)):
        free = present & (alpha[i] < C * onehot[i] - 1e-9)
        assert free.any()
        nu = -grad[i, free].mean()
        np.testing.assert_allclose(grad[i, free] + nu, 0.0, atol=1e-9)
        assert np.all(grad[i, present & ~free] + nu <= 1e-9)
    np.testing.assert_array_equal(alpha[:, ~present], 0.0)


def test_float32_reaches_the_tolerance_and_the_slsqp_solution():
    x, onehot = episode(4, n_per_class=5, ways=5, dim=64)
    alpha, residual, _ = jax.jit(svm_dual, static_argnums=(2, 3, 4, 5))(
        jnp.asarray(x @ x.T, jnp.float32), jnp.asarray(onehot, jnp.float32), C, 2000, 1e-5, 500
    )
    assert float(residual) <= 1e-5
    np.testing.assert_allclose(alpha, scipy_dual(x, onehot), atol=2e-5)


def central_difference(f, x, direction, eps=1e-6):
    return (f(x + eps * direction) - f(x - eps * direction)) / (2 * eps)


@pytest.mark.parametrize("seed", [0, 5])
def test_implicit_gradient_equals_finite_differences(seed):
    x, onehot = episode(seed, absent=1)
    rng = np.random.default_rng(seed + 100)
    queries, query_labels = rng.normal(size=(4, 6)), np.array([0, 1, 2, 1])
    mixing = rng.normal(size=(onehot.shape[1], x.shape[1]))
    config = MetaOptNetSVMConfig(iterations=20000, tolerance=1e-13, backward_iterations=2000)
    with jax.enable_x64(True):
        hot = jnp.asarray(onehot)

        def weights_scalar(support):  # a scalar of W = alpha^T X
            gram = support @ support.T
            alpha = svm_dual(gram, hot, C, 20000, 1e-13, 2000)[0]
            return jnp.sum(jnp.sin(alpha.T @ support) * mixing)

        def query_loss(support, query, scale):
            logits, _ = svm_logits(support, hot, query, scale, config)
            logits = logits[:, :3]  # the absent class's -inf column
            picked = jnp.take_along_axis(logits, jnp.asarray(query_labels)[:, None], 1)
            return jnp.mean(jax.nn.logsumexp(logits, axis=1) - picked[:, 0])

        support, query, scale = jnp.asarray(x), jnp.asarray(queries), jnp.asarray(1.7)
        # Values and gradients each one compiled program, not op by op.
        for f, argnums in ((jax.jit(weights_scalar), None), (jax.jit(query_loss), (0, 1, 2))):
            args = (support,) if argnums is None else (support, query, scale)
            grads = jax.jit(jax.grad(f, argnums=argnums or 0))(*args)
            grads = grads if argnums else (grads,)
            for j, (arg, grad) in enumerate(zip(args, grads, strict=True)):
                for d in range(3):
                    direction = jnp.asarray(rng.normal(size=np.shape(arg)))

                    def along(t, j=j, args=args, f=f):
                        moved = list(args)
                        moved[j] = t
                        return f(*moved)

                    want = central_difference(along, arg, direction)
                    got = jnp.sum(grad * direction)
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-8, err_msg=f"{d}")


def pad(batch, extra, key):
    x, y = batch
    noise = jax.random.normal(key, (extra, x.shape[1]))
    return WeightedBatch(
        jnp.concatenate([x, noise]),
        jnp.concatenate([y, -jnp.ones(extra, y.dtype)]),
        jnp.concatenate([jnp.ones(len(y)), jnp.zeros(extra)]),
    )


def test_padded_episode_equals_the_unpadded_one():
    model = cluster_model()
    learner = metaoptnet_svm(model.objective, tolerance=1e-7)
    meta = learner.init(None, init_params(model))
    task = cluster_task(jax.random.key(3), shots=2, queries=3)
    padded = Task(pad(task.support, 4, jax.random.key(4)), pad(task.query, 2, jax.random.key(5)))
    step = jax.jit(learner.task_grad)
    grads, aux = step(meta, task, CTX)
    padded_grads, padded_aux = step(meta, padded, CTX)
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(padded_aux.metrics[key], aux.metrics[key], rtol=1e-5)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=2e-6), padded_grads, grads
    )
    assert float(jnp.abs(grads["scale"])) > 0  # the scale is meta-learned
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads))


def test_max_ways_changes_only_the_columns_solved_for():
    model = cluster_model()
    task = cluster_task(jax.random.key(6), shots=3, queries=2)
    results = []
    for max_ways in (0, WAYS, WAYS + 2):
        learner = metaoptnet_svm(model.objective, max_ways=max_ways, tolerance=1e-7)
        meta = learner.init(None, init_params(model))
        results.append(jax.jit(learner.task_grad)(meta, task, CTX))
    for grads, aux in results[1:]:
        np.testing.assert_allclose(aux.metrics["loss"], results[0][1].metrics["loss"], rtol=1e-5)
        jax.tree_util.tree_map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=2e-6),
            grads,
            results[0][0],
        )
    with pytest.raises(ValueError, match="algorithm.max_ways of metaoptnet_svm must be >= 0"):
        MetaOptNetSVMConfig(max_ways=-1)


def test_adapted_head_predicts_like_the_svm():
    model = cluster_model()
    learner = metaoptnet_svm(model.objective)
    meta = learner.init(None, init_params(model))
    meta["scale"] = jnp.asarray(2.5)
    task = cluster_task(jax.random.key(2), shots=3, queries=4)
    adapted = jax.jit(learner.adapt, static_argnums=3)(meta, task.support, CTX, 0)

    @jax.jit  # one compiled program, not op by op
    def head_logits(meta, task):
        emb = lambda x: model.model.embed(meta["params"], {}, None, x, True)[0]  # noqa: E731
        onehot = jax.nn.one_hot(task.support[1], WAYS)
        config = learner_config()
        return svm_logits(emb(task.support[0]), onehot, emb(task.query[0]), 2.5, config)[0]

    logits = head_logits(meta, task)
    predicted = jax.jit(model.apply)(adapted, task.query[0])
    np.testing.assert_allclose(predicted, logits, rtol=1e-4, atol=1e-5)
    evaluated = jax.jit(learner.evaluate, static_argnums=3)(meta, task, CTX, (0, 5))
    want = np.mean(np.argmax(logits, 1) == np.asarray(task.query[1]))
    np.testing.assert_allclose(evaluated["accuracy"], [want, want], rtol=1e-6)


def learner_config():
    return MetaOptNetSVMConfig()


def test_one_line_errors():
    model = sine_model()
    with pytest.raises(ValueError, match="declares an embedding"):
        metaoptnet_svm(model.objective._replace(model=model.model._replace(embed=None)))
    learner = metaoptnet_svm(model.objective)
    meta = learner.init(None, init_params(model))
    with pytest.raises(ValueError, match="classification task family"):
        learner.task_grad(meta, sine_task(1), CTX)
    with pytest.raises(ValueError, match="algorithm.c of metaoptnet_svm must be > 0"):
        MetaOptNetSVMConfig(c=0.0)
    with pytest.raises(ValueError, match="algorithm.iterations"):
        MetaOptNetSVMConfig(iterations=0)
    cluster = cluster_model()
    meta = metaoptnet_svm(cluster.objective).init(None, init_params(cluster))
    meta["params"] = {**meta["params"], "head": {"kernel": meta["params"]["head"]["kernel"]}}
    task = cluster_task(jax.random.key(0))
    with pytest.raises(ValueError, match="head of one Dense entry"):
        metaoptnet_svm(cluster.objective).adapt(meta, task.support, CTX, 0)


def test_max_ways_below_the_episodes_ways_is_refused_before_the_run(tmp_path):
    # The solver would treat the examples of labels >= max_ways as padding: a silent loss of
    # classes. The config says both numbers, so the run is refused before it is built.
    from metalearn.config import to_objects
    from tests.conftest import compose_config, runner_of

    overrides = [
        "+experiment=omniglot_5w1s_protonet_cpu",
        "+debug=tiny",
        "algorithm=metaoptnet_svm",
    ]
    cfg = to_objects(compose_config([*overrides, "algorithm.max_ways=3"]))
    # This experiment trains on 60-way episodes (data.train_ways) and tests on 5-way ones.
    with pytest.raises(ValueError, match=r"algorithm.max_ways=3 is below the episodes' 60 ways"):
        runner_of(cfg, tmp_path)


def test_label_smoothing_of_the_training_loss_equals_its_formula():
    """With ``label_smoothing`` the meta-gradient is that of the cross-entropy against targets
    ``1 - eps`` on the label and ``eps / (ways - 1)`` on each other class present in the
    support set (the reference's, over the episode's ways), written here in NumPy terms; a
    class absent from the support set (logit -inf) gets no mass; the metrics stay the plain
    cross-entropy, and evaluation is unchanged."""
    from metalearn.algorithms.embedding import query_classifier

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((8, 3)), rng.standard_normal((3, 5))
    labels = np.array([0, 1, 2, 3, 0, 1, 2, 3])  # class 4 absent from the support set

    def logits_and_state(meta, task, ctx, train):
        present = jnp.arange(5) < 4
        return jnp.where(present, task.query[0] @ meta["w"], -jnp.inf), {}, {}

    eps = 0.1
    grad_fn, evaluate = query_classifier(logits_and_state, label_smoothing=eps)
    plain_grad, plain_evaluate = query_classifier(logits_and_state)
    with jax.enable_x64(True):
        task = Task((jnp.zeros((4, 1)), jnp.arange(4)), (jnp.asarray(x), jnp.asarray(labels)))
        meta = {"w": jnp.asarray(w)}
        grads, aux = jax.jit(grad_fn)(meta, task, None)

        def smoothed(w):
            z = jnp.asarray(x) @ w[:, :4]
            log_p = z - jax.scipy.special.logsumexp(z, axis=1, keepdims=True)
            targets = np.full((8, 4), eps / 3)
            targets[np.arange(8), labels] = 1 - eps
            return -jnp.mean(jnp.sum(targets * log_p, axis=1))

        expected = jax.jit(jax.grad(smoothed))(meta["w"])
        np.testing.assert_allclose(grads["w"], expected, rtol=1e-12)
        assert np.all(np.asarray(grads["w"])[:, 4] == 0)
        plain_loss = jax.jit(plain_grad)(meta, task, None)[1].metrics["loss"]
        np.testing.assert_allclose(aux.metrics["loss"], plain_loss, rtol=1e-12)
        evaluated, plain_evaluated = (
            jax.jit(e, static_argnums=3)(meta, task, None, (0,)) for e in (evaluate, plain_evaluate)
        )
        assert evaluated == plain_evaluated
