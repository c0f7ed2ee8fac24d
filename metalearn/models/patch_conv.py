"""Convolution as one matrix product over image patches ("im2col"), for XLA:CPU.

Why: meta-learning batches tasks that each have their own (adapted) kernels. On XLA:CPU,

- under ``vmap`` JAX turns the per-task convolutions into one grouped convolution, which
  XLA:CPU expands (its kernel gradient becomes a 3-D convolution over a dilated task axis):
  ~6x slower forward and ~50x slower backward than separate convolutions;
- inside a loop (``lax.map`` over tasks, ``lax.scan`` over fused meta-steps) the input and
  kernel gradients that JAX's transpose rules emit keep non-canonical dimension orders, which
  XLA:CPU runs through a generic loop emitter, ~10-20x slower than its convolution kernels.

Written as nine strided slices of the padded input, concatenated on the channel axis and
multiplied by the kernel reshaped to ``[kh * kw * in, out]``, a convolution is a plain matrix
product inside a loop and a batched one under ``vmap``; its derivatives of every order, forward
mode included, are matrix products, pads and slices. Measured in experiments/benchmarks/.

:class:`PatchConv` is a drop-in for ``flax.linen.Conv`` with "SAME" or "VALID" padding (same
parameter names, shapes and initialisers, so parameters and checkpoints are interchangeable).
With ``defer_narrow=True`` it returns a convolution whose patches are narrower than its output
(a first layer: ``3 * 3 * 1`` taps against 64 filters) as a :class:`PatchProduct`, unevaluated,
for a batch-statistics normalisation to fold itself into (``conv4.BatchStatNorm``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

PADDINGS = ("SAME", "VALID")


def axis_padding(size: int, window: int, stride: int, padding: str) -> tuple[int, int, int]:
    """(low, high, output size) of one spatial axis, as ``lax.conv_general_dilated`` pads.

    >>> axis_padding(14, 3, 2, "SAME")
    (0, 1, 7)
    """
    if padding == "VALID":
        return 0, 0, (size - window) // stride + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + window - size, 0)
    return total // 2, total - total // 2, out


def image_patches(
    x: jax.Array, window: Sequence[int], strides: Sequence[int], padding: str = "SAME"
) -> jax.Array:
    """``[batch, out_h, out_w, kh * kw * channels]`` patches of NHWC ``x``, tap-major.

    Channel ``(i * kw + j) * channels + c`` of an output position holds input channel ``c``
    at kernel tap ``(i, j)``, matching an HWIO kernel reshaped to ``[kh * kw * in, out]``.

    >>> import jax.numpy as jnp
    >>> image_patches(jnp.zeros((2, 28, 28, 1)), (3, 3), (2, 2)).shape
    (2, 14, 14, 9)
    """
    if padding not in PADDINGS:
        raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
    n, h, w, c = x.shape
    (kh, kw), (sh, sw) = window, strides
    top, bottom, oh = axis_padding(h, kh, sh, padding)
    left, right, ow = axis_padding(w, kw, sw, padding)
    if oh < 1 or ow < 1:
        raise ValueError(f"window {tuple(window)} does not fit input {h}x{w} ({padding})")
    padded = jnp.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    taps = [
        lax.slice(
            padded,
            (0, i, j, 0),
            (n, i + sh * (oh - 1) + 1, j + sw * (ow - 1) + 1, c),
            (1, sh, sw, 1),
        )
        for i in range(kh)
        for j in range(kw)
    ]
    return taps[0] if len(taps) == 1 else jnp.concatenate(taps, axis=-1)


class PatchProduct(NamedTuple):
    """A convolution not yet evaluated: ``patches @ kernel + bias`` at every output position.

    Normalising a convolution's output with its batch statistics normally reads and writes the
    ``[batch, h, w, out]`` output several times (its mean, variance, the normalised values, and
    as many passes again in the backward pass). When the patches have fewer channels ``k`` than
    the output, those statistics follow from the patches' own mean and ``[k, k]`` covariance
    (the output's variance is ``diag(kernel^T cov kernel)``), and the normalised output is one
    matrix product of the centred patches with the kernel scaled per output channel:
    ``conv4.BatchStatNorm`` does that (the same values; on XLA:CPU it took a fifth off an
    Omniglot meta-step, experiments/benchmarks/README.md).

    >>> import jax, jax.numpy as jnp
    >>> x = jax.random.normal(jax.random.key(0), (2, 6, 6, 1))
    >>> conv = PatchConv(16, (3, 3), strides=2, defer_narrow=True)
    >>> product, params = conv.init_with_output(jax.random.key(1), x)
    >>> product.patches.shape, product.kernel.shape, product.shape
    ((2, 3, 3, 9), (9, 16), (2, 3, 3, 16))
    >>> bool(jnp.allclose(product.value(), PatchConv(16, (3, 3), strides=2).apply(params, x)))
    True
    """

    patches: jax.Array  # [batch, h, w, k], from image_patches
    kernel: jax.Array  # [k, out]
    bias: jax.Array | None  # [out], or None

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.patches.shape[:-1], self.kernel.shape[-1])

    def value(self) -> jax.Array:
        """The convolution's output ``[batch, h, w, out]``."""
        n, h, w, k = self.patches.shape
        # A two-dimensional product: its kernel gradient is then patches^T @ output gradient
        # as XLA:CPU's dot takes it. Written as an einsum over the four image axes, the gradient
        # came out as a dot over a transposed copy of the output gradient, written by a strided
        # loop (a third of a 20-way Omniglot step's op time was that copy for the first layer).
        y = jnp.dot(self.patches.reshape(n * h * w, k), self.kernel).reshape(self.shape)
        return y if self.bias is None else y + self.bias


def patch_product(
    x: jax.Array,
    kernel: jax.Array,
    strides: int | Sequence[int] = 1,
    padding: str = "SAME",
    bias: jax.Array | None = None,
) -> PatchProduct:
    """The convolution of NHWC ``x`` with HWIO ``kernel`` (and ``bias``), not yet evaluated."""
    if isinstance(strides, int):
        strides = (strides, strides)
    kh, kw, cin, cout = kernel.shape
    if x.shape[-1] != cin:
        raise ValueError(f"input has {x.shape[-1]} channels, the kernel expects {cin}")
    patches = image_patches(x, (kh, kw), strides, padding)
    return PatchProduct(patches, kernel.reshape(kh * kw * cin, cout), bias)


def im2col_conv(
    x: jax.Array,
    kernel: jax.Array,
    strides: int | Sequence[int] = 1,
    padding: str = "SAME",
) -> jax.Array:
    """``lax.conv_general_dilated(x, kernel, strides, padding)`` for NHWC ``x`` and HWIO
    ``kernel``, as one matrix product over :func:`image_patches`.

    >>> import jax, jax.numpy as jnp
    >>> x = jax.random.normal(jax.random.key(0), (2, 7, 7, 3))
    >>> k = jax.random.normal(jax.random.key(1), (3, 3, 3, 4))
    >>> ref = jax.lax.conv_general_dilated(x, k, (2, 2), "SAME",
    ...     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    >>> bool(jnp.allclose(im2col_conv(x, k, 2), ref, atol=1e-4))
    True
    """
    return patch_product(x, kernel, strides, padding).value()


class PatchConv(nn.Module):
    """``nn.Conv(features, kernel_size, strides, padding)`` computed by :func:`im2col_conv`.

    Same parameters (``kernel`` HWIO, ``bias``) and initialisers as ``nn.Conv``:

    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> x = jax.random.normal(jax.random.key(0), (2, 28, 28, 1))
    >>> params = nn.Conv(8, (3, 3), strides=2).init(jax.random.key(1), x)
    >>> y = PatchConv(8, (3, 3), strides=2).apply(params, x)
    >>> bool(jnp.allclose(y, nn.Conv(8, (3, 3), strides=2).apply(params, x), atol=1e-5))
    True
    """

    features: int
    kernel_size: tuple[int, int] = (3, 3)
    strides: int | tuple[int, int] = 1
    padding: str = "SAME"
    use_bias: bool = True
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()
    bias_init: nn.initializers.Initializer = nn.initializers.zeros_init()
    # True: when kh * kw * in <= features, return a PatchProduct (not evaluated) instead
    defer_narrow: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array | PatchProduct:
        shape = (*self.kernel_size, x.shape[-1], self.features)
        kernel = self.param("kernel", self.kernel_init, shape)
        bias = self.param("bias", self.bias_init, (self.features,)) if self.use_bias else None
        product = patch_product(x, kernel, self.strides, self.padding, bias)
        narrow = product.kernel.shape[0] <= self.features  # kh * kw * in patch channels
        return product if self.defer_narrow and narrow else product.value()
