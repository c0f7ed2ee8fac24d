"""The ``miniimagenet`` task family: N-way K-shot episodes of miniImageNet (Ravi split).

Inputs are 84x84x3 in [0, 1]. The TFDS builder, and the source layouts ``manual_dir`` may hold,
are in :mod:`metalearn.data.miniimagenet_builder` (imported when the family is built).
"""

from __future__ import annotations

import dataclasses

from metalearn.data.image_families import ImageEpisodesConfig, image_episodes
from metalearn.data.task import TaskFamily
from metalearn.registry import TASKS, with_config


@dataclasses.dataclass
class MiniImageNetConfig(ImageEpisodesConfig):
    """miniImageNet episodes; ``manual_dir`` holds the images (layouts: the builder module)."""

    name: str = "miniimagenet"


def _builder() -> type:
    from metalearn.data.miniimagenet_builder import MiniImagenetRavi

    return MiniImagenetRavi


@TASKS.register("miniimagenet", MiniImageNetConfig)
def miniimagenet(config: MiniImageNetConfig | None = None, **overrides) -> TaskFamily:
    """miniImageNet N-way K-shot episodes (``config``: default :class:`MiniImageNetConfig`,
    with ``overrides`` applied).

    Prepares the TFDS dataset ``mini_imagenet_ravi`` in ``data_dir`` on first use, from
    ``manual_dir``. Example::

        tasks = miniimagenet(ways=5, manual_dir="~/data/mini-imagenet")
        task = tasks.sample(tasks.splits["train"], jax.random.key(0), 1)
    """
    return image_episodes(with_config(MiniImageNetConfig, config, overrides), _builder)
