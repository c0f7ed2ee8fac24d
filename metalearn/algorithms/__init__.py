"""Meta-learning algorithms, one file each, registered by name in ``ALGORITHMS``.

``maml``, ``fomaml``, ``reptile``, ``anil``, ``meta_sgd``, ``mamlpp``, ``imaml``, ``protonet``:
each factory takes the :class:`~metalearn.models.base.Model` and the fields of its config
dataclass, and returns a :class:`MetaLearner` of pure functions.
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
from metalearn.algorithms.base import MetaLearner, algorithm_lr_schedule

__all__ = ["MetaLearner", "algorithm_lr_schedule"]
