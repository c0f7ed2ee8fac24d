"""Task distributions, registered by name in ``TASKS``."""

from metalearn.data import (  # noqa: F401  (each module registers its task distributions)
    cifar,
    miniimagenet,
    omniglot,
    sinusoid,
)
from metalearn.data.task import Task, TaskDistribution

__all__ = ["Task", "TaskDistribution"]
