"""Multi-layer perceptron (Finn et al.'s 1-40-40-1 sinusoid regressor)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax

from metalearn.models.base import ModelParts
from metalearn.registry import MODELS

ACTIVATIONS = {"relu": nn.relu, "tanh": nn.tanh, "gelu": nn.gelu}
# Weight initialisers by name; biases always start at zero. "truncated_normal" is Finn et al.'s
# reference code (cbfinn/maml, maml.py construct_fc_weights: tf.truncated_normal(stddev=0.01),
# cut at two standard deviations, as jax.nn.initializers.truncated_normal is); "lecun_normal" is
# Flax's default for nn.Dense.
KERNEL_INITS = ("lecun_normal", "truncated_normal")
DEFAULT_KERNEL_STD = 0.01  # MLPConfig.kernel_std, the reference code's (cbfinn/maml)


def kernel_initializer(name: str, std: float) -> Callable:
    """The weight initialiser called ``name`` (``std`` is used by ``truncated_normal`` only).

    >>> import jax
    >>> w = kernel_initializer("truncated_normal", 0.01)(jax.random.key(0), (40, 40))
    >>> bool(abs(w).max() <= 0.02), round(float(w.std()), 3)
    (True, 0.009)
    """
    if name == "lecun_normal":
        return nn.initializers.lecun_normal()
    if name == "truncated_normal":
        return nn.initializers.truncated_normal(stddev=std)
    raise ValueError(f"model.kernel_init must be one of {list(KERNEL_INITS)}, got {name!r}")


@dataclasses.dataclass
class MLPConfig:
    name: str = "mlp"
    hidden_sizes: tuple[int, ...] = (40, 40)
    activation: str = "relu"
    kernel_init: str = "lecun_normal"
    kernel_std: float = DEFAULT_KERNEL_STD

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"model.activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}"
            )
        if not self.hidden_sizes or any(int(w) < 1 for w in self.hidden_sizes):
            raise ValueError(
                f"model.hidden_sizes must be positive widths, got {list(self.hidden_sizes)}"
            )
        if self.kernel_init not in KERNEL_INITS:
            raise ValueError(
                f"model.kernel_init must be one of {list(KERNEL_INITS)}, got {self.kernel_init!r}"
            )
        if not self.kernel_std > 0:
            raise ValueError(f"model.kernel_std must be > 0, got {self.kernel_std}")
        if self.kernel_init != "truncated_normal" and self.kernel_std != DEFAULT_KERNEL_STD:
            raise ValueError(
                f"model.kernel_std={self.kernel_std} is used by model.kernel_init="
                f"truncated_normal only, and model.kernel_init={self.kernel_init}: set "
                "model.kernel_init=truncated_normal, or leave kernel_std out"
            )


class MLP(nn.Module):
    """Dense layers with an activation between them; the last layer is named ``head``.

    >>> import jax, jax.numpy as jnp
    >>> params = MLP((40, 40), 1).init(jax.random.key(0), jnp.zeros((1, 1)))["params"]
    >>> sorted(params), params["hidden_0"]["kernel"].shape
    (['head', 'hidden_0', 'hidden_1'], (1, 40))
    """

    hidden_sizes: Sequence[int]
    num_outputs: int
    activation: str = MLPConfig.activation  # defaults: MLPConfig, their one home
    kernel_init: str = MLPConfig.kernel_init
    kernel_std: float = MLPConfig.kernel_std

    def setup(self):
        init = kernel_initializer(self.kernel_init, self.kernel_std)
        self.hidden = [nn.Dense(width, kernel_init=init) for width in self.hidden_sizes]
        self.head = nn.Dense(self.num_outputs, kernel_init=init)

    def embed(self, x: jax.Array) -> jax.Array:
        for layer in self.hidden:
            x = ACTIVATIONS[self.activation](layer(x))
        return x

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(self.embed(x))


@MODELS.register("mlp", MLPConfig, parts=ModelParts(head="head", embed="embed"))
def mlp(num_outputs: int, config: MLPConfig | None = None) -> MLP:
    """The MLP ``config`` describes (default :class:`MLPConfig`), with ``num_outputs`` outputs.

    >>> mlp(1).hidden_sizes
    (40, 40)
    >>> mlp(1, MLPConfig(kernel_init="truncated_normal")).kernel_init
    'truncated_normal'
    """
    c = config or MLPConfig()
    widths = tuple(int(w) for w in c.hidden_sizes)
    return MLP(widths, num_outputs, c.activation, c.kernel_init, float(c.kernel_std))
