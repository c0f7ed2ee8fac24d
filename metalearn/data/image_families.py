"""What the few-shot image datasets share: their settings and how a family is built from one.

Each dataset (:mod:`~metalearn.data.omniglot`, :mod:`~metalearn.data.miniimagenet`,
:mod:`~metalearn.data.cifar`) registers a config that extends :class:`ImageEpisodesConfig`, the
one home of the defaults they share, and builds its family with :func:`image_episodes`. Their
TFDS builders live in ``*_builder.py`` modules that only :func:`image_episodes` imports, so
TensorFlow Datasets is imported when an image dataset is built, never by ``import metalearn``,
the algorithms, or a sinusoid run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from metalearn.data.class_split import ClassSplit
from metalearn.data.episode_settings import check_episode_settings
from metalearn.data.episodes import episode_distribution
from metalearn.data.task import TaskFamily


@dataclasses.dataclass
class ImageEpisodesConfig:
    """N-way K-shot episodes of a TFDS-prepared image dataset (subclasses set ``name``)."""

    name: str = ""
    ways: int = 5
    num_queries: int = 15  # query examples per class
    ways_range: list[int] | None = None  # [lo, hi]: variable ways, padded to hi
    shots_range: list[int] | None = None  # [lo, hi]: variable shots; trainer/eval shots = hi
    train_ways: int | None = None  # ways of training episodes; None: ways (see episodes.py)
    # Training labels: "episode" (0..ways-1 per episode) or "class" (the class's index in the
    # training split, for algorithms that pretrain a classifier: baseline, baseline_pp).
    train_labels: str = "episode"
    train_queries: int | None = None  # queries per class of training episodes; None: num_queries
    # [lo, hi]: each training episode draws its shots, padded to hi (validation and test keep
    # trainer.shots and eval.shots)
    train_shots_range: list[int] | None = None
    data_dir: str | None = None  # TFDS data dir; None: $TFDS_DATA_DIR or ~/tensorflow_datasets
    manual_dir: str | None = None  # the downloaded sources (see the dataset's module)

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        check_episode_settings(
            self.ways,
            self.num_queries,
            self.ways_range,
            self.shots_range,
            self.train_ways,
            self.train_labels,
            self.train_queries,
            self.train_shots_range,
        )


def image_episodes(
    config: ImageEpisodesConfig,
    builder: Callable[[], type],
    transform: Callable[[ClassSplit], ClassSplit] | None = None,
) -> TaskFamily:
    """The episode family of ``config``: prepare the TFDS dataset ``builder()`` returns (if not
    yet prepared), read its splits, apply ``transform`` to each and sample episodes from them.

    ``builder`` is a function returning the builder class, so the dataset module imports its
    TFDS builder (and TensorFlow Datasets) only here, after the settings were checked (by the
    config, when it was made).
    """
    c = config
    from metalearn.data.fewshot_builder import load_split_arrays  # imports TensorFlow Datasets

    arrays = load_split_arrays(builder(), data_dir=c.data_dir, manual_dir=c.manual_dir)
    if transform is not None:
        arrays = {split: transform(a) for split, a in arrays.items()}
    return episode_distribution(
        arrays,
        ways=c.ways,
        num_queries=c.num_queries,
        dataset=c.name,
        ways_range=c.ways_range,
        shots_range=c.shots_range,
        train_ways=c.train_ways,
        train_labels=c.train_labels,
        train_queries=c.train_queries,
        train_shots_range=c.train_shots_range,
    )
