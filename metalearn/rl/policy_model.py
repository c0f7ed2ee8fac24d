"""The Gaussian MLP policy as a registered model (``model=gaussian_mlp``).

The same policy as :mod:`metalearn.rl.policy` (Finn et al. 2017: two hidden layers of 100 ReLU
units, Glorot-uniform weights, zero biases, a learned state-independent log-std starting at
``log(init_std)``), as a Flax module so the runner builds, checkpoints and counts it like any
model. Its output is the pair ``(mean, log_std)``, which RL task families require.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from metalearn.models.base import ModelParts
from metalearn.registry import MODELS


class GaussianMLP(nn.Module):
    """``obs -> (mean, log_std)``; the mean's layer is the head.

    >>> module = GaussianMLP((100, 100), 2)
    >>> params = module.init(jax.random.key(0), jnp.zeros((1, 2)))["params"]
    >>> sorted(params), params["hidden_0"]["kernel"].shape
    (['head', 'hidden_0', 'hidden_1', 'log_std'], (2, 100))
    >>> [a.shape for a in module.apply({"params": params}, jnp.zeros((5, 2)))]
    [(5, 2), (5, 2)]
    """

    hidden_sizes: Sequence[int]
    action_dim: int
    init_std: float = 1.0
    head_scale: float = 1.0  # the mean layer's Glorot weights times this

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        glorot = nn.initializers.xavier_uniform()
        h = obs
        for i, width in enumerate(self.hidden_sizes):
            h = nn.relu(nn.Dense(width, kernel_init=glorot, name=f"hidden_{i}")(h))
        head_init = lambda *a: self.head_scale * glorot(*a)  # noqa: E731
        mean = nn.Dense(self.action_dim, kernel_init=head_init, name="head")(h)
        log_std = self.param(
            "log_std", nn.initializers.constant(math.log(self.init_std)), (self.action_dim,)
        )
        return mean, jnp.broadcast_to(log_std, mean.shape)


# The largest scale (and, for the standard deviation, the inverse of the smallest) whose square
# float32 holds with room to spare: 1e300 became an infinite std and a NaN at the first step.
FLOAT32_SCALE = 1e6


@dataclasses.dataclass
class GaussianMLPConfig:
    name: str = "gaussian_mlp"
    hidden_sizes: tuple[int, ...] = (100, 100)
    init_std: float = 1.0  # rllab's GaussianMLPPolicy
    # The mean layer's initial weights: Glorot-uniform times this (1: the paper's). Smaller
    # values start the mean actions near 0 instead of beyond a control range.
    head_init_scale: float = 1.0

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        if not self.hidden_sizes or min(self.hidden_sizes) < 1:
            raise ValueError(f"model.hidden_sizes must be positive widths, got {self.hidden_sizes}")
        if not 0 < self.head_init_scale <= FLOAT32_SCALE:  # beyond, squared actions overflow
            raise ValueError(
                f"model.head_init_scale must be in (0, {FLOAT32_SCALE:g}], got "
                f"{self.head_init_scale}"
            )
        if not 1 / FLOAT32_SCALE <= self.init_std <= FLOAT32_SCALE:  # std**2: not 0 or inf
            raise ValueError(
                f"model.init_std must be in [{1 / FLOAT32_SCALE:g}, {FLOAT32_SCALE:g}], got "
                f"{self.init_std}"
            )


@MODELS.register("gaussian_mlp", GaussianMLPConfig, parts=ModelParts(head="head"))
def gaussian_mlp(num_outputs: int, config: GaussianMLPConfig | None = None) -> GaussianMLP:
    """The policy ``config`` describes, with ``num_outputs`` action dimensions.

    >>> gaussian_mlp(2).hidden_sizes
    (100, 100)
    """
    c = config or GaussianMLPConfig()
    return GaussianMLP(tuple(c.hidden_sizes), num_outputs, c.init_std, c.head_init_scale)
