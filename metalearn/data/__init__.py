"""Task families, registered by name in ``TASKS`` (the config group ``data``)."""

from metalearn.data import (  # noqa: F401  (each module registers its task families)
    cifar,
    miniimagenet,
    omniglot,
    sinusoid,
)
from metalearn.data.task import Task, TaskFamily

__all__ = ["Task", "TaskFamily"]
