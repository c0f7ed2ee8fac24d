"""Baseline and Baseline++ (Chen et al. 2019): the test-time fine-tuning against PyTorch's SGD
and autograd in float64 (the reference's ``nn.Linear`` and weight-normalised ``distLinear``),
the cosine head against its formula in NumPy, pretraining on class-labelled episodes, the
linear head ``adapt`` writes, and the one-line refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.algorithms.base import context
from metalearn.algorithms.baseline import (
    baseline,
    baseline_pp,
    cosine_logits,
    finetune_batches,
    linear_init,
)
from metalearn.config import to_objects
from metalearn.data.class_split import ClassSplit
from metalearn.data.episode_settings import check_episode_settings
from metalearn.data.episodes import episode_distribution
from metalearn.data.task import Task, WeightedBatch, supervised_objective
from metalearn.models.base import ModelParts, model_from_flax
from metalearn.models.mlp import MLP
from metalearn.runner.preflight import check_train_labels
from tests.algorithms.problems import to64
from tests.conftest import compose_config

DIM, OUTPUTS = 6, 12


def mlp_model(outputs: int = OUTPUTS):
    return model_from_flax(MLP((16, 8), outputs), (DIM,), ModelParts(head="head", embed="embed"))


def episode(seed: int, ways: int = 5, shots: int = 2, queries: int = 3) -> Task:
    rng = np.random.default_rng(seed)
    means = 2.0 * rng.standard_normal((ways, DIM))

    def draw(n):
        labels = np.repeat(np.arange(ways), n)
        return jnp.asarray(means[labels] + rng.standard_normal((ways * n, DIM))), jnp.asarray(
            labels
        )

    return Task(draw(shots), draw(queries))


def torch_fine_tuning(x_s, y_s, x_q, y_q, init, cosine, steps, sgd, batches, scale):
    """The query cross-entropy after each of ``steps`` steps of the reference's fine-tuning:
    ``torch.optim.SGD(**sgd)`` on a new ``nn.Linear`` head (Baseline) or on the
    weight-normalised, bias-free one scoring normalised features (Baseline++'s ``distLinear``),
    step ``i`` on the support examples ``batches[i]`` (None: all)."""
    torch = pytest.importorskip("torch")
    from torch.nn.utils.parametrizations import weight_norm

    t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float64)  # noqa: E731
    ways, dim = int(np.max(y_s)) + 1, np.shape(x_s)[1]
    if cosine:
        layer = torch.nn.Linear(dim, ways, bias=False).double()
        layer.weight.data = t(init["v"][:, :ways]).T.contiguous()
        layer = weight_norm(layer, "weight", dim=0)  # g starts at the rows' norms, as ours
        normalised = lambda x: x / (x.norm(dim=1, keepdim=True) + 1e-5)  # noqa: E731
        forward = lambda x: scale * layer(normalised(x))  # noqa: E731
    else:
        layer = torch.nn.Linear(dim, ways).double()
        layer.weight.data = t(init["kernel"][:, :ways]).T.contiguous()
        layer.bias.data = t(init["bias"][:ways])
        forward = layer
    optimizer = torch.optim.SGD(layer.parameters(), **sgd)
    x_s, x_q = t(x_s), t(x_q)
    y_s, y_q = torch.tensor(np.asarray(y_s)), torch.tensor(np.asarray(y_q))
    losses = []
    for step in range(max(steps) + 1):
        if step in steps:
            with torch.no_grad():
                losses.append(float(torch.nn.functional.cross_entropy(forward(x_q), y_q)))
        if step == max(steps):
            break
        batch = slice(None) if batches is None else torch.tensor(batches[step])
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(forward(x_s[batch]), y_s[batch]).backward()
        optimizer.step()
    return np.array(losses)


@pytest.mark.parametrize("batch_size, dampening", [(0, 0.0), (4, 0.9)], ids=["full", "reference"])
@pytest.mark.parametrize("cosine", [False, True], ids=["baseline", "baseline_pp"])
def test_fine_tuning_equals_pytorch_sgd_in_float64(cosine, batch_size, dampening):
    """The new head's trajectory: query losses after 0, 1, 10 and 100 steps equal those of
    PyTorch's SGD (momentum, dampening, weight decay) from the same start, on the same support
    examples each step: all of them, or the reference's mini-batches of 4 (epochs of 4 + 4 + 2
    here). The support set of 5 ways x 2 shots gives a head of 10 columns, 5 of them absent
    classes that must not count."""
    factory = baseline_pp if cosine else baseline
    steps = (0, 1, 10, 100)
    lr = 0.05 / (1 - dampening)  # the same steady step: dampening scales the buffer's input
    sgd = dict(lr=lr, momentum=0.9, dampening=dampening, weight_decay=0.001)
    with jax.enable_x64(True):
        model = mlp_model()
        params, state = jax.jit(model.init)(jax.random.key(0))
        learner = factory(
            supervised_objective(model, "classification"),
            finetune_lr=sgd["lr"],
            momentum=sgd["momentum"],
            dampening=dampening,
            weight_decay=sgd["weight_decay"],
            finetune_batch_size=batch_size,
        )
        meta = to64(learner.init(jax.random.key(1), params))
        task = episode(3)
        key = jax.random.key(4)
        # Each computation one compiled program, not op by op.
        evaluate = jax.jit(learner.evaluate, static_argnums=3)
        ours = evaluate(meta, task, context(state, key), steps)["loss"]
        features = jax.jit(lambda x: model.embed(meta["params"], state, None, x, False)[0])
        support_size = task.support[1].shape[0]
        x_s = features(task.support[0])
        head_key = jax.random.fold_in(key, 2)
        init = jax.jit(linear_init, static_argnums=(1, 2, 3))(
            head_key, x_s.shape[1], support_size, cosine
        )
        batches = None
        if batch_size:
            indices, used = jax.jit(finetune_batches, static_argnums=(2, 3))(
                jax.random.fold_in(head_key, 1),
                jnp.ones(support_size, bool),
                batch_size,
                max(steps),
            )
            indices, used = np.asarray(indices), np.asarray(used)
            batches = [i[u] for i, u in zip(indices, used, strict=True)]
            assert [len(b) for b in batches[:3]] == [4, 4, 2]
        expected = torch_fine_tuning(
            x_s,
            task.support[1],
            features(task.query[0]),
            task.query[1],
            init,
            cosine,
            steps,
            sgd,
            batches,
            scale=2.0,
        )
    assert ours.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(ours), expected, rtol=1e-9)
    assert expected[-1] < 0.5 * expected[0]  # the head did learn: the comparison is not vacuous


def test_fine_tuning_batches_cover_each_example_once_per_epoch_in_new_orders():
    """The reference's epochs: every support example once per epoch, in a random order that
    changes from epoch to epoch, and the last batch of each epoch the remainder; padding slots
    (here every third) are never drawn and leave no step empty."""
    real = jnp.arange(36) % 3 != 2  # 24 real examples among 36 slots
    batches = jax.jit(finetune_batches, static_argnums=(2, 3))  # not op by op
    indices, used = batches(jax.random.key(5), real, 5, 500)  # 100 epochs of 5 batches
    indices, used = np.asarray(indices), np.asarray(used)
    assert indices.shape == used.shape == (500, 5)
    assert used.sum(axis=1).tolist() == [5, 5, 5, 5, 4] * 100
    orders = [indices[e * 5 : e * 5 + 5][used[e * 5 : e * 5 + 5]] for e in range(100)]
    real_indices = np.flatnonzero(np.asarray(real)).tolist()
    assert all(sorted(order.tolist()) == real_indices for order in orders)
    assert len({tuple(order.tolist()) for order in orders}) == 100
    assert batches(jax.random.key(5), real, 4, 0)[0].shape == (0, 4)


@pytest.mark.parametrize("cosine", [False, True], ids=["baseline", "baseline_pp"])
def test_padding_appended_to_the_support_set_changes_no_step(cosine):
    """A support set padded at its end (a WeightedBatch, as variable-shot episodes are) fits the
    same head as the unpadded one, mini-batch by mini-batch."""
    factory = baseline_pp if cosine else baseline
    model = mlp_model()
    params, state = jax.jit(model.init)(jax.random.key(0))
    learner = factory(supervised_objective(model, "classification"), finetune_lr=0.1)
    meta = learner.init(jax.random.key(1), params)
    task = episode(6)
    n = task.support[1].shape[0]
    padded_support = WeightedBatch(
        jnp.concatenate([task.support[0], 7.0 + jnp.zeros((4, DIM))]),
        jnp.concatenate([task.support[1], -jnp.ones(4, task.support[1].dtype)]),
        jnp.concatenate([jnp.ones(n), jnp.zeros(4)]),
    )
    ctx = context(state, jax.random.key(8))
    steps = (0, 3, 20)
    evaluate = jax.jit(learner.evaluate, static_argnums=3)  # one compiled program, not op by op
    plain = evaluate(meta, task, ctx, steps)
    padded = evaluate(meta, Task(padded_support, task.query), ctx, steps)
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(padded[key], plain[key], rtol=1e-5, atol=1e-6)
    assert float(plain["loss"][-1]) < float(plain["loss"][0])  # the steps did change the head


def test_cosine_logits_equal_the_formula_in_numpy():
    rng = np.random.default_rng(0)
    x, v, g = rng.standard_normal((4, 7)), rng.standard_normal((7, 3)), rng.uniform(0.5, 2, 3)
    expected = np.empty((4, 3))
    for i in range(4):
        for c in range(3):
            cos = x[i] @ v[:, c] / ((np.sqrt(x[i] @ x[i]) + 1e-5) * np.sqrt(v[:, c] @ v[:, c]))
            expected[i, c] = 10.0 * g[c] * cos
    with jax.enable_x64(True):
        ours = cosine_logits(jnp.asarray(x), {"v": jnp.asarray(v), "g": jnp.asarray(g)}, 10.0)
    np.testing.assert_allclose(np.asarray(ours), expected, rtol=1e-12)


@pytest.mark.parametrize("outputs, scale", [(OUTPUTS, 2.0), (201, 10.0)])
def test_pretraining_gradients_are_those_of_the_classifier_over_support_and_query(outputs, scale):
    """Baseline's meta-gradient is the cross-entropy's over the episode's support and query
    examples of the model's own outputs; Baseline++'s that of the cosine head over the model's
    head kernel (the reference's scale: 2 up to 200 classes, else 10) with the learned norms
    ``g``, which start at the kernel columns' norms."""
    with jax.enable_x64(True):
        model = mlp_model(outputs)
        params, state = jax.jit(model.init)(jax.random.key(0))
        params = to64(params)
        rng = np.random.default_rng(1)
        x = jnp.asarray(rng.standard_normal((10, DIM)))
        labels = jnp.asarray(rng.integers(0, outputs, 10))
        task = Task((x[:4], labels[:4]), (x[4:], labels[4:]))
        objective = supervised_objective(model, "classification")

        def cross_entropy(logits):
            return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(10), labels])

        # Each gradient and loss one compiled program, not op by op.
        plain = baseline(objective)
        grads, aux = jax.jit(plain.task_grad)(plain.init(None, params), task, context(state))

        def plain_loss(p):
            return cross_entropy(model.apply(p, state, None, x, True)[0])

        expected = jax.jit(jax.grad(plain_loss))(params)
        for a, b in zip(jax.tree.leaves(grads["params"]), jax.tree.leaves(expected), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(aux.metrics["loss"], jax.jit(plain_loss)(params), rtol=1e-12)

        cosine = baseline_pp(objective)
        meta = cosine.init(None, params)
        kernel = np.asarray(params["head"]["kernel"])
        np.testing.assert_allclose(meta["g"], np.linalg.norm(kernel, axis=0), rtol=1e-12)
        grads, _ = jax.jit(cosine.task_grad)(meta, task, context(state))

        def cosine_loss(m):
            h = model.embed(m["params"], state, None, x, True)[0]
            h = h / (jnp.sqrt(jnp.sum(h * h, axis=1, keepdims=True)) + 1e-5)
            w = m["params"]["head"]["kernel"]
            w = w / jnp.sqrt(jnp.sum(w * w, axis=0, keepdims=True))
            return cross_entropy(scale * m["g"] * (h @ w))

        expected = jax.jit(jax.grad(cosine_loss))(meta)
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13)
        assert np.all(np.asarray(grads["params"]["head"]["bias"]) == 0)  # the cosine head's


def test_class_labelled_training_episodes_carry_each_class_index():
    """With ``train_labels="class"`` a training episode's labels are its classes' indices in
    the training split (each image here holds its class's index), the model gets one output per
    training class, and validation and test episodes keep labels ``0..ways-1``."""
    dense = np.broadcast_to(
        np.arange(30, dtype=np.uint8)[:, None, None, None, None], (30, 6, 2, 2, 1)
    )
    arrays = {"train": ClassSplit.from_dense(dense), "val": dense[:8], "test": dense[:8]}
    tasks = episode_distribution(
        arrays, ways=5, num_queries=2, dataset="tagged", train_ways=7, train_labels="class"
    )
    assert tasks.num_outputs == 30
    # Each sampler one compiled program, not op by op.
    sample_train = jax.jit(lambda key: tasks.sample(tasks.splits["train"], key, 3))
    sample_val = jax.jit(lambda key: tasks.sample(tasks.splits["val"], key, 1))
    for seed in range(5):
        task = sample_train(jax.random.key(seed))
        for inputs, labels in (task.support, task.query):
            np.testing.assert_array_equal(
                np.asarray(labels), np.round(np.asarray(inputs)[:, 0, 0, 0] * 255).astype(int)
            )
        assert len(set(np.asarray(task.support[1]).tolist())) == 7
        val = sample_val(jax.random.key(seed))
        assert sorted(np.asarray(val.support[1]).tolist()) == [0, 1, 2, 3, 4]


def test_adapt_writes_the_fitted_head_into_the_model():
    """Baseline's ``adapt``: the model's ``apply`` on the adapted parameters scores the query
    set as ``evaluate`` does after the same steps (the fitted head written into the first
    columns, the others at ``-inf``); Baseline++'s cosine head cannot be written: refused."""
    model = mlp_model()
    params, state = jax.jit(model.init)(jax.random.key(0))
    learner = baseline(supervised_objective(model, "classification"), finetune_lr=0.1)
    meta = learner.init(None, params)
    task = episode(5, ways=4, shots=1)
    ctx = context(state, jax.random.key(6))
    # Each computation one compiled program, not op by op.
    adapted = jax.jit(learner.adapt, static_argnums=3)(meta, task.support, ctx, 30)

    @jax.jit
    def logits_and_loss(adapted, x, y):
        logits = model.apply(adapted, state, None, x, False)[0]
        return logits, -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(12), y])

    logits, loss = logits_and_loss(adapted, *task.query)
    assert logits.shape == (12, OUTPUTS) and bool(jnp.all(jnp.isinf(logits[:, 4:])))
    evaluated = jax.jit(learner.evaluate, static_argnums=3)(meta, task, ctx, (30,))
    np.testing.assert_allclose(loss, evaluated["loss"][0], rtol=1e-5)
    cosine = baseline_pp(supervised_objective(model, "classification"))
    with pytest.raises(ValueError, match="algorithm=baseline_pp: its fitted head is a cosine"):
        cosine.adapt(cosine.init(None, params), task.support, ctx, 30)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["+experiment=omniglot_5w1s_protonet_cpu", "algorithm=baseline"],
            "algorithm=baseline pretrains a classifier over the training classes: set "
            "data.train_labels=class",
        ),
        (
            ["+experiment=omniglot_5w1s_protonet_cpu", "data.train_labels=class"],
            "data.train_labels=class labels training episodes by class .* algorithm=protonet",
        ),
        (
            ["+experiment=sinusoid_maml", "algorithm=baseline_pp"],
            "algorithm=baseline_pp pretrains a classifier .* data=sinusoid has none",
        ),
    ],
)
def test_train_labels_and_algorithm_refusals(overrides, message):
    with pytest.raises(ValueError, match=message):
        check_train_labels(to_objects(compose_config(overrides)))


def test_class_labels_take_fixed_episodes_only():
    with pytest.raises(ValueError, match="data.train_labels must be one of"):
        check_episode_settings(5, 15, train_labels="global")
    with pytest.raises(ValueError, match="data.train_labels=class takes fixed episodes"):
        check_episode_settings(5, 15, ways_range=(2, 5), train_labels="class")


def gaussian_classes(key, count: int, dim: int = 16, informative: int = 4):
    """``draw(key, classes [n]) -> inputs [n, dim]``: classes told apart by their means on the
    first ``informative`` coordinates (spread 0.5), the others noise (spread 3)."""
    means = (
        jnp.zeros((count, dim))
        .at[:, :informative]
        .set(2.0 * jax.random.normal(key, (count, informative)))
    )
    spread = jnp.concatenate([jnp.full(informative, 0.5), jnp.full(dim - informative, 3.0)])
    return lambda k, classes: means[classes] + spread * jax.random.normal(k, (len(classes), dim))


@pytest.mark.parametrize("factory", [baseline, baseline_pp], ids=["baseline", "baseline_pp"])
def test_pretraining_on_old_classes_helps_tell_new_classes_apart(factory):
    """Pretrained on 20 classes (300 Adam steps of class-labelled batches), the embedding lets
    a new head fitted on one example per class tell 5 new classes apart far better than the
    untrained embedding does (5-way 1-shot accuracy over 64 held-out episodes)."""
    import optax

    draw = gaussian_classes(jax.random.key(0), 25)
    model = model_from_flax(MLP((64, 32), 20), (16,), ModelParts(head="head", embed="embed"))
    params, state = jax.jit(model.init)(jax.random.key(1))
    learner = factory(supervised_objective(model, "classification"), finetune_lr=0.1)
    meta = learner.init(None, params)
    optimizer = optax.adam(1e-3)

    def train_step(carry, key):
        meta, opt_state = carry
        classes = jnp.repeat(jnp.arange(20), 3)
        inputs = draw(key, classes)
        task = Task((inputs[:20], classes[:20]), (inputs[20:], classes[20:]))
        grads, aux = learner.task_grad(meta, task, context(state))
        updates, opt_state = optimizer.update(grads, opt_state, meta)
        return (optax.apply_updates(meta, updates), opt_state), aux.metrics["loss"]

    keys = jax.random.split(jax.random.key(2), 300)
    (trained, _), losses = jax.jit(
        lambda m: jax.lax.scan(train_step, (m, optimizer.init(m)), keys)
    )(meta)
    # Measured: 0.20 (Baseline), 0.57 (Baseline++: its logits bounded by scale 2 x the norms).
    assert losses[-20:].mean() < 0.7 * losses[:20].mean()

    def accuracy(m, key):
        k_draw, k_support, k_query, k_head = jax.random.split(key, 4)
        new = 20 + jnp.arange(5)
        labels = jnp.arange(5)
        task = Task(
            (draw(k_support, new), labels),
            (draw(k_query, jnp.repeat(new, 5)), jnp.repeat(labels, 5)),
        )
        return learner.evaluate(m, task, context(state, k_head), (100,))["accuracy"][0]

    episodes = jax.random.split(jax.random.key(3), 64)
    measure = jax.jit(jax.vmap(accuracy, in_axes=(None, 0)))
    before, after = float(measure(meta, episodes).mean()), float(measure(trained, episodes).mean())
    # Measured: 0.30 -> 0.74 (Baseline), 0.31 -> 0.87 (Baseline++).
    assert after > 0.6 and after > before + 0.3, (before, after)


def test_a_fine_tuning_rate_passed_as_data_is_the_rate_the_learner_is_built_with():
    """``finetune_lr`` is a hyperparameter: passed in ``TaskContext.hyper`` to one compiled
    evaluation it gives the metrics of a learner built with it."""
    model = mlp_model()
    params, state = model.init(jax.random.key(0))
    objective = supervised_objective(model, "classification")
    meta = baseline(objective).init(None, params)
    task, ctx = episode(7), context(state, jax.random.key(8))
    traces = []

    def evaluate(rate):
        traces.append(rate)
        return baseline(objective).evaluate(
            meta, task, ctx._replace(hyper={"finetune_lr": rate}), (5,)
        )

    compiled = jax.jit(evaluate)
    for rate in (0.01, 0.3):
        own = baseline(objective, finetune_lr=rate).evaluate(meta, task, ctx, (5,))
        np.testing.assert_allclose(compiled(np.float32(rate))["loss"], own["loss"], rtol=1e-5)
    assert len(traces) == 1
