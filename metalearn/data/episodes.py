"""N-way K-shot episodes sampled on the device from a :class:`ClassSplit`.

A split is one uint8 array ``images [num_images, H, W, C]`` with per-class int32 ``offsets`` and
``counts`` (:mod:`metalearn.data.class_split`), kept on the device; classes may differ in size.
An episode draws ``ways`` distinct classes, then ``shots + num_queries`` distinct examples of
each, with ``jax.random`` inside jitted code: no host round trip, and the same key always gives
the same episode. Examples are drawn as the indices of the largest uniform keys (``top_k``) over
a row of ``max_count`` keys per class, the keys past the class's ``count`` masked to ``-1``: a
uniformly random ordered subset of each class. When all classes hold the same number of images
nothing is masked, and the episodes are exactly those of the earlier dense-array sampler
(``images[classes, examples]`` on ``[num_classes, per_class, H, W, C]``) for the same key.

- Labels are shuffled per task: the drawn classes get a random permutation of ``0..ways-1``.
- Support and query never share an example (disjoint slices of one draw without replacement).
- Inputs are float32 in ``[0, 1]`` (uint8 / 255), ordered class by class (the labels, not the
  order, are random); labels are int32.
- Classes too small: a class with ``count <= num_queries`` is refused when the distribution is
  built, and ``shots + num_queries`` above the smallest class is refused when sampling; both
  errors name the class. Nothing is sampled from a subset of "big enough" classes.

Fixed episodes (``ways`` and ``shots`` ints): ``Task(support=(x, y), query=(x, y))`` with
``x`` ``[ways * shots, H, W, C]`` / ``[ways * num_queries, H, W, C]``, as before.

Variable episodes (Meta-Dataset style, Triantafillou et al. 2020): ``ways_range=(lo, hi)`` when
the distribution is built and/or ``shots=(lo, hi)`` when sampling draw the episode's ways and
shots uniformly (inclusive) per episode. Shapes stay static: every episode is padded to the
maximum ways and shots, and each half is a :class:`WeightedBatch` ``(inputs, labels, weights)``
(a tuple, so ``batch[0]`` / ``batch[1]`` still index inputs and labels):

- ``weights`` float32 ``[examples]``: 1.0 for a real example, 0.0 for padding. The loss of an
  episode is the weighted mean, ``sum(w * loss_i) / sum(w)``, as the supervised objective
  computes it (:func:`metalearn.data.task.supervised_loss_and_metrics`, on
  :mod:`metalearn.models.weighted_losses`).
- ``labels`` of real examples are ``0..ways-1``; padding has label ``-1`` (so ``one_hot``-based
  code such as class prototypes ignores it). Padding inputs are real images (never NaN). The
  supervised objective passes the real examples as the model's ``mask``, so batch
  normalisation computes its statistics over them alone (a model whose batch statistics take
  no mask is refused; :class:`metalearn.models.base.Model`): padding changes no real output.
- The model's head has ``max_ways`` outputs (``num_outputs``); absent classes are never labels,
  and the supervised objective masks their logits to ``-inf``.
- With a fixed number, ``ways_range=(5, 5)`` and ``shots=(1, 1)`` give all-ones weights.

From the command line, the image datasets' ``data.ways_range`` and ``data.shots_range`` keys
(``null`` by default: fixed episodes); the runner's shots are the padded maximum::

    python -m metalearn.train +experiment=omniglot_5w1s data.ways_range=[2,5] \
        data.shots_range=[1,5] trainer.shots=5 eval.shots=[5]
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from metalearn.data.class_split import ClassSplit
from metalearn.data.episode_settings import check_episode_settings, is_range
from metalearn.data.task import Task, TaskFamily, WeightedBatch

Shots = int | tuple[int, int]


def random_subset(key: jax.Array, batch: tuple[int, ...], n: int, k: int) -> jax.Array:
    """``k`` distinct indices out of ``n`` in random order, for each of ``batch``: shape
    ``batch + (k,)``.

    The indices of the ``k`` largest of ``n`` uniform draws (``lax.top_k``): a uniformly random
    ordered subset, far faster on CPU than ``jax.random.choice(..., replace=False)`` (which
    shuffles all ``n``). Ties among the float32 draws (2^23 values in [0, 1)) are broken by
    index; one decides a draw with probability about ``n * 2^-23`` (5e-4 for Omniglot's 4112
    classes), a negligible bias.

    >>> idx = random_subset(jax.random.key(0), (3,), 10, 4)
    >>> idx.shape, all(len(set(row.tolist())) == 4 for row in idx)
    ((3, 4), True)
    """
    return jax.lax.top_k(jax.random.uniform(key, (*batch, n)), k)[1]


def random_subsets_within(key: jax.Array, counts: jax.Array, max_count: int, k: int) -> jax.Array:
    """For each ``counts[i]`` (all ``>= k``), ``k`` distinct indices below it in random order:
    shape ``counts.shape + (k,)``.

    As :func:`random_subset` over ``max_count`` keys, with the keys at or past ``counts[i]``
    set to ``-1`` (below every uniform draw); with ``counts == max_count`` everywhere the
    result is exactly ``random_subset(key, counts.shape, max_count, k)``.

    >>> idx = random_subsets_within(jax.random.key(0), jnp.array([3, 10]), 10, 3)
    >>> sorted(idx[0].tolist()), bool((idx[1] < 10).all())
    ([0, 1, 2], True)
    """
    keys = jax.random.uniform(key, (*counts.shape, max_count))
    keys = jnp.where(jnp.arange(max_count) < counts[..., None], keys, -1.0)
    return jax.lax.top_k(keys, k)[1]


def _draw(split: ClassSplit, key: jax.Array, ways: int, per_task: int, class_labels=False):
    """``(x float32 [ways, per_task, H, W, C], labels int32 [ways])`` of one episode: the
    labels a random permutation of ``0..ways-1``, or with ``class_labels`` the drawn classes'
    indices in the split."""
    k_classes, k_examples, k_labels = jax.random.split(key, 3)
    classes = random_subset(k_classes, (), split.num_classes, ways)
    examples = random_subsets_within(k_examples, split.counts[classes], split.max_count, per_task)
    x = split.images[split.offsets[classes][:, None] + examples].astype(jnp.float32) / 255.0
    if class_labels:
        return x, classes.astype(jnp.int32)
    return x, jax.random.permutation(k_labels, ways).astype(jnp.int32)


def _check_sizes(split: ClassSplit, ways: int, shots: int, num_queries: int) -> None:
    if ways > split.num_classes:
        raise ValueError(f"cannot draw {ways} classes from {split.num_classes}")
    if shots + num_queries > split.min_count:
        raise ValueError(
            f"shots={shots} + data.num_queries={num_queries} exceeds the {split.min_count} "
            f"images of class {split.smallest}, the smallest of its split"
        )


def sample_episode(
    split: ClassSplit,
    key: jax.Array,
    *,
    ways: int,
    shots: int,
    num_queries: int,
    class_labels: bool = False,
) -> Task:
    """One ``ways``-way ``shots``-shot task with ``num_queries`` queries per class (static
    ints): ``Task(support=(x, y), query=(x, y))``. The labels are ``0..ways-1`` in a random
    order, or with ``class_labels`` the classes' indices in the split (``0..num_classes-1``,
    for pretraining a classifier over every class of the split: ``data.train_labels=class``).

    >>> import numpy as np
    >>> split = jax.device_put(ClassSplit.from_dense(np.zeros((10, 6, 4, 4, 1), np.uint8)))
    >>> task = sample_episode(split, jax.random.key(0), ways=3, shots=2, num_queries=4)
    >>> task.support[0].shape, task.support[1].shape, task.query[0].shape, task.query[0].dtype
    ((6, 4, 4, 1), (6,), (12, 4, 4, 1), dtype('float32'))
    """
    _check_sizes(split, ways, shots, num_queries)
    x, labels = _draw(split, key, ways, shots + num_queries, class_labels)
    y = jnp.broadcast_to(labels[:, None], x.shape[:2])

    def flat(x_part, y_part):
        return x_part.reshape(-1, *split.image_shape), y_part.reshape(-1)

    return Task(support=flat(x[:, :shots], y[:, :shots]), query=flat(x[:, shots:], y[:, shots:]))


def sample_variable_episode(
    split: ClassSplit,
    key: jax.Array,
    *,
    ways: tuple[int, int],
    shots: tuple[int, int],
    num_queries: int,
) -> Task:
    """An episode with ways and shots uniform in the inclusive ranges ``ways`` and ``shots``,
    padded to their maxima: ``Task(support=WeightedBatch, query=WeightedBatch)``.

    >>> import numpy as np
    >>> split = ClassSplit.from_dense(np.zeros((10, 8, 2, 2, 1), np.uint8))
    >>> task = sample_variable_episode(
    ...     split, jax.random.key(3), ways=(2, 5), shots=(1, 3), num_queries=2)
    >>> task.support.inputs.shape, task.query.weights.shape
    ((15, 2, 2, 1), (10,))
    >>> labels, weights = task.support.labels, task.support.weights
    >>> bool(((labels >= 0) == (weights == 1)).all())
    True
    """
    (min_ways, max_ways), (min_shots, max_shots) = ways, shots
    _check_sizes(split, max_ways, max_shots, num_queries)
    k_episode, k_ways, k_shots = jax.random.split(key, 3)
    x, labels = _draw(split, k_episode, max_ways, max_shots + num_queries)
    num_ways = jax.random.randint(k_ways, (), min_ways, max_ways + 1)
    num_shots = jax.random.randint(k_shots, (), min_shots, max_shots + 1)
    active = labels < num_ways  # a random subset of num_ways classes, labelled 0..num_ways-1
    in_support = jnp.arange(max_shots) < num_shots
    support_w = (active[:, None] & in_support[None, :]).astype(jnp.float32)
    query_w = jnp.broadcast_to(active[:, None], (max_ways, num_queries)).astype(jnp.float32)

    def half(x_part, w):
        y = jnp.where(w > 0, labels[:, None], -1).astype(jnp.int32)
        return WeightedBatch(x_part.reshape(-1, *split.image_shape), y.reshape(-1), w.reshape(-1))

    return Task(support=half(x[:, :max_shots], support_w), query=half(x[:, max_shots:], query_w))


@dataclasses.dataclass(frozen=True)
class WaysSplit:
    """A split whose episodes have their own number of ways (static), and with
    ``class_labels`` the classes' indices as labels: the training split with
    ``data.train_ways``, ``data.train_labels=class``, ``data.train_queries`` (its
    ``queries`` per class; None: the family's) or ``data.train_shots_range`` (its
    ``shots_range``). A pytree whose leaves are those of
    ``classes``."""

    classes: ClassSplit
    ways: int
    class_labels: bool = False
    queries: int | None = None
    shots_range: tuple[int, int] | None = None  # data.train_shots_range


jax.tree_util.register_dataclass(
    WaysSplit,
    data_fields=["classes"],
    meta_fields=["ways", "class_labels", "queries", "shots_range"],
)


def as_class_split(images, dataset: str, split: str) -> ClassSplit:
    """A :class:`ClassSplit` as is, or one from a dense ``[classes, examples, H, W, C]`` array."""
    if isinstance(images, ClassSplit):
        return images
    images = np.asarray(images)
    if images.ndim != 5 or images.dtype != np.uint8:
        raise ValueError(
            f"{dataset}: the {split} split must be a ClassSplit or uint8 [classes, examples, "
            f"H, W, C], got {images.dtype} {tuple(images.shape)}"
        )
    return ClassSplit.from_dense(images)


def episode_distribution(
    split_images: Mapping[str, ClassSplit | np.ndarray],
    *,
    ways: int,
    num_queries: int,
    dataset: str,
    ways_range: tuple[int, int] | None = None,
    shots_range: tuple[int, int] | None = None,
    train_ways: int | None = None,
    train_labels: str = "episode",
    train_queries: int | None = None,
    train_shots_range: tuple[int, int] | None = None,
) -> TaskFamily:
    """A classification :class:`TaskFamily` over per-split :class:`ClassSplit` layouts
    (or dense uint8 ``[classes, examples, H, W, C]`` arrays, all classes of equal size).

    ``split_images`` maps ``"train"``, ``"val"``, ``"test"`` to disjoint classes; they are put
    on the default device and handed to ``sample(split, key, shots)``. ``shots`` is a static
    int, or an inclusive ``(lo, hi)`` range for variable shots; ``ways_range`` (default: fixed
    ``ways``) makes the ways variable, and ``num_outputs`` is then its maximum.
    ``shots_range=(lo, hi)`` (the ``data.shots_range`` key) makes every episode's shots
    variable; the ``shots`` the runner passes (``trainer.shots``, ``eval.shots``) must then be
    ``hi``, the padded size the episodes are recorded under, and anything else is refused.
    The supervised objective scores a padded episode over its real examples only
    (:func:`metalearn.data.task.supervised_loss_and_metrics`). ``train_ways`` (the
    ``data.train_ways`` key; default: ``ways``) sets the ways of training episodes alone, e.g.
    Prototypical Networks' 60-way training for 5-way tests; validation and test episodes keep
    ``ways``, and the model gets ``max(ways, train_ways)`` outputs. The training split is then a
    :class:`WaysSplit` (its static ``ways`` tells the sampler). It takes fixed ways only: with
    ``ways_range`` it is refused. ``train_labels="class"`` (the ``data.train_labels`` key)
    labels training episodes with their classes' indices in the training split, for an
    algorithm that pretrains a classifier over all of them (``algorithm=baseline``); the model
    then gets one output per training class. Fixed episodes only. ``train_queries`` (the
    ``data.train_queries`` key; default: ``num_queries``) sets the queries per class of training
    episodes alone (MetaOptNet trains with 6 and tests with 15). ``train_shots_range=(lo, hi)``
    (the ``data.train_shots_range`` key) draws each training episode's shots, padded to ``hi``
    (R2D2 trains with 1 to 9 shots), whatever ``shots`` the runner passes; validation and test
    episodes keep the ``shots`` passed (``trainer.shots``, ``eval.shots``).

    >>> arrays = {s: np.zeros((8, 20, 28, 28, 1), np.uint8) for s in ("train", "val", "test")}
    >>> tasks = episode_distribution(arrays, ways=5, num_queries=15, dataset="demo")
    >>> task = tasks.sample(tasks.splits["val"], jax.random.key(0), 1)
    >>> tasks.input_shape, tasks.num_outputs, task.support[0].shape, task.query[1].shape
    ((28, 28, 1), 5, (5, 28, 28, 1), (75,))
    >>> task = tasks.sample(tasks.splits["val"], jax.random.key(0), (1, 5))
    >>> task.support.inputs.shape, task.support.weights.shape
    ((25, 28, 28, 1), (25,))
    >>> tasks = episode_distribution(
    ...     arrays, ways=5, num_queries=15, dataset="demo", ways_range=(2, 5), shots_range=(1, 3))
    >>> task = tasks.sample(tasks.splits["val"], jax.random.key(0), 3)
    >>> tasks.num_outputs, task.support.weights.shape, task.query.labels.shape
    (5, (15,), (75,))
    >>> tasks = episode_distribution(arrays, ways=5, num_queries=2, dataset="demo", train_ways=8)
    >>> train = tasks.sample(tasks.splits["train"], jax.random.key(0), 1)
    >>> tasks.num_outputs, tasks.ways, train.support[0].shape[0]
    (8, 5, 8)
    """
    check_episode_settings(
        ways,
        num_queries,
        ways_range,
        shots_range,
        train_ways,
        train_labels,
        train_queries,
        train_shots_range,
    )
    missing = {"train", "val", "test"} - set(split_images)
    if missing:
        raise ValueError(f"{dataset}: no arrays for split(s) {sorted(missing)}")
    train_ways = ways if train_ways is None else train_ways
    splits = {name: as_class_split(a, dataset, name) for name, a in split_images.items()}
    max_ways = ways if ways_range is None else ways_range[1]
    for name, split in splits.items():
        needed, key_name = max_ways, "data.ways" if ways_range is None else "data.ways_range"
        if name == "train" and train_ways != ways:
            needed, key_name = train_ways, "data.train_ways"
        if split.num_classes < needed:
            raise ValueError(
                f"{key_name}={needed} exceeds the {split.num_classes} classes of the "
                f"{dataset} {name} split"
            )
        queries, key_name = num_queries, "data.num_queries"
        if name == "train" and train_queries is not None:
            queries, key_name = train_queries, "data.train_queries"
        if split.min_count <= queries:
            raise ValueError(
                f"{key_name}={queries} leaves no support examples: class "
                f"{split.smallest} of the {dataset} {name} split has {split.min_count} images"
            )
    image_shapes = {split.image_shape for split in splits.values()}
    if len(image_shapes) != 1:
        raise ValueError(f"{dataset}: splits differ in image shape {sorted(image_shapes)}")

    def sample(split: ClassSplit | WaysSplit, key: jax.Array, shots: Shots) -> Task:
        shots = _static_shots(shots)
        n, class_labels, queries = ways, False, num_queries
        if isinstance(split, WaysSplit):
            n, class_labels = split.ways, split.class_labels
            queries = num_queries if split.queries is None else split.queries
            if split.shots_range is not None:
                shots = split.shots_range
            split = split.classes
        if shots_range is not None:
            if shots not in (shots_range[1], tuple(shots_range)):
                raise ValueError(
                    f"{dataset}: data.shots_range={list(shots_range)} pads every episode to "
                    f"{shots_range[1]} shots; set trainer.shots and eval.shots to "
                    f"{shots_range[1]} (got {shots})"
                )
            shots = tuple(shots_range)
        try:
            if isinstance(shots, int) and ways_range is None:
                return sample_episode(
                    split,
                    key,
                    ways=n,
                    shots=shots,
                    num_queries=queries,
                    class_labels=class_labels,
                )
            shot_range = (shots, shots) if isinstance(shots, int) else shots
            way_range = (n, n) if ways_range is None else tuple(ways_range)
            return sample_variable_episode(
                split, key, ways=way_range, shots=shot_range, num_queries=queries
            )
        except ValueError as err:
            raise ValueError(f"{dataset}: {err}") from None

    placed: dict[str, ClassSplit | WaysSplit] = dict(splits)
    class_labels = train_labels == "class"
    train_shots = None if train_shots_range is None else tuple(train_shots_range)
    if train_ways != ways or class_labels or train_queries is not None or train_shots:
        placed["train"] = WaysSplit(
            splits["train"], train_ways, class_labels, train_queries, train_shots
        )
    train_outputs = splits["train"].num_classes if class_labels else train_ways
    return TaskFamily(
        splits={name: jax.device_put(split) for name, split in placed.items()},
        sample=sample,
        input_shape=image_shapes.pop(),
        num_outputs=max(max_ways, train_outputs),
        kind="classification",
        ways=max_ways,
    )


def _static_shots(shots) -> Shots:
    """A Python int >= 1, or an inclusive range ``(lo, hi)`` with ``1 <= lo <= hi``."""
    if isinstance(shots, tuple | list):
        if not is_range(tuple(operator.index(s) for s in shots), 1):
            raise ValueError(f"a shots range must be (lo, hi) with 1 <= lo <= hi, got {shots}")
        return tuple(operator.index(s) for s in shots)
    shots = operator.index(shots)  # static: a Python int, not a traced value
    if shots < 1:
        raise ValueError(f"shots must be >= 1, got {shots}")
    return shots
