"""The ``cifarfs`` and ``fc100`` task families: N-way K-shot episodes of few-shot CIFAR-100.

Inputs are 32x32x3 in [0, 1]. CIFAR-FS splits the 100 classes 64 / 16 / 20 across superclasses,
FC100 by superclass (60 / 20 / 20 classes). The TFDS builders are in
:mod:`metalearn.data.cifar_builder` (imported when a family is built).
"""

from __future__ import annotations

import dataclasses

from metalearn.data.image_families import ImageEpisodesConfig, image_episodes
from metalearn.data.task import TaskFamily
from metalearn.registry import TASKS, with_config


@dataclasses.dataclass
class CifarFsConfig(ImageEpisodesConfig):
    """CIFAR-FS episodes; ``manual_dir`` holds cifar-100-python.tar.gz (or its folder)."""

    name: str = "cifarfs"


@dataclasses.dataclass
class Fc100Config(ImageEpisodesConfig):
    """FC100 episodes; ``manual_dir`` holds cifar-100-python.tar.gz (or its folder)."""

    name: str = "fc100"


def _cifar_fs() -> type:
    from metalearn.data.cifar_builder import CifarFs

    return CifarFs


def _fc100() -> type:
    from metalearn.data.cifar_builder import Fc100

    return Fc100


@TASKS.register("cifarfs", CifarFsConfig)
def cifarfs(config: CifarFsConfig | None = None, **overrides) -> TaskFamily:
    """CIFAR-FS N-way K-shot episodes; prepares the TFDS dataset ``cifar_fs`` on first use.

    Example, offline with the archive in ``~/data/cifar``::

        tasks = cifarfs(ways=5, manual_dir="~/data/cifar")
    """
    return image_episodes(with_config(CifarFsConfig, config, overrides), _cifar_fs)


@TASKS.register("fc100", Fc100Config)
def fc100(config: Fc100Config | None = None, **overrides) -> TaskFamily:
    """FC100 N-way K-shot episodes; prepares the TFDS dataset ``fc100`` on first use.

    Example, offline with the archive in ``~/data/cifar``::

        tasks = fc100(ways=5, manual_dir="~/data/cifar")
    """
    return image_episodes(with_config(Fc100Config, config, overrides), _fc100)
