"""Task distributions, registered by name in ``TASKS``."""

from metalearn.data import sinusoid  # noqa: F401  (registers sinusoid)
from metalearn.data.task import Task, TaskDistribution

__all__ = ["Task", "TaskDistribution"]
