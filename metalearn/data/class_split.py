"""One split of a few-shot image dataset: every image in one array, classes as offsets and counts.

A :class:`ClassSplit` holds one uint8 array ``images [num_images, H, W, C]`` with the images of
each class stored contiguously, class after class, and int32 ``offsets`` / ``counts``
``[num_classes]``: class ``c`` is ``images[offsets[c] : offsets[c] + counts[c]]``. Classes may
hold different numbers of images (tieredImageNet, CUB, Meta-Dataset's sources). It is a JAX
pytree whose leaves are the three arrays; the smallest and largest class sizes and the name of
the smallest class are static metadata (part of the tree structure), so a jitted sampler knows
them at trace time and the arrays stay arguments, never constants of the compiled code.

>>> import numpy as np
>>> split = ClassSplit.from_classes(
...     [np.zeros((3, 2, 2, 1), np.uint8), np.ones((5, 2, 2, 1), np.uint8)], names=("a", "b"))
>>> split.images.shape, split.offsets.tolist(), split.counts.tolist()
((8, 2, 2, 1), [0, 3], [3, 5])
>>> split.num_classes, split.min_count, split.max_count, split.smallest
(2, 3, 5, 'a')
>>> split.class_images(1).shape
(5, 2, 2, 1)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

Array = Any  # np.ndarray on the host, jax.Array on the device


@dataclasses.dataclass(frozen=True)
class ClassSplit:
    """Images of one split, class by class; build it with :meth:`from_classes` or
    :meth:`from_dense`, which check the layout."""

    images: Array  # uint8 [num_images, H, W, C]
    offsets: Array  # int32 [num_classes]: first image of each class
    counts: Array  # int32 [num_classes]: images of each class (>= 1)
    min_count: int  # static: the smallest class size
    max_count: int  # static: the largest class size
    smallest: str  # static: the name of (the first) smallest class, for error messages

    @property
    def num_classes(self) -> int:
        return int(self.counts.shape[0])

    @property
    def image_shape(self) -> tuple[int, ...]:
        return tuple(self.images.shape[1:])

    @classmethod
    def from_classes(
        cls, classes: Sequence[np.ndarray], names: Sequence[str] | None = None
    ) -> ClassSplit:
        """Concatenate per-class uint8 arrays ``[count_c, H, W, C]`` (``count_c >= 1``).

        ``names`` (default ``class 0``, ``class 1``, ...) only serve error messages.

        >>> ClassSplit.from_classes([np.zeros((0, 2, 2, 1), np.uint8)], names=("x",))
        Traceback (most recent call last):
        ...
        ValueError: class x has no images
        """
        if not len(classes):
            raise ValueError("a split needs at least one class")
        names = (
            tuple(names) if names is not None else tuple(f"class {c}" for c in range(len(classes)))
        )
        if len(names) != len(classes):
            raise ValueError(f"{len(names)} names for {len(classes)} classes")
        shapes = {tuple(np.shape(images)[1:]) for images in classes}
        if len(shapes) != 1:
            raise ValueError(f"classes differ in image shape {sorted(shapes)}")
        counts = np.array([len(images) for images in classes], np.int64)
        for name, count in zip(names, counts, strict=True):
            if count == 0:
                raise ValueError(f"class {name} has no images")
        if counts.sum() >= 2**31:
            raise ValueError(f"{counts.sum()} images do not fit int32 offsets")
        images = np.concatenate([np.asarray(images, np.uint8) for images in classes])
        return cls._from_counts(images, counts, names)

    @classmethod
    def from_dense(cls, images: np.ndarray, names: Sequence[str] | None = None) -> ClassSplit:
        """A split from a dense uint8 array ``[num_classes, per_class, H, W, C]``.

        >>> ClassSplit.from_dense(np.zeros((4, 3, 2, 2, 1), np.uint8)).counts.tolist()
        [3, 3, 3, 3]
        """
        images = np.asarray(images)
        if images.ndim < 3 or images.shape[1] == 0:
            raise ValueError(f"expected [classes, examples, ...] images, got {images.shape}")
        return cls.from_classes(list(images), names)

    @classmethod
    def _from_counts(cls, images: np.ndarray, counts: np.ndarray, names: tuple[str, ...]):
        smallest = int(np.argmin(counts))
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
        return cls(
            images=images,
            offsets=offsets.astype(np.int32),
            counts=counts.astype(np.int32),
            min_count=int(counts[smallest]),
            max_count=int(counts.max()),
            smallest=names[smallest],
        )

    def class_images(self, c: int) -> Array:
        """The images of class ``c`` (host or device, as stored)."""
        start = int(self.offsets[c])
        return self.images[start : start + int(self.counts[c])]

    def dense(self) -> np.ndarray:
        """The split as ``[num_classes, per_class, H, W, C]`` on the host; all classes must
        hold the same number of images."""
        if self.min_count != self.max_count:
            raise ValueError(
                f"classes hold {self.min_count} to {self.max_count} images; no dense array"
            )
        images = np.asarray(self.images)
        return images.reshape(self.num_classes, self.max_count, *images.shape[1:])

    def rotated(self, rotations: Sequence[int]) -> ClassSplit:
        """Each class rotated by each angle (degrees, multiples of 90) as a new class, in the
        order given: all classes at the first angle, then all at the second, ...

        >>> split = ClassSplit.from_classes([np.arange(4, dtype=np.uint8).reshape(1, 2, 2, 1)])
        >>> split.rotated((0, 90)).images[:, :, :, 0].tolist()
        [[[0, 1], [2, 3]], [[1, 3], [0, 2]]]
        """
        images = np.asarray(self.images)
        rotated = np.concatenate([np.rot90(images, k=r // 90, axes=(1, 2)) for r in rotations])
        counts = np.tile(np.asarray(self.counts), len(rotations))
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
        smallest = f"{self.smallest} rotated by {rotations[0]}"  # argmin: the first block
        return dataclasses.replace(
            self, images=rotated, offsets=offsets, counts=counts, smallest=smallest
        )

    def summary(self) -> str:
        """The shape as text: ``(classes, per_class, H, W, C)``, or with a size range.

        >>> ClassSplit.from_dense(np.zeros((4, 3, 2, 2, 1), np.uint8)).summary()
        '(4, 3, 2, 2, 1)'
        >>> ClassSplit.from_classes([np.zeros((n, 2, 2, 1), np.uint8) for n in (3, 5)]).summary()
        '(2 classes, 3 to 5 images, 2, 2, 1)'
        """
        if self.min_count == self.max_count:
            return str((self.num_classes, self.max_count, *self.image_shape))
        shape = ", ".join(map(str, self.image_shape))
        return f"({self.num_classes} classes, {self.min_count} to {self.max_count} images, {shape})"

    def map_images(self, fn) -> ClassSplit:
        """The same layout with ``images`` replaced by ``fn(images)`` (same leading axis)."""
        return dataclasses.replace(self, images=fn(self.images))


jax.tree_util.register_dataclass(
    ClassSplit,
    data_fields=["images", "offsets", "counts"],
    meta_fields=["min_count", "max_count", "smallest"],
)
