"""N-way K-shot episodes sampled on the device from a dense image array.

A split is one uint8 array ``[num_classes, examples_per_class, H, W, C]`` kept on the device
(Omniglot's 4112 training classes at 28x28 are ~64 MB). An episode draws ``ways`` distinct
classes, then ``shots + num_queries`` distinct examples of each, with ``jax.random`` inside
jitted code: no host round trip, and the same key always gives the same episode.

- Labels are shuffled per task: the drawn classes get a random permutation of ``0..ways-1``,
  so a class index never fixes its label.
- Support and query never share an example (they are disjoint slices of one draw without
  replacement).
- Inputs are float32 in ``[0, 1]`` (uint8 / 255), shape ``[ways * shots, H, W, C]`` for the
  support set and ``[ways * num_queries, H, W, C]`` for the query set, ordered class by class
  (the labels, not the order, are random); labels are int32.
- Every class of a split must hold the same number of examples (Omniglot 20, miniImageNet and
  the CIFAR-100 splits 600); :func:`episode_distribution` checks the shapes.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from metalearn.data.task import Task, TaskDistribution


def sample_episode(
    images: jax.Array, key: jax.Array, *, ways: int, shots: int, num_queries: int
) -> Task:
    """One ``ways``-way ``shots``-shot task with ``num_queries`` queries per class.

    ``images`` is uint8 ``[num_classes, examples_per_class, H, W, C]``; ``ways``, ``shots`` and
    ``num_queries`` are static ints.

    >>> import jax, jax.numpy as jnp
    >>> images = jnp.zeros((10, 6, 4, 4, 1), jnp.uint8)
    >>> task = sample_episode(images, jax.random.key(0), ways=3, shots=2, num_queries=4)
    >>> task.support[0].shape, task.support[1].shape, task.query[0].shape, task.query[0].dtype
    ((6, 4, 4, 1), (6,), (12, 4, 4, 1), dtype('float32'))
    """
    num_classes, per_class = images.shape[:2]
    per_task = shots + num_queries
    if ways > num_classes or per_task > per_class:
        raise ValueError(
            f"cannot draw {ways} classes x {per_task} examples from {num_classes} classes x "
            f"{per_class} examples"
        )
    k_classes, k_examples, k_labels = jax.random.split(key, 3)
    classes = random_subset(k_classes, (), num_classes, ways)
    examples = random_subset(k_examples, (ways,), per_class, per_task)
    labels = jax.random.permutation(k_labels, ways).astype(jnp.int32)

    x = images[classes[:, None], examples].astype(jnp.float32) / 255.0  # [ways, per_task, ...]
    y = jnp.broadcast_to(labels[:, None], (ways, per_task))
    shape = images.shape[2:]

    def flat(x_part, y_part):
        return x_part.reshape(-1, *shape), y_part.reshape(-1)

    return Task(support=flat(x[:, :shots], y[:, :shots]), query=flat(x[:, shots:], y[:, shots:]))


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


def check_episode_settings(ways: int, num_queries: int) -> None:
    """Raise ValueError naming the ``data.*`` key for invalid episode settings.

    >>> check_episode_settings(ways=1, num_queries=15)
    Traceback (most recent call last):
    ...
    ValueError: data.ways must be >= 2, got 1
    """
    if not isinstance(ways, int) or ways < 2:
        raise ValueError(f"data.ways must be >= 2, got {ways}")
    if not isinstance(num_queries, int) or num_queries < 1:
        raise ValueError(f"data.num_queries must be >= 1, got {num_queries}")


def episode_distribution(
    split_images: Mapping[str, np.ndarray],
    *,
    ways: int,
    num_queries: int,
    dataset: str,
    train_ways: int | None = None,
) -> TaskDistribution:
    """A classification :class:`TaskDistribution` over dense per-split image arrays.

    ``split_images`` maps ``"train"``, ``"val"``, ``"test"`` to uint8 arrays
    ``[num_classes, examples_per_class, H, W, C]`` (classes disjoint across splits). They are
    put on the default device and handed to ``sample`` as ``{"images": array}``.
    ``sample(split_arrays, key, shots)`` raises ValueError if ``shots + num_queries`` exceeds
    the examples per class. ``train_ways`` (default: ``ways``) sets the ways of training
    episodes alone, e.g. Prototypical Networks' 60-way training for 5-way tests; the model gets
    ``max(ways, train_ways)`` outputs. The training split's arrays then carry an empty array
    ``"ways"`` of shape ``[train_ways, 0]``: its static shape tells the sampler the ways.

    >>> import jax, numpy as np
    >>> arrays = {s: np.zeros((8, 20, 28, 28, 1), np.uint8) for s in ("train", "val", "test")}
    >>> tasks = episode_distribution(arrays, ways=5, num_queries=15, dataset="demo")
    >>> task = tasks.sample(tasks.splits["val"], jax.random.key(0), 1)
    >>> tasks.input_shape, tasks.num_outputs, task.support[0].shape, task.query[1].shape
    ((28, 28, 1), 5, (5, 28, 28, 1), (75,))
    """
    check_episode_settings(ways, num_queries)
    missing = {"train", "val", "test"} - set(split_images)
    if missing:
        raise ValueError(f"{dataset}: no arrays for split(s) {sorted(missing)}")
    train_ways = ways if train_ways is None else train_ways
    check_episode_settings(train_ways, num_queries)
    train_classes = split_images["train"].shape[0]
    if train_ways != ways and train_classes < train_ways:
        raise ValueError(
            f"data.train_ways={train_ways} exceeds the {train_classes} classes of the "
            f"{dataset} train split"
        )
    image_shapes = set()
    for split, images in split_images.items():
        if images.ndim != 5 or images.dtype != np.uint8:
            raise ValueError(
                f"{dataset}: the {split} split must be uint8 [classes, examples, H, W, C], "
                f"got {images.dtype} {tuple(images.shape)}"
            )
        image_shapes.add(tuple(images.shape[2:]))
        if images.shape[0] < ways:
            raise ValueError(
                f"data.ways={ways} exceeds the {images.shape[0]} classes of the {dataset} "
                f"{split} split"
            )
        if images.shape[1] <= num_queries:
            raise ValueError(
                f"data.num_queries={num_queries} leaves no support examples: the {dataset} "
                f"{split} split has {images.shape[1]} examples per class"
            )
    if len(image_shapes) != 1:
        raise ValueError(f"{dataset}: splits differ in image shape {sorted(image_shapes)}")

    def sample(split_arrays, key, shots):
        images = split_arrays["images"]
        per_class = images.shape[1]
        shots = operator.index(shots)  # static: a Python int, not a traced value
        if shots < 1:
            raise ValueError(f"shots must be >= 1, got {shots}")
        if shots + num_queries > per_class:
            raise ValueError(
                f"shots={shots} + data.num_queries={num_queries} exceeds the {per_class} "
                f"examples per class of {dataset}"
            )
        n = split_arrays["ways"].shape[0] if "ways" in split_arrays else ways  # static
        return sample_episode(images, key, ways=n, shots=shots, num_queries=num_queries)

    splits = {split: {"images": jax.device_put(a)} for split, a in split_images.items()}
    if train_ways != ways:
        splits["train"]["ways"] = jnp.zeros((train_ways, 0), jnp.uint8)
    return TaskDistribution(
        splits=splits,
        sample=sample,
        input_shape=image_shapes.pop(),
        num_outputs=max(ways, train_ways),
        kind="classification",
        ways=ways,
    )
