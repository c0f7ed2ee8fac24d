"""The ``omniglot`` task family: N-way K-shot episodes of Omniglot in the Vinyals split.

Inputs are 28x28x1 in [0, 1]. At load time the pixels are inverted (ink 1.0, background 0.0, as
in Finn et al.'s code) and every character is rotated by each angle in ``rotations`` into
distinct classes, so the default four rotations give 4112 / 688 / 1692 classes. Rotating at load
time keeps the TFDS dataset (:mod:`metalearn.data.omniglot_builder`, imported when the family is
built) faithful to the source and costs ~0.1 s.
"""

from __future__ import annotations

import dataclasses

from metalearn.data.image_families import ImageEpisodesConfig, image_episodes
from metalearn.data.task import TaskFamily
from metalearn.registry import TASKS, with_config

ANGLES = (0, 90, 180, 270)


@dataclasses.dataclass
class OmniglotConfig(ImageEpisodesConfig):
    """Omniglot episodes; ``manual_dir`` holds images_background.zip, images_evaluation.zip."""

    name: str = "omniglot"
    rotations: tuple[int, ...] = ANGLES

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        super().__post_init__()
        check_rotations(self.rotations)


def check_rotations(rotations) -> tuple[int, ...]:
    """``rotations`` as a tuple of distinct angles out of 0, 90, 180, 270, or ValueError.

    >>> check_rotations([0, 180])
    (0, 180)
    >>> check_rotations([0, 45])
    Traceback (most recent call last):
    ...
    ValueError: data.rotations must be distinct angles out of 0, 90, 180, 270, got [0, 45]
    """
    angles = tuple(int(r) for r in rotations)
    if not angles or len(set(angles)) != len(angles) or any(r not in ANGLES for r in angles):
        raise ValueError(
            f"data.rotations must be distinct angles out of 0, 90, 180, 270, got {list(angles)}"
        )
    return angles


def _builder() -> type:
    from metalearn.data.omniglot_builder import OmniglotVinyals

    return OmniglotVinyals


@TASKS.register("omniglot", OmniglotConfig)
def omniglot(config: OmniglotConfig | None = None, **overrides) -> TaskFamily:
    """Omniglot N-way K-shot episodes (``config``: default :class:`OmniglotConfig`, with
    ``overrides`` applied).

    Prepares the TFDS dataset ``omniglot_vinyals`` in ``data_dir`` on first use (from
    ``manual_dir`` when given, else by download). Example, with the archives at hand::

        tasks = omniglot(ways=5, manual_dir="../shared/data/omniglot")
        task = tasks.sample(tasks.splits["train"], jax.random.key(0), 1)  # 5 support, 75 query
    """
    c = with_config(OmniglotConfig, config, overrides)
    rotations = tuple(int(r) for r in c.rotations)  # checked by OmniglotConfig
    return image_episodes(
        c, _builder, lambda split: split.map_images(lambda images: 255 - images).rotated(rotations)
    )
