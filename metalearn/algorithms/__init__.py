"""Meta-learning algorithms, one file each, registered by name in ``ALGORITHMS``.

``maml``, ``fomaml``, ``reptile``, ``anil``, ``meta_sgd``, ``mamlpp``, ``imaml``, ``protonet``:
each factory takes the :class:`~metalearn.data.task.Objective` (a model scored on a task
family) and its config dataclass (the one home of its defaults; keyword overrides allowed), and
returns a :class:`MetaLearner` of pure functions.
"""

from metalearn.algorithms import (  # noqa: F401  (each registers itself)
    anil,
    imaml,
    maml,
    mamlpp,
    meta_sgd,
    protonet,
    reptile,
)
from metalearn.algorithms.base import MetaLearner, TaskContext, context

__all__ = ["MetaLearner", "TaskContext", "context"]
