"""The on-device episode sampler: balance, disjointness, label shuffling, determinism, and the
exact episodes of the earlier dense-array sampler when all classes hold the same count."""

from __future__ import annotations

import collections

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.data.class_split import ClassSplit
from metalearn.data.episode_settings import check_episode_settings
from metalearn.data.episodes import episode_distribution, sample_episode

NUM_CLASSES, PER_CLASS = 30, 12


def tagged_images(num_classes=NUM_CLASSES, per_class=PER_CLASS) -> np.ndarray:
    """[classes, examples, 1, 1, 2] uint8 whose pixels are (class id, example id)."""
    c, e = np.meshgrid(np.arange(num_classes), np.arange(per_class), indexing="ij")
    return np.stack([c, e], -1).astype(np.uint8).reshape(num_classes, per_class, 1, 1, 2)


def numpy_subset(key, batch, n, k):
    """``k`` distinct indices of ``n``: those of the ``k`` largest uniform draws, ties to the lower
    index (a stable sort of the negated draws in NumPy, not metalearn's ``lax.top_k``)."""
    draws = np.asarray(jax.random.uniform(key, (*batch, n)))
    return np.argsort(-draws, axis=-1, kind="stable")[..., :k]


def dense_reference_episode(images, key, *, ways, shots, num_queries):
    """The sampler before the offsets/counts layout (commit fa979d2), on a dense array, its
    subsets drawn in NumPy."""
    num_classes, per_class = images.shape[:2]
    k_classes, k_examples, k_labels = jax.random.split(key, 3)
    classes = numpy_subset(k_classes, (), num_classes, ways)
    examples = numpy_subset(k_examples, (ways,), per_class, shots + num_queries)
    labels = jax.random.permutation(k_labels, ways).astype(jnp.int32)
    x = images[classes[:, None], examples].astype(jnp.float32) / 255.0
    y = jnp.broadcast_to(labels[:, None], (ways, shots + num_queries))
    shape = images.shape[2:]
    return (
        (x[:, :shots].reshape(-1, *shape), y[:, :shots].reshape(-1)),
        (x[:, shots:].reshape(-1, *shape), y[:, shots:].reshape(-1)),
    )


def ids(x: jax.Array) -> np.ndarray:
    """(class id, example id) pairs back from float inputs in [0, 1]."""
    return np.rint(np.asarray(x).reshape(-1, 2) * 255).astype(int)


@pytest.fixture(scope="module")
def tasks():
    arrays = {split: tagged_images() for split in ("train", "val", "test")}
    return episode_distribution(arrays, ways=5, num_queries=4, dataset="tagged")


@pytest.fixture(scope="module")
def many(tasks):
    """400 jitted 5-way 3-shot tasks, stacked."""
    sample = jax.jit(
        jax.vmap(lambda k: tasks.sample(tasks.splits["train"], k, 3)), static_argnums=()
    )
    return sample(jax.random.split(jax.random.key(0), 400))


def test_shapes_dtypes_and_range(tasks):
    task = tasks.sample(tasks.splits["train"], jax.random.key(1), 3)
    (xs, ys), (xq, yq) = task
    assert xs.shape == (15, 1, 1, 2) and ys.shape == (15,)
    assert xq.shape == (20, 1, 1, 2) and yq.shape == (20,)
    assert xs.dtype == jnp.float32 and ys.dtype == jnp.int32
    assert float(xs.min()) >= 0.0 and float(xq.max()) <= 1.0
    assert tasks.input_shape == (1, 1, 2) and tasks.num_outputs == tasks.ways == 5
    assert tasks.kind == "classification"


def test_class_balance_and_one_label_per_class(many):
    (xs, ys), (xq, yq) = many
    for t in range(len(ys)):
        assert collections.Counter(np.asarray(ys[t]).tolist()) == {i: 3 for i in range(5)}
        assert collections.Counter(np.asarray(yq[t]).tolist()) == {i: 4 for i in range(5)}
        label_of = {}
        for (c, _), y in zip(ids(xs[t]), np.asarray(ys[t]), strict=True):
            assert label_of.setdefault(c, y) == y
        for (c, _), y in zip(ids(xq[t]), np.asarray(yq[t]), strict=True):
            assert label_of[c] == y  # queries come from the support classes, same labels
        assert len(label_of) == 5  # five distinct classes


def test_support_and_query_never_share_an_example(many):
    (xs, _), (xq, _) = many
    for t in range(len(xs)):
        support = {tuple(p) for p in ids(xs[t])}
        query = {tuple(p) for p in ids(xq[t])}
        assert len(support) == 15 and len(query) == 20
        assert not support & query


def chi_square(counts: np.ndarray) -> float:
    """Pearson's statistic against equal expected counts."""
    expected = counts.sum() / len(counts)
    return float(((counts - expected) ** 2 / expected).sum())


def test_labels_are_a_fresh_permutation_per_task(many):
    (xs, ys), _ = many
    # The label of the lowest drawn class id is uniform over 0..4, and label orders vary.
    first = []
    orders = set()
    for t in range(len(ys)):
        classes, labels = ids(xs[t])[:, 0].tolist(), np.asarray(ys[t]).tolist()
        pairs = sorted(set(zip(classes, labels, strict=True)))
        first.append(pairs[0][1])
        orders.add(tuple(y for _, y in pairs))
    assert chi_square(np.bincount(first, minlength=5)) < 18.5  # 4 dof, p = 0.001
    assert len(orders) > 80  # of 120 permutations (~115 expected in 400 draws)


def test_classes_and_examples_are_drawn_uniformly(many):
    (xs, _), (xq, _) = many
    drawn = np.concatenate([ids(xs), ids(xq)])
    class_counts = np.bincount(drawn[:, 0], minlength=NUM_CLASSES) // 7  # 7 per drawn class
    assert class_counts.sum() == 400 * 5
    assert chi_square(class_counts) < 58.3  # 29 dof, p = 0.001
    example_counts = np.bincount(drawn[:, 1], minlength=PER_CLASS)
    assert chi_square(example_counts) < 31.3  # 11 dof, p = 0.001


def test_deterministic_given_the_key_and_different_across_keys(tasks):
    arrays = tasks.splits["val"]
    a = tasks.sample(arrays, jax.random.key(7), 2)
    b = tasks.sample(arrays, jax.random.key(7), 2)
    c = tasks.sample(arrays, jax.random.key(8), 2)
    jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)
    assert not np.array_equal(a.support[0], c.support[0])
    jitted = jax.jit(tasks.sample, static_argnums=2)(arrays, jax.random.key(7), 2)
    jax.tree_util.tree_map(np.testing.assert_array_equal, a, jitted)


def test_same_episodes_as_the_dense_sampler_for_equal_class_sizes():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (40, 20, 3, 3, 1), dtype=np.uint8)  # Omniglot-like: 20 each
    tasks = episode_distribution(
        {s: images for s in ("train", "val", "test")}, ways=5, num_queries=15, dataset="dense"
    )
    for shots in (1, 5):
        for seed in range(20):
            key = jax.random.key(seed)
            new = tasks.sample(tasks.splits["train"], key, shots)
            old = dense_reference_episode(
                jnp.asarray(images), key, ways=5, shots=shots, num_queries=15
            )
            jax.tree_util.tree_map(np.testing.assert_array_equal, tuple(new), old)


def test_split_arrays_are_an_argument_not_a_constant(tasks):
    jaxpr = jax.make_jaxpr(lambda arrays, k: tasks.sample(arrays, k, 1))(
        tasks.splits["train"], jax.random.key(0)
    )
    assert not any(np.size(c) >= NUM_CLASSES * PER_CLASS for c in jaxpr.consts)


def test_jitted_sampler_traces_once_across_keys_and_splits(tasks):
    @jax.jit
    @chex.assert_max_traces(n=1)
    def sample(split, keys):
        return jax.vmap(lambda k: tasks.sample(split, k, 2))(keys)

    for seed in range(3):
        for name in ("train", "val", "test"):  # same shapes: the arrays are arguments
            sample(tasks.splits[name], jax.random.split(jax.random.key(seed), 4))


def test_invalid_settings_name_the_config_key():
    arrays = {split: tagged_images() for split in ("train", "val", "test")}
    with pytest.raises(ValueError, match=r"data.ways must be >= 2, got 1"):
        episode_distribution(arrays, ways=1, num_queries=4, dataset="tagged")
    with pytest.raises(ValueError, match=r"data.num_queries must be >= 1, got 0"):
        episode_distribution(arrays, ways=5, num_queries=0, dataset="tagged")
    with pytest.raises(ValueError, match=r"data.ways=31 exceeds the 30 classes"):
        episode_distribution(arrays, ways=31, num_queries=4, dataset="tagged")
    with pytest.raises(ValueError, match=r"data.num_queries=12 leaves no support examples: class"):
        episode_distribution(arrays, ways=5, num_queries=12, dataset="tagged")
    tasks = episode_distribution(arrays, ways=5, num_queries=4, dataset="tagged")
    with pytest.raises(ValueError, match=r"shots=9 \+ data.num_queries=4 exceeds the 12 images"):
        tasks.sample(tasks.splits["train"], jax.random.key(0), 9)
    with pytest.raises(ValueError, match=r"shots must be >= 1"):
        tasks.sample(tasks.splits["train"], jax.random.key(0), 0)


def test_rejects_ragged_or_mistyped_arrays():
    good = tagged_images()
    with pytest.raises(ValueError, match="uint8"):
        episode_distribution(
            {"train": good.astype(np.float32), "val": good, "test": good},
            ways=5,
            num_queries=2,
            dataset="tagged",
        )
    with pytest.raises(ValueError, match="differ in image shape"):
        episode_distribution(
            {"train": good, "val": good, "test": np.zeros((30, 12, 2, 2, 2), np.uint8)},
            ways=5,
            num_queries=2,
            dataset="tagged",
        )
    split = ClassSplit.from_dense(good)
    with pytest.raises(ValueError, match="cannot draw 31 classes from 30"):
        sample_episode(split, jax.random.key(0), ways=31, shots=1, num_queries=3)
    with pytest.raises(ValueError, match=r"shots=10 \+ data.num_queries=3 exceeds the 12 images"):
        sample_episode(split, jax.random.key(0), ways=5, shots=10, num_queries=3)


def test_train_queries_apply_to_training_episodes_only():
    # MetaOptNet trains with 6 queries per class and tests with 15.
    arrays = {split: tagged_images(12, 20) for split in ("train", "val", "test")}
    tasks = episode_distribution(arrays, ways=5, num_queries=9, dataset="tagged", train_queries=3)
    train = tasks.sample(tasks.splits["train"], jax.random.key(0), 2)
    assert train.support[0].shape[0] == 10 and train.query[0].shape[0] == 15
    pairs = [tuple(p) for p in ids(jnp.concatenate([train.support[0], train.query[0]]))]
    assert len(set(pairs)) == 25  # 5 examples of each class, none drawn twice
    for split in ("val", "test"):
        task = tasks.sample(tasks.splits[split], jax.random.key(1), 2)
        assert task.query[0].shape[0] == 45
    with pytest.raises(ValueError, match="data.train_queries=20 leaves no support examples"):
        episode_distribution(arrays, ways=5, num_queries=9, dataset="tagged", train_queries=20)
    with pytest.raises(ValueError, match=r"data.train_queries must be >= 1 \(or null"):
        check_episode_settings(5, 9, train_queries=0)


def test_train_shots_range_applies_to_training_episodes_only():
    # R2D2 trains on episodes of 1 to 9 shots and tests with 1 or 5.
    arrays = {split: tagged_images(12, 20) for split in ("train", "val", "test")}
    tasks = episode_distribution(
        arrays, ways=5, num_queries=4, dataset="tagged", train_shots_range=(1, 3)
    )
    sample = jax.jit(tasks.sample, static_argnums=2)
    counts = set()
    for seed in range(30):
        train = sample(tasks.splits["train"], jax.random.key(seed), 1)  # trainer.shots: 1
        weights = np.asarray(train.support.weights).reshape(5, 3)  # class by class, padded to 3
        shots = weights.sum(axis=1)
        assert len(set(shots.tolist())) == 1  # every class of an episode has its shots
        counts.add(int(shots[0]))
        real = np.asarray(train.support.inputs)[np.asarray(train.support.weights) > 0]
        assert len({tuple(p) for p in ids(real)}) == len(real)  # no image drawn twice
        assert train.query.labels.shape == (20,)
    assert counts == {1, 2, 3}
    for split in ("val", "test"):
        task = tasks.sample(tasks.splits[split], jax.random.key(1), 2)
        assert task.support[0].shape[0] == 10 and task.query[0].shape[0] == 20
    with pytest.raises(ValueError, match=r"data.train_shots_range must be \[lo, hi\]"):
        check_episode_settings(5, 4, train_shots_range=(0, 3))
    with pytest.raises(ValueError, match="drop one of them"):
        check_episode_settings(5, 4, shots_range=(1, 2), train_shots_range=(1, 3))
    with pytest.raises(ValueError, match="takes fixed episodes"):
        check_episode_settings(5, 4, train_labels="class", train_shots_range=(1, 3))


def test_train_ways_apply_to_training_episodes_only():
    # Prototypical Networks train on more ways than they are tested on (60 vs 5 on Omniglot).
    arrays = {split: tagged_images(40) for split in ("train", "val", "test")}
    tasks = episode_distribution(arrays, ways=5, num_queries=2, dataset="tagged", train_ways=12)
    assert tasks.num_outputs == 12 and tasks.ways == 5
    train = jax.jit(lambda a, k: tasks.sample(a, k, 1))(tasks.splits["train"], jax.random.key(0))
    assert train.support[0].shape[0] == 12 and train.query[0].shape[0] == 24
    assert sorted(np.asarray(train.support[1]).tolist()) == list(range(12))
    assert len({c for c, _ in ids(train.support[0])}) == 12  # 12 distinct classes
    for split in ("val", "test"):
        task = tasks.sample(tasks.splits[split], jax.random.key(1), 1)
        assert task.support[0].shape[0] == 5 and task.query[0].shape[0] == 10
    # Variable shots: training episodes are padded to the training ways.
    padded = tasks.sample(tasks.splits["train"], jax.random.key(2), (1, 3))
    assert padded.support.inputs.shape[0] == 12 * 3 and padded.query.weights.shape == (24,)
    with pytest.raises(ValueError, match="train_ways=41 exceeds the 40 classes"):
        episode_distribution(arrays, ways=5, num_queries=2, dataset="tagged", train_ways=41)
    with pytest.raises(ValueError, match="train_ways and data.ways_range cannot both be set"):
        episode_distribution(
            arrays, ways=5, num_queries=2, dataset="tagged", train_ways=12, ways_range=(2, 5)
        )


@pytest.mark.parametrize(
    "name, kwargs, message",
    [
        ("omniglot", dict(ways=1), "data.ways must be >= 2, got 1"),
        ("miniimagenet", dict(num_queries=0), "data.num_queries must be >= 1, got 0"),
        ("cifarfs", dict(ways_range=[5, 3]), "data.ways_range must be [lo, hi] with 2 <= lo"),
        ("fc100", dict(shots_range=[0, 2]), "data.shots_range must be [lo, hi] with 1 <= lo"),
        (
            "omniglot",
            dict(train_ways=10, ways_range=[2, 5]),
            "data.train_ways and data.ways_range cannot both be set",
        ),
        ("omniglot", dict(rotations=(0, 45)), "data.rotations must be distinct angles out of"),
    ],
)
def test_an_episode_config_refuses_a_bad_value_when_it_is_made(name, kwargs, message):
    # The settings that need no data: metalearn.config.to_objects makes the config, so they are
    # refused there, before a rerun's config is compared with its run directory's (which advised
    # trainer.allow_changes for the value first) and before any data is read (data.ways_range
    # and data.shots_range were checked only once the dataset was loaded).
    from metalearn.registry import TASKS

    with pytest.raises(ValueError) as err:
        TASKS.entry(name).config_cls(**kwargs)
    assert str(err.value).startswith(message), str(err.value)
