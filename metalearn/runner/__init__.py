"""The experiment runner: jitted meta-steps, evaluation, checkpoints, logging."""

from metalearn.runner.loop import NonFiniteError, train_and_evaluate

__all__ = ["NonFiniteError", "train_and_evaluate"]
