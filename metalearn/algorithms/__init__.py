"""Meta-learning algorithms, one file each, registered by name in ``ALGORITHMS``.

Each factory takes the :class:`~metalearn.data.task.Objective` (a model scored on a task
family) and its config dataclass (the one home of its defaults; keyword overrides allowed), and
returns a :class:`MetaLearner` of pure functions, as optax's transforms are functions:

>>> from metalearn import algorithms
>>> algorithms.maml.__name__, sorted(algorithms.__all__)[:3]
('maml', ['InnerLoopConfig', 'MetaLearner', 'TaskContext'])
"""

from metalearn.algorithms.anil import anil
from metalearn.algorithms.base import InnerLoopConfig, MetaLearner, TaskContext, context
from metalearn.algorithms.baseline import baseline, baseline_pp
from metalearn.algorithms.boil import boil
from metalearn.algorithms.cavia import cavia
from metalearn.algorithms.imaml import imaml
from metalearn.algorithms.maml import fomaml, maml
from metalearn.algorithms.mamlpp import mamlpp
from metalearn.algorithms.meta_sgd import meta_sgd
from metalearn.algorithms.metaoptnet import metaoptnet_svm
from metalearn.algorithms.protonet import protonet
from metalearn.algorithms.r2d2 import r2d2
from metalearn.algorithms.reptile import reptile

__all__ = [
    "InnerLoopConfig",
    "MetaLearner",
    "TaskContext",
    "anil",
    "baseline",
    "baseline_pp",
    "boil",
    "cavia",
    "context",
    "fomaml",
    "imaml",
    "maml",
    "mamlpp",
    "meta_sgd",
    "metaoptnet_svm",
    "protonet",
    "r2d2",
    "reptile",
]
