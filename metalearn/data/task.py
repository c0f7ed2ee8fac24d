"""What a task distribution hands to the meta-learners."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

PyTree = Any
Batch = tuple[jax.Array, jax.Array]  # (inputs, targets)


class Task(NamedTuple):
    """One task: a support set to adapt on and a query set to evaluate on."""

    support: Batch
    query: Batch


class TaskDistribution(NamedTuple):
    """A family of tasks, sampled on the device inside jitted code.

    ``splits`` maps a split name (``"train"``, ``"val"``, ``"test"``) to the device arrays the
    sampler needs for it (an empty dict for generated tasks such as sinusoids). They are passed to
    ``sample`` as an argument, never closed over, so they are not baked into compiled code.
    ``sample(split_arrays, key, shots)`` returns one :class:`Task`; ``shots`` is a static int
    (support examples per class, or per task for regression). Everything else a sampler needs
    (ways, queries) is fixed when the distribution is built.
    """

    splits: dict[str, PyTree]
    sample: Callable[[PyTree, jax.Array, int], Task]
    input_shape: tuple[int, ...]
    num_outputs: int
    kind: str  # "regression" or "classification"
    ways: int | None = None
