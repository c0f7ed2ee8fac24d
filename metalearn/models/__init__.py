"""Flax models, registered by name in ``MODELS``."""

from metalearn.models import conv4, mlp, resnet12, rrnet  # noqa: F401  (each registers its model)
from metalearn.models.base import Model, model_from_flax

__all__ = ["Model", "model_from_flax"]
