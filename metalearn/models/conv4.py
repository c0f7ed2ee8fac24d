"""Conv4: the four-block convolutional network of Vinyals et al. (2016) as used by MAML.

Each block is a 3x3 convolution (``filters`` channels, "SAME" padding), batch normalisation
and ReLU, then the block halves the resolution:

- ``downsample="stride"``: the convolution has stride 2 (Finn et al.'s Omniglot network,
  64 filters: 28 -> 14 -> 7 -> 4 -> 2);
- ``downsample="maxpool"``: stride 1 and a 2x2 max-pool (their miniImageNet network,
  32 filters: 84 -> 42 -> 21 -> 10 -> 5).

``readout`` turns the last feature map into the feature vector: ``"flatten"`` (miniImageNet:
5 * 5 * 32 = 800 features) or ``"mean"`` over the spatial positions (Omniglot in Finn et al.'s
code: 64 features). A dense layer named ``head`` maps the features to ``num_outputs`` logits;
:meth:`Conv4.embed` returns the features.

Batch normalisation uses the statistics of the current batch, always (as in the MAML paper and
its code, where the support and query sets are normalised with their own statistics): no
running averages and no mutable collections, so the module has only a ``params`` collection and
the wrapped :class:`metalearn.models.base.Model` stays a pure function of its parameters. Its
bias (offset) is a learnable parameter, and so is its scale unless ``norm_scale=False``: Finn et
al.'s code uses ``tf.contrib.layers.batch_norm`` with its defaults (``center=True``,
``scale=False``), an offset and no scale. Inputs are NHWC (JAX's fast layout on CPU and GPU).
Convolutions use Glorot-uniform initialisation (Finn et al.'s ``xavier_initializer``), biases
zero.

``conv`` picks how the convolutions are computed, with the same parameters either way:
``"xla"`` is ``flax.linen.Conv`` (XLA's convolution), ``"im2col"`` is
:class:`metalearn.models.patch_conv.PatchConv` (a matrix product over image patches, which stays
fast on XLA:CPU when tasks are batched by ``vmap`` or looped over; see that module), and
``"auto"`` (the default) chooses ``im2col`` on CPU and ``xla`` on GPUs and TPUs. With
``im2col`` a layer with fewer patch channels than filters (the first: 3 x 3 x 1 taps for 64
filters) is batch-normalised through its patches (:class:`BatchStatNorm` on a
:class:`~metalearn.models.patch_conv.PatchProduct`), its output written once, already
normalised.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from metalearn.models.base import ModelParts, batch_covariance, batch_moments
from metalearn.models.patch_conv import PatchConv, PatchProduct
from metalearn.registry import MODELS

DOWNSAMPLING = ("stride", "maxpool")
READOUTS = ("flatten", "mean")
CONVS = ("auto", "xla", "im2col")


def check_conv(conv: str) -> None:
    """ValueError unless ``conv`` is one of :data:`CONVS` (without asking JAX for a backend)."""
    if conv not in CONVS:
        raise ValueError(f"model.conv must be one of {CONVS}, got {conv!r}")


def resolve_conv(conv: str) -> str:
    """``"xla"`` or ``"im2col"``: ``"auto"`` is ``im2col`` on CPU, ``xla`` elsewhere.

    >>> resolve_conv("xla")
    'xla'
    """
    check_conv(conv)
    if conv != "auto":
        return conv
    return "im2col" if jax.default_backend() == "cpu" else "xla"


class BatchStatNorm(nn.Module):
    """Batch normalisation with the current batch's statistics; a learnable ``bias`` and, with
    ``use_scale`` (the default), a learnable ``scale``.

    Normalises over every axis but the last (channels), over the examples ``mask`` marks (all
    when None; :func:`~metalearn.models.base.batch_moments`). No running averages are kept.

    ``x`` may also be a :class:`~metalearn.models.patch_conv.PatchProduct` (a convolution with
    fewer patch channels than outputs, not yet evaluated): its mean and variance then come from
    the patches' mean and covariance, and the normalised output is one product of the centred
    patches with the kernel scaled per channel. The values are the same; the convolution's bias
    drops out of a batch-normalised output either way (its gradient is then exactly zero).

    >>> import jax, jax.numpy as jnp
    >>> x = jax.random.normal(jax.random.key(0), (8, 3, 3, 4)) * 5.0 + 2.0
    >>> y, _ = BatchStatNorm().init_with_output(jax.random.key(1), x)
    >>> bool(jnp.allclose(y.mean((0, 1, 2)), 0.0, atol=1e-5))
    True
    """

    epsilon: float = 1e-3  # TensorFlow's batch_norm default, as in Finn et al.'s code
    use_scale: bool = True

    @nn.compact
    def __call__(self, x: jax.Array | PatchProduct, mask: jax.Array | None = None) -> jax.Array:
        channels = x.shape[-1]
        bias = self.param("bias", nn.initializers.zeros, (channels,))
        scale = self.param("scale", nn.initializers.ones, (channels,)) if self.use_scale else 1.0
        if isinstance(x, PatchProduct):
            mean, cov = batch_covariance(x.patches, mask)
            var = jnp.einsum("ko,kl,lo->o", x.kernel, cov, x.kernel)
            inv = jax.lax.rsqrt(var + self.epsilon) * scale
            return PatchProduct(x.patches - mean, x.kernel * inv, bias).value()
        mean, var = batch_moments(x, mask)
        inv = jax.lax.rsqrt(var + self.epsilon) * scale
        return (x - mean) * inv + bias


@dataclasses.dataclass
class Conv4Config:
    name: str = "conv4"
    filters: int = 64
    downsample: str = "stride"  # stride (Omniglot) | maxpool (miniImageNet)
    readout: str = "mean"  # mean (Omniglot in Finn et al.'s code) | flatten (miniImageNet)
    conv: str = "auto"  # auto (im2col on CPU, xla elsewhere) | xla | im2col
    norm_scale: bool = True  # False: batch norm offsets only, as in Finn et al.'s code

    def __post_init__(self) -> None:  # a bad value is refused when the config is made
        if self.downsample not in DOWNSAMPLING:
            raise ValueError(
                f"model.downsample must be one of {DOWNSAMPLING}, got {self.downsample!r}"
            )
        if self.readout not in READOUTS:
            raise ValueError(f"model.readout must be one of {READOUTS}, got {self.readout!r}")
        if int(self.filters) < 1:
            raise ValueError(f"model.filters must be >= 1, got {self.filters}")
        check_conv(self.conv)


class Conv4(nn.Module):
    """Four [3x3 conv, batch-statistics norm, ReLU] blocks and a dense ``head``.

    >>> import jax, jax.numpy as jnp
    >>> net = Conv4(num_outputs=5)
    >>> params = net.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))["params"]
    >>> sorted(params)[:3], params["head"]["kernel"].shape
    (['convs_0', 'convs_1', 'convs_2'], (64, 5))
    >>> net.apply({"params": params}, jnp.zeros((10, 28, 28, 1))).shape
    (10, 5)
    """

    input_rank: ClassVar[int] = 3  # images [H, W, C]: build_model refuses other inputs
    num_outputs: int
    filters: int = Conv4Config.filters  # defaults: Conv4Config, their one home
    downsample: str = Conv4Config.downsample
    readout: str = Conv4Config.readout
    conv: str = Conv4Config.conv
    norm_scale: bool = Conv4Config.norm_scale

    def setup(self):
        stride = 2 if self.downsample == "stride" else 1
        init = nn.initializers.xavier_uniform()
        layer = PatchConv if resolve_conv(self.conv) == "im2col" else nn.Conv
        # im2col: a layer with fewer patch channels than filters (the first) is normalised
        # through its patches (PatchProduct), without writing its output before batch norm
        deferred = {"defer_narrow": True} if layer is PatchConv else {}
        self.convs = [
            layer(
                self.filters, (3, 3), strides=stride, padding="SAME", kernel_init=init, **deferred
            )
            for _ in range(4)
        ]
        self.norms = [BatchStatNorm(use_scale=self.norm_scale) for _ in range(4)]
        self.head = nn.Dense(self.num_outputs)

    def embed(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        """Features before the head, ``[batch, features]``, for NHWC inputs ``x``; batch norm
        over the examples ``mask`` marks (all when None)."""
        for conv, norm in zip(self.convs, self.norms, strict=True):
            x = nn.relu(norm(conv(x), mask))
            if self.downsample == "maxpool":
                x = nn.max_pool(x, (2, 2), strides=(2, 2), padding="VALID")
        if self.readout == "mean":
            return jnp.mean(x, axis=(1, 2))
        return x.reshape(x.shape[0], -1)

    def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        return self.head(self.embed(x, mask))


CONV4_PARTS = ModelParts(
    head="head", embed="embed", convolutional=True, norm_layers=(BatchStatNorm,)
)


@MODELS.register("conv4", Conv4Config, parts=CONV4_PARTS)
def conv4(num_outputs: int, config: Conv4Config | None = None) -> Conv4:
    """Conv4 with ``num_outputs`` logits; see the module docstring for the two variants.

    >>> conv4(5, Conv4Config(filters=32, downsample="maxpool", readout="flatten")).filters
    32
    >>> import jax, jax.numpy as jnp
    >>> offsets_only = conv4(5, Conv4Config(norm_scale=False))
    >>> params = offsets_only.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
    >>> sorted(params["params"]["norms_0"])
    ['bias']
    """
    c = config or Conv4Config()
    return Conv4(
        int(num_outputs), int(c.filters), c.downsample, c.readout, c.conv, bool(c.norm_scale)
    )
