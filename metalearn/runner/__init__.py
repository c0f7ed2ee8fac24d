"""The experiment runner: a config resolved into a plan, its parts built and checked once,
jitted meta-steps, evaluation, checkpoints, and the run directory that keeps them.

>>> from metalearn.runner import RunPlan, build, resolve, train_and_evaluate
"""

from metalearn.runner.experiment import Experiment, build
from metalearn.runner.loop import NonFiniteError, train_and_evaluate
from metalearn.runner.plan import RunPlan, resolve

__all__ = ["Experiment", "NonFiniteError", "RunPlan", "build", "resolve", "train_and_evaluate"]
