"""Multi-layer perceptron (Finn et al.'s 1-40-40-1 sinusoid regressor)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import flax.linen as nn
import jax

from metalearn.models.base import ModelParts
from metalearn.registry import MODELS

ACTIVATIONS = {"relu": nn.relu, "tanh": nn.tanh, "gelu": nn.gelu}


class MLP(nn.Module):
    """Dense layers with an activation between them; the last layer is named ``head``.

    >>> import jax, jax.numpy as jnp
    >>> params = MLP((40, 40), 1).init(jax.random.key(0), jnp.zeros((1, 1)))["params"]
    >>> sorted(params), params["hidden_0"]["kernel"].shape
    (['head', 'hidden_0', 'hidden_1'], (1, 40))
    """

    hidden_sizes: Sequence[int]
    num_outputs: int
    activation: str = "relu"

    def setup(self):
        self.hidden = [nn.Dense(width) for width in self.hidden_sizes]
        self.head = nn.Dense(self.num_outputs)

    def embed(self, x: jax.Array) -> jax.Array:
        for layer in self.hidden:
            x = ACTIVATIONS[self.activation](layer(x))
        return x

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(self.embed(x))


@dataclasses.dataclass
class MLPConfig:
    name: str = "mlp"
    hidden_sizes: tuple[int, ...] = (40, 40)
    activation: str = "relu"


@MODELS.register("mlp", MLPConfig, parts=ModelParts(head="head", embed="embed"))
def mlp(num_outputs: int, config: MLPConfig | None = None) -> MLP:
    """The MLP ``config`` describes (default :class:`MLPConfig`), with ``num_outputs`` outputs.

    >>> mlp(1).hidden_sizes
    (40, 40)
    """
    c = config or MLPConfig()
    if c.activation not in ACTIVATIONS:
        raise ValueError(
            f"model.activation must be one of {sorted(ACTIVATIONS)}, got {c.activation!r}"
        )
    if not c.hidden_sizes or any(int(w) < 1 for w in c.hidden_sizes):
        raise ValueError(f"model.hidden_sizes must be positive widths, got {list(c.hidden_sizes)}")
    return MLP(tuple(int(w) for w in c.hidden_sizes), num_outputs, c.activation)
