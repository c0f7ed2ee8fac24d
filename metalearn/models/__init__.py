"""Flax models, registered by name in ``MODELS``."""

from metalearn.models import mlp  # noqa: F401  (registers mlp)
from metalearn.models.base import Model, model_from_flax

__all__ = ["Model", "model_from_flax"]
