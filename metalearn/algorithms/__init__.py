"""Meta-learning algorithms, one file each, registered by name in ``ALGORITHMS``."""

from metalearn.algorithms import maml  # noqa: F401  (registers maml, fomaml)
from metalearn.algorithms.base import MetaLearner

__all__ = ["MetaLearner"]
