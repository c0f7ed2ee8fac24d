"""Episodes from classes of different sizes, and variable-way variable-shot episodes."""

from __future__ import annotations

import chex
import jax
import numpy as np
import pytest
import scipy.stats

from metalearn.data.class_split import ClassSplit
from metalearn.data.episodes import episode_distribution
from tests.data.test_episodes import chi_square, ids

COUNTS = [7, 12, 30, 9, 7, 20, 15, 8, 11, 25]  # unequal class sizes, smallest 7 (class 0)


def tagged_split(counts=COUNTS) -> ClassSplit:
    """Class c's example e has pixels (c, e); classes of the given sizes."""
    classes = [
        np.stack([np.full(n, c), np.arange(n)], -1).astype(np.uint8).reshape(n, 1, 1, 2)
        for c, n in enumerate(counts)
    ]
    return ClassSplit.from_classes(classes, names=[f"tag{c}" for c in range(len(counts))])


@pytest.fixture(scope="module")
def tasks():
    split = tagged_split()
    return episode_distribution(
        {"train": split, "val": split, "test": split}, ways=4, num_queries=3, dataset="tagged"
    )


def sample_many(tasks, shots, count=2000, seed=0):
    sample = jax.jit(jax.vmap(lambda k: tasks.sample(tasks.splits["train"], k, shots)))
    return sample(jax.random.split(jax.random.key(seed), count))


def test_unequal_classes_give_valid_uniform_episodes(tasks):
    (xs, ys), (xq, yq) = sample_many(tasks, 2)
    seen = np.zeros((len(COUNTS), max(COUNTS)), int)
    for t in range(len(ys)):
        support, query = ids(xs[t]), ids(xq[t])
        classes = {c for c, _ in support}
        assert len(classes) == 4 and {c for c, _ in query} == classes
        assert all(e < COUNTS[c] for c, e in np.concatenate([support, query]))  # in its class
        pairs = {tuple(p) for p in support} | {tuple(p) for p in query}
        assert len(pairs) == 4 * 5  # distinct examples, support and query disjoint
        assert sorted(set(np.asarray(ys[t]).tolist())) == [0, 1, 2, 3]
        label_of = dict(zip(support[:, 0].tolist(), np.asarray(ys[t]).tolist(), strict=True))
        assert all(label_of[c] == y for (c, _), y in zip(query, np.asarray(yq[t]), strict=True))
        for c, e in np.concatenate([support, query]):
            seen[c, e] += 1
    per_class = seen.sum(1) // 5
    assert chi_square(per_class) < 27.9  # 9 dof, p = 0.001: classes uniform whatever their size
    for c, n in enumerate(COUNTS):  # within each class, every example equally likely
        bound = scipy.stats.chi2.ppf(1 - 1e-4, n - 1)  # 10 classes: 0.1% false alarms in all
        assert chi_square(seen[c, :n]) < bound, (c, seen[c, :n])
        assert seen[c, n:].sum() == 0


def test_a_class_too_small_is_refused_by_name():
    split = tagged_split()
    splits = {"train": split, "val": split, "test": split}
    with pytest.raises(
        ValueError, match=r"data.num_queries=7 leaves no support examples: class tag0 of the "
    ):
        episode_distribution(splits, ways=4, num_queries=7, dataset="tagged")
    tasks = episode_distribution(splits, ways=4, num_queries=3, dataset="tagged")
    with pytest.raises(
        ValueError,
        match=r"tagged: shots=5 \+ data.num_queries=3 exceeds the 7 images of class "
        r"tag0, the smallest",
    ):
        tasks.sample(tasks.splits["train"], jax.random.key(0), 5)
    with pytest.raises(ValueError, match=r"exceeds the 7 images of class tag0"):
        tasks.sample(tasks.splits["train"], jax.random.key(0), (1, 5))


@pytest.fixture(scope="module")
def variable():
    split = tagged_split()
    return episode_distribution(
        {"train": split, "val": split, "test": split},
        ways=4,
        ways_range=(2, 6),
        num_queries=2,
        dataset="tagged",
    )


def test_variable_episodes_are_padded_with_consistent_masks(variable):
    assert variable.num_outputs == variable.ways == 6
    support, query = sample_many(variable, (1, 4), count=1500)
    assert support.inputs.shape == (1500, 6 * 4, 1, 1, 2) and query.weights.shape == (1500, 12)
    ways_seen, shots_seen = [], []
    for t in range(1500):
        s_ids, q_ids = ids(support.inputs[t]), ids(query.inputs[t])
        assert len({tuple(p) for p in s_ids} | {tuple(p) for p in q_ids}) == 6 * 6  # disjoint
        s_y, s_w = np.asarray(support.labels[t]), np.asarray(support.weights[t])
        q_y, q_w = np.asarray(query.labels[t]), np.asarray(query.weights[t])
        assert set(np.unique(s_w)) <= {0.0, 1.0} and set(np.unique(q_w)) <= {0.0, 1.0}
        assert ((s_y >= 0) == (s_w == 1)).all() and ((q_y >= 0) == (q_w == 1)).all()
        ways = len(set(q_y[q_w == 1].tolist()))
        assert sorted(set(q_y[q_w == 1].tolist())) == list(range(ways))  # labels 0..ways-1
        assert sorted(set(s_y[s_w == 1].tolist())) == list(range(ways))
        shots = int(s_w.sum()) // ways
        assert np.bincount(s_y[s_w == 1], minlength=ways).tolist() == [shots] * ways
        assert np.bincount(q_y[q_w == 1], minlength=ways).tolist() == [2] * ways
        label_of = {}  # one class per label, the same in support and query
        for (c, _), y in zip(
            np.concatenate([s_ids, q_ids]), np.concatenate([s_y, q_y]), strict=True
        ):
            if y >= 0:
                assert label_of.setdefault(y, c) == c
        assert len(set(label_of.values())) == ways
        ways_seen.append(ways)
        shots_seen.append(shots)
    assert chi_square(np.bincount(ways_seen)[2:]) < 18.5  # 2..6 uniform: 4 dof, p = 0.001
    assert chi_square(np.bincount(shots_seen)[1:]) < 16.3  # 1..4 uniform: 3 dof, p = 0.001


def test_variable_episode_with_fixed_numbers_has_all_ones_weights():
    split = tagged_split()
    tasks = episode_distribution(
        {"train": split, "val": split, "test": split},
        ways=3,
        ways_range=(3, 3),
        num_queries=2,
        dataset="tagged",
    )
    support, query = tasks.sample(tasks.splits["val"], jax.random.key(4), (2, 2))
    assert support.weights.tolist() == [1.0] * 6 and query.weights.tolist() == [1.0] * 6
    assert sorted(support.labels.tolist()) == [0, 0, 1, 1, 2, 2]


def test_variable_sampler_is_deterministic_jitted_once_and_takes_arrays_as_arguments(variable):
    @jax.jit
    @chex.assert_max_traces(n=1)
    def sample(split, key):
        return variable.sample(split, key, (1, 3))

    a = sample(variable.splits["train"], jax.random.key(1))
    b = sample(variable.splits["val"], jax.random.key(1))
    c = sample(variable.splits["train"], jax.random.key(2))
    jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)  # same data, same key
    assert not np.array_equal(a.support.inputs, c.support.inputs)
    jaxpr = jax.make_jaxpr(lambda s, k: variable.sample(s, k, (1, 3)))(
        variable.splits["train"], jax.random.key(0)
    )
    assert not any(np.size(const) >= sum(COUNTS) for const in jaxpr.consts)


def test_invalid_ranges_name_the_setting(variable):
    split = tagged_split()
    splits = {"train": split, "val": split, "test": split}
    with pytest.raises(ValueError, match=r"data.ways_range must be \[lo, hi\]"):
        episode_distribution(splits, ways=4, ways_range=(6, 2), num_queries=2, dataset="t")
    with pytest.raises(ValueError, match=r"data.ways_range=11 exceeds the 10 classes"):
        episode_distribution(splits, ways=4, ways_range=(2, 11), num_queries=2, dataset="t")
    with pytest.raises(ValueError, match=r"a shots range must be \(lo, hi\)"):
        variable.sample(variable.splits["train"], jax.random.key(0), (3, 1))
