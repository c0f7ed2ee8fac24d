"""R2D2's network (Bertinetto et al. 2019; the reference code's ``RRFeatures``, bertinetto/r2d2
``fewshots/models/load_model.py``): four blocks of a 3x3 convolution (96, 192, 384 and 512
filters), batch norm, a 2x2 max-pool (stride 2 in blocks 1-3, stride 1 in block 4) and
LeakyReLU(0.1), with dropout after blocks 3 and 4 when training. The embedding concatenates
block 3's output, max-pooled once more with stride 1, and block 4's, both flattened: 31,104 +
41,472 = 72,576 features at 84x84, 3,456 + 4,608 = 8,064 at 32x32. A dense layer named ``head``
maps the embedding to ``num_outputs`` logits (R2D2 solves its own head on the embedding).

Batch norm is :class:`~metalearn.models.resnet12.RunningBatchNorm` (running statistics,
PyTorch's momentum 0.1, used in evaluation mode unless ``eval_running_stats`` is false), as in
the reference, which evaluates in ``model.eval()`` mode. Convolutions start as PyTorch's
(uniform in ``+-1/sqrt(fan_in)``) and have no bias: batch norm subtracts it straight away.

>>> import jax, jax.numpy as jnp
>>> net = RRNet(num_outputs=5, filters=(4, 4, 8, 8))
>>> x = jnp.ones((2, 32, 32, 3))
>>> variables = net.init(jax.random.key(0), x)
>>> net.apply(variables, x, method="embed").shape  # 3 * 3 * 8 + 3 * 3 * 8
(2, 144)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from metalearn.models.conv4 import check_conv, resolve_conv
from metalearn.models.patch_conv import PatchConv
from metalearn.models.resnet12 import (
    BLOCKS,
    RESNET12_PARTS,
    RunningBatchNorm,
    check_blocks,
    dropout,
    leaky_relu,
)
from metalearn.registry import MODELS

DROPOUT_BLOCKS = (3, 4)


@dataclasses.dataclass
class RRNetConfig:
    name: str = "rrnet"
    filters: tuple[int, ...] = (96, 192, 384, 512)
    drop_rate: float = (
        0.1  # dropout after blocks 3 and 4 (the reference: 0.1 miniImageNet, 0.4 CIFAR)
    )
    conv: str = "auto"  # auto (im2col on CPU, xla elsewhere) | xla | im2col
    eval_running_stats: bool = True  # evaluation mode: running statistics (False: the batch's)

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        check_blocks(self.filters, self.drop_rate)
        check_conv(self.conv)


class RRNet(nn.Module):
    """R2D2's network with a dense ``head``; see the module docstring."""

    num_outputs: int
    # Defaults: RRNetConfig, their one home.
    filters: Sequence[int] = RRNetConfig.filters
    drop_rate: float = RRNetConfig.drop_rate
    conv: str = RRNetConfig.conv
    eval_running_stats: bool = RRNetConfig.eval_running_stats

    def setup(self):
        layer = PatchConv if resolve_conv(self.conv) == "im2col" else nn.Conv
        init = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")  # PyTorch's
        for k, width in zip(BLOCKS, self.filters, strict=True):
            conv = layer(width, (3, 3), padding="SAME", use_bias=False, kernel_init=init)
            setattr(self, f"block{k}_conv", conv)
            setattr(self, f"block{k}_norm", RunningBatchNorm())
        self.head = nn.Dense(self.num_outputs)

    def _dropout(self, x: jax.Array, train: bool) -> jax.Array:
        if not train or self.drop_rate <= 0:
            return x
        return dropout(x, self.make_rng("dropout"), self.drop_rate)

    def embed(self, x: jax.Array, train: bool = False, mask: jax.Array | None = None) -> jax.Array:
        """Features before the head, ``[batch, features]``, for NHWC inputs ``x``; batch norm
        over the examples ``mask`` marks (all when None)."""
        flat = lambda h: h.reshape(h.shape[0], -1)  # noqa: E731
        for k in BLOCKS:
            h = getattr(self, f"block{k}_conv")(x)
            h = getattr(self, f"block{k}_norm")(h, train, self.eval_running_stats, mask)
            stride = 1 if k == 4 else 2
            h = leaky_relu(nn.max_pool(h, (2, 2), strides=(stride, stride), padding="VALID"))
            x = self._dropout(h, train) if k in DROPOUT_BLOCKS else h
            if k == 3:
                block3 = flat(nn.max_pool(x, (2, 2), strides=(1, 1), padding="VALID"))
        return jnp.concatenate([block3, flat(x)], axis=1)

    def __call__(
        self, x: jax.Array, train: bool = False, mask: jax.Array | None = None
    ) -> jax.Array:
        return self.head(self.embed(x, train, mask))


# Its parts are ResNet-12's: a ``head`` entry, ``embed``, RunningBatchNorm layers.
@MODELS.register("rrnet", RRNetConfig, parts=RESNET12_PARTS)
def rrnet(num_outputs: int, config: RRNetConfig | None = None) -> RRNet:
    """R2D2's network with ``num_outputs`` logits, its settings checked.

    >>> rrnet(5).filters
    (96, 192, 384, 512)
    """
    c = config or RRNetConfig()
    filters = tuple(int(f) for f in c.filters)
    return RRNet(int(num_outputs), filters, float(c.drop_rate), c.conv, bool(c.eval_running_stats))
