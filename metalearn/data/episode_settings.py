"""The checks of the episode settings that need no data (the ``data.*`` keys of the image
families): :class:`~metalearn.data.image_families.ImageEpisodesConfig` checks itself with them
when it is made, and :func:`metalearn.data.episodes.episode_distribution` when it is built."""

from __future__ import annotations

# The labels of training episodes: "episode", 0..ways-1 in a random order (meta-learning);
# "class", each class's index in the training split (pretraining a classifier over all of them).
TRAIN_LABELS = ("episode", "class")


def check_episode_settings(
    ways: int,
    num_queries: int,
    ways_range: tuple[int, int] | None = None,
    shots_range: tuple[int, int] | None = None,
    train_ways: int | None = None,
    train_labels: str = "episode",
    train_queries: int | None = None,
    train_shots_range: tuple[int, int] | None = None,
) -> None:
    """Raise ValueError naming the ``data.*`` key for invalid episode settings (those that need
    no data; :class:`~metalearn.data.image_families.ImageEpisodesConfig` checks itself with it).

    >>> check_episode_settings(ways=1, num_queries=15)
    Traceback (most recent call last):
    ...
    ValueError: data.ways must be >= 2, got 1
    >>> check_episode_settings(ways=5, num_queries=15, ways_range=(5, 3))
    Traceback (most recent call last):
    ...
    ValueError: data.ways_range must be [lo, hi] with 2 <= lo <= hi, got [5, 3]
    """
    if not isinstance(ways, int) or ways < 2:
        raise ValueError(f"data.ways must be >= 2, got {ways}")
    if not isinstance(num_queries, int) or num_queries < 1:
        raise ValueError(f"data.num_queries must be >= 1, got {num_queries}")
    if ways_range is not None and not is_range(ways_range, 2):
        raise ValueError(
            f"data.ways_range must be [lo, hi] with 2 <= lo <= hi, got {list(ways_range)}"
        )
    if shots_range is not None and not is_range(shots_range, 1):
        raise ValueError(
            f"data.shots_range must be [lo, hi] with 1 <= lo <= hi, got {list(shots_range)}"
        )
    if train_ways is not None:
        if ways_range is not None:
            raise ValueError(
                "data.train_ways and data.ways_range cannot both be set: train_ways fixes the "
                "ways of training episodes; drop one of them"
            )
        check_episode_settings(train_ways, num_queries)
    if train_queries is not None and (not isinstance(train_queries, int) or train_queries < 1):
        raise ValueError(
            f"data.train_queries must be >= 1 (or null: data.num_queries), got {train_queries}"
        )
    if train_labels not in TRAIN_LABELS:
        raise ValueError(
            f"data.train_labels must be one of {list(TRAIN_LABELS)}, got {train_labels!r}"
        )
    if train_shots_range is not None and not is_range(train_shots_range, 1):
        raise ValueError(
            "data.train_shots_range must be [lo, hi] with 1 <= lo <= hi, got "
            f"{list(train_shots_range)}"
        )
    if train_shots_range is not None and (shots_range is not None or ways_range is not None):
        raise ValueError(
            "data.train_shots_range draws the shots of training episodes alone; with "
            "data.shots_range or data.ways_range every split's episodes vary: drop one of them"
        )
    variable = (ways_range, shots_range, train_shots_range)
    if train_labels == "class" and any(v is not None for v in variable):
        raise ValueError(
            "data.train_labels=class takes fixed episodes: drop data.ways_range, "
            "data.shots_range and data.train_shots_range"
        )


def is_range(value, low: int) -> bool:
    """Whether ``value`` is ``[lo, hi]`` of ints with ``low <= lo <= hi``.

    >>> is_range([1, 9], 1), is_range((3, 2), 1)
    (True, False)
    """
    return (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(v, int) for v in value)
        and low <= value[0] <= value[1]
    )
