"""ResNet-12: the few-shot backbone of MetaOptNet (Lee et al., 2019) and much work since.

Four residual blocks of ``filters = (64, 160, 320, 640)`` channels, as in MetaOptNet's
``models/ResNet12_embedding.py``. Block ``k`` maps ``x`` to::

    h = leaky(norm1(conv1(x)));  h = leaky(norm2(conv2(h)));  h = norm3(conv3(h))
    out = leaky(h + shortcut_norm(shortcut_conv(x)))      # 3x3 convs, 1x1 shortcut, no biases
    out = max_pool_2x2(out);  out = drop(out)             # 84 -> 42 -> 21 -> 10 -> 5

``leaky`` is LeakyReLU(0.1). ``drop`` is ordinary dropout at ``drop_rate`` after blocks 1 and 2
and DropBlock (:mod:`metalearn.models.dropblock`) of ``dropblock_size`` after blocks 3 and 4,
both only when training, as MetaOptNet does (``drop_rate=0.1, dropblock_size=5`` on
miniImageNet, ``dropblock_size=2`` on CIFAR-FS and FC100). ``dropblock_ramp`` > 0 turns on
MetaOptNet's linear schedule: the DropBlock rate grows as ``drop_rate * min(1, calls / ramp)``
over training-mode calls (MetaOptNet ramps over 40,000 forward calls); the call count is kept in
the ``batch_stats`` collection as the entry ``dropblock_calls`` (float32, so averaging states over
tasks keeps it exact). With ``dropblock_ramp=0`` (the default) the rate is constant.

``readout`` makes the embedding: ``"mean"`` over the last map (640 features; MetaOptNet's
``avg_pool=True``) or ``"flatten"`` (5 * 5 * 640 = 16,000 features at 84x84, MetaOptNet's
default). A dense layer named ``head`` maps the embedding to ``num_outputs`` logits.

Conventions (inputs NHWC float32):

- ``module.apply(variables, x, train=False)`` returns logits; ``method="embed"`` the features.
- Batch norm (:class:`RunningBatchNorm`) keeps running statistics (PyTorch's momentum 0.1 and
  epsilon 1e-5) in the ``batch_stats`` collection: with ``train=True`` it normalises with the
  batch's statistics and updates the running ones (call with ``mutable=["batch_stats"]``);
  with ``train=False`` it uses the stored running statistics when ``eval_running_stats`` is true
  (the default, MetaOptNet's evaluation) and the batch's statistics otherwise (MAML's
  transductive batch norm), leaving them unchanged. (PyTorch stores the unbiased batch
  variance in its running average, this the biased one, as Flax's ``BatchNorm``: a factor
  ``m / (m - 1)`` on ``m`` values per channel.)
- Dropout and DropBlock draw from the ``"dropout"`` rng and are the identity when not training.
- Convolutions: Kaiming-normal, fan-out (MetaOptNet's initialisation); batch-norm scale 1,
  bias 0. ``conv`` picks XLA or im2col convolutions as in :mod:`metalearn.models.conv4`.

Parts (declared at registration, :data:`RESNET12_PARTS`): the head is the top-level entry
``head`` (ANIL adapts it; ProtoNets drop it), the embedding is :meth:`ResNet12.embed`, and the
normalisation parameters are those of the :class:`RunningBatchNorm` layers, found by type.
Every layer is a top-level entry of ``params`` (``block1_conv1``, ``block1_norm1``, ...,
``block4_shortcut_norm``, ``head``).

>>> import jax, jax.numpy as jnp
>>> net = ResNet12(num_outputs=5, filters=(8, 8, 16, 16))
>>> variables = net.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
>>> sorted(variables), len(variables["params"]), len(variables["batch_stats"])
(['batch_stats', 'params'], 33, 16)
>>> x = jnp.ones((4, 32, 32, 3))
>>> logits, state = net.apply(variables, x, train=True, mutable=["batch_stats"],
...                           rngs={"dropout": jax.random.key(1)})
>>> logits.shape, net.apply({**variables, **state}, x, method="embed").shape
((4, 5), (4, 16))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from metalearn.models.base import ModelParts, batch_moments
from metalearn.models.conv4 import READOUTS, check_conv, resolve_conv
from metalearn.models.dropblock import drop_block
from metalearn.models.patch_conv import PatchConv
from metalearn.registry import MODELS

BLOCKS = (1, 2, 3, 4)
NORMS_PER_BLOCK = ("norm1", "norm2", "norm3", "shortcut_norm")
DROPBLOCK_BLOCKS = (3, 4)  # blocks 1 and 2 use ordinary dropout
NORM_NAMES = tuple(f"block{k}_{norm}" for k in BLOCKS for norm in NORMS_PER_BLOCK)


def leaky_relu(x: jax.Array) -> jax.Array:
    return nn.leaky_relu(x, negative_slope=0.1)


def ramped_rate(drop_rate: float, calls: jax.Array, ramp: int) -> jax.Array:
    """MetaOptNet's linear DropBlock schedule: ``drop_rate * min(1, calls / ramp)``.

    >>> round(float(ramped_rate(0.1, jnp.array(10_000.0), 40_000)), 6)
    0.025
    """
    return drop_rate * jnp.minimum(1.0, calls / ramp)


def check_blocks(filters: Sequence[int], drop_rate: float) -> None:
    """ValueError unless ``filters`` are one positive width per block of :data:`BLOCKS` and
    ``drop_rate`` is in ``[0, 1)`` (``model.filters``, ``model.drop_rate``).

    >>> check_blocks((8, 8, 8), 0.1)
    Traceback (most recent call last):
    ...
    ValueError: model.filters must be 4 positive widths, got (8, 8, 8)
    """
    filters = tuple(int(f) for f in filters)
    if len(filters) != len(BLOCKS) or min(filters) < 1:
        raise ValueError(f"model.filters must be {len(BLOCKS)} positive widths, got {filters}")
    if not 0.0 <= drop_rate < 1.0:
        raise ValueError(f"model.drop_rate must be in [0, 1), got {drop_rate}")


def dropout(x: jax.Array, key: jax.Array, rate: float) -> jax.Array:
    """Inverted dropout: each entry kept with probability ``1 - rate`` and scaled by its
    inverse."""
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


class RunningBatchNorm(nn.Module):
    """Batch norm over every axis but the last, with running statistics in ``batch_stats``.

    ``train``: normalise with the batch's mean and (biased) variance (over the examples ``mask``
    marks, all when None) and, when ``batch_stats``
    is mutable, update ``mean`` and ``var`` as ``momentum * old + (1 - momentum) * batch``.
    Otherwise: normalise with the running statistics if ``running`` is true, else with the
    batch's, and leave them unchanged. Learnable ``scale`` (1) and ``bias`` (0).

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.arange(8.0).reshape(4, 2)
    >>> norm = RunningBatchNorm()
    >>> variables = norm.init(jax.random.key(0), x, False, True)
    >>> _, state = norm.apply(variables, x, True, True, mutable=["batch_stats"])
    >>> [[round(v, 4) for v in state["batch_stats"][k].tolist()] for k in ("mean", "var")]
    [[0.3, 0.4], [1.4, 1.4]]
    >>> y = norm.apply({**variables, **state}, x, False, True)  # (x - mean) / sqrt(var + eps)
    >>> round(float(y[0, 0]), 4), round(float((0.0 - 0.3) / (1.4 + 1e-5) ** 0.5), 4)
    (-0.2535, -0.2535)
    """

    momentum: float = 0.9  # Flax's convention: PyTorch's momentum 0.1
    epsilon: float = 1e-5

    @nn.compact
    def __call__(
        self, x: jax.Array, train: bool, running: bool, mask: jax.Array | None = None
    ) -> jax.Array:
        channels = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (channels,))
        bias = self.param("bias", nn.initializers.zeros, (channels,))
        mean = self.variable("batch_stats", "mean", jnp.zeros, (channels,))
        var = self.variable("batch_stats", "var", jnp.ones, (channels,))
        if not train and running:
            m, v = mean.value, var.value
        else:
            m, v = batch_moments(x, mask)
            if train and not self.is_initializing() and self.is_mutable_collection("batch_stats"):
                mean.value = self.momentum * mean.value + (1.0 - self.momentum) * m
                var.value = self.momentum * var.value + (1.0 - self.momentum) * v
        return (x - m) * (jax.lax.rsqrt(v + self.epsilon) * scale) + bias


@dataclasses.dataclass
class ResNet12Config:
    name: str = "resnet12"
    filters: tuple[int, ...] = (64, 160, 320, 640)
    readout: str = "mean"  # mean (global average pool) | flatten (MetaOptNet's default)
    drop_rate: float = 0.1  # dropout after blocks 1-2, DropBlock after blocks 3-4; 0 disables
    dropblock_size: int = 5  # 5 on miniImageNet, 2 on CIFAR-FS / FC100 (MetaOptNet)
    dropblock_ramp: int = 0  # > 0: DropBlock rate ramps linearly over this many training calls
    conv: str = "auto"  # auto (im2col on CPU, xla elsewhere) | xla | im2col
    eval_running_stats: bool = True  # evaluation mode: running statistics (False: the batch's)

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        check_blocks(self.filters, self.drop_rate)
        if self.readout not in READOUTS:
            raise ValueError(f"model.readout must be one of {READOUTS}, got {self.readout!r}")
        if int(self.dropblock_size) < 1:
            raise ValueError(f"model.dropblock_size must be >= 1, got {self.dropblock_size}")
        if int(self.dropblock_ramp) < 0:
            raise ValueError(
                f"model.dropblock_ramp must be >= 0 (0: constant), got {self.dropblock_ramp}"
            )
        check_conv(self.conv)


class ResNet12(nn.Module):
    """ResNet-12 with a dense ``head``; see the module docstring."""

    num_outputs: int
    # Defaults: ResNet12Config, their one home.
    filters: Sequence[int] = ResNet12Config.filters
    readout: str = ResNet12Config.readout
    drop_rate: float = ResNet12Config.drop_rate
    dropblock_size: int = ResNet12Config.dropblock_size
    dropblock_ramp: int = ResNet12Config.dropblock_ramp
    conv: str = ResNet12Config.conv
    eval_running_stats: bool = ResNet12Config.eval_running_stats

    def setup(self):
        layer = PatchConv if resolve_conv(self.conv) == "im2col" else nn.Conv
        init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
        layers = {}  # set as attributes: each layer is a top-level entry under its own name
        for k, width in zip(BLOCKS, self.filters, strict=True):
            for i in (1, 2, 3):
                layers[f"block{k}_conv{i}"] = layer(
                    width, (3, 3), padding="SAME", use_bias=False, kernel_init=init
                )
            layers[f"block{k}_shortcut_conv"] = layer(
                width, (1, 1), padding="SAME", use_bias=False, kernel_init=init
            )
        for name in NORM_NAMES:
            layers[name] = RunningBatchNorm()
        for name, module in layers.items():
            setattr(self, name, module)
        self.head = nn.Dense(self.num_outputs)
        if self.dropblock_ramp > 0:
            self.dropblock_calls = self.variable(
                "batch_stats", "dropblock_calls", lambda: jnp.zeros((), jnp.float32)
            )

    def _block(self, k: int, x: jax.Array, train: bool, mask: jax.Array | None) -> jax.Array:
        conv = lambda i: getattr(self, f"block{k}_conv{i}")  # noqa: E731
        norm = lambda name, h: getattr(self, name)(h, train, self.eval_running_stats, mask)  # noqa: E731
        h = leaky_relu(norm(f"block{k}_norm1", conv(1)(x)))
        h = leaky_relu(norm(f"block{k}_norm2", conv(2)(h)))
        h = norm(f"block{k}_norm3", conv(3)(h))
        shortcut = getattr(self, f"block{k}_shortcut_conv")(x)
        h = leaky_relu(h + norm(f"block{k}_shortcut_norm", shortcut))
        return nn.max_pool(h, (2, 2), strides=(2, 2), padding="VALID")

    def _dropblock_rate(self, train: bool) -> float | jax.Array:
        if self.dropblock_ramp <= 0:
            return self.drop_rate
        calls = self.dropblock_calls
        if train and not self.is_initializing() and self.is_mutable_collection("batch_stats"):
            calls.value = calls.value + 1.0
        return ramped_rate(self.drop_rate, calls.value, self.dropblock_ramp)

    def embed(self, x: jax.Array, train: bool = False, mask: jax.Array | None = None) -> jax.Array:
        """Features before the head, ``[batch, features]``, for NHWC inputs ``x``; batch norm
        over the examples ``mask`` marks (all when None)."""
        rate = self._dropblock_rate(train)
        for k in BLOCKS:
            x = self._block(k, x, train, mask)
            if not train or self.drop_rate <= 0:
                continue
            key = self.make_rng("dropout")
            if k in DROPBLOCK_BLOCKS:
                x = drop_block(x, key, rate, self.dropblock_size)
            else:
                x = dropout(x, key, self.drop_rate)
        if self.readout == "mean":
            return jnp.mean(x, axis=(1, 2))
        return x.reshape(x.shape[0], -1)

    def __call__(
        self, x: jax.Array, train: bool = False, mask: jax.Array | None = None
    ) -> jax.Array:
        return self.head(self.embed(x, train, mask))


RESNET12_PARTS = ModelParts(
    head="head", embed="embed", convolutional=True, norm_layers=(RunningBatchNorm,)
)


@MODELS.register("resnet12", ResNet12Config, parts=RESNET12_PARTS)
def resnet12(num_outputs: int, config: ResNet12Config | None = None) -> ResNet12:
    """ResNet-12 with ``num_outputs`` logits, its settings checked.

    >>> resnet12(5, ResNet12Config(readout="flatten")).filters
    (64, 160, 320, 640)
    """
    c = config or ResNet12Config()
    filters = tuple(int(f) for f in c.filters)
    return ResNet12(
        int(num_outputs),
        filters,
        c.readout,
        float(c.drop_rate),
        int(c.dropblock_size),
        int(c.dropblock_ramp),
        c.conv,
        bool(c.eval_running_stats),
    )
