"""Convolutions that stay fast on XLA:CPU when tasks are batched: the item-2 experiments.

Why ``vmap`` and ``lax.map`` over tasks are slow on XLA:CPU (see experiments/benchmarks/):

- Under ``vmap`` every task has its own (adapted) kernel, so JAX's batching rule for
  ``conv_general_dilated`` turns the per-task convolutions into one grouped convolution
  (``feature_group_count = tasks``) and its kernel gradient into one with
  ``batch_group_count = tasks``. XLA:CPU has no grouped-convolution kernel: it expands the
  groups (the kernel gradient becomes a 3-D convolution with a dilated ``tasks`` axis), which
  is ~6x slower in the forward pass and ~50x in the backward pass than separate convolutions.
- Under ``lax.map`` (a while loop) the forward convolution is fine, but the two backward
  convolutions keep non-canonical dimension orders (``f01b_i01o->01bf`` and
  ``b01f_01oi->b01f``) inside the loop body, so XLA:CPU emits them with its generic loop
  emitter instead of its Eigen convolution (outside loops they are rewritten to the canonical
  ``b01f_01io->b01f``): ~10x slower.

The library's answer is :mod:`metalearn.models.patch_conv` (``model.conv: im2col``, the CPU
default): the convolution as a matrix product over image patches, whose derivatives of every
order are matrix products, pads and slices. This script keeps the other formulation measured,
:func:`canonical_conv` / :class:`CanonicalConv` (a ``jax.custom_vjp`` whose derivatives are
canonical convolutions; reverse mode only), and the per-layer micro-benchmark of all three.

    python scripts/bench_conv.py            # per-layer micro-benchmark of the formulations
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from metalearn.models.patch_conv import PatchConv, axis_padding, im2col_conv


def same_padding(size: int, window: int, stride: int) -> tuple[int, int]:
    """TensorFlow/XLA "SAME" padding (low, high) for one spatial axis."""
    low, high, _ = axis_padding(size, window, stride, "SAME")
    return low, high


DIMS = ("NHWC", "HWIO", "NHWC")


def _dilate(size: int, dilation: int) -> int:
    return 0 if size == 0 else 1 + dilation * (size - 1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def canonical_conv(x, kernel, strides, padding, lhs_dilation=(1, 1), rhs_dilation=(1, 1)):
    """``lax.conv_general_dilated`` on NHWC/HWIO whose derivatives, of every order, are again
    NHWC/HWIO convolutions (with explicit transposes), never other dimension orders.

    JAX's own transpose rules express the input and kernel gradients as convolutions with
    permuted dimension numbers (e.g. ``f01b_i01o->01bf``). XLA:CPU rewrites those to its Eigen
    layout in straight-line code but not inside loop bodies (``lax.map``, ``lax.scan``), where
    they fall back to a generic loop emitter ~10x slower. Same rules, canonical layout.
    ``padding`` is a tuple of (low, high) pairs of ints.

    >>> import jax, jax.numpy as jnp
    >>> x = jax.random.normal(jax.random.key(0), (2, 7, 7, 3))
    >>> k = jax.random.normal(jax.random.key(1), (3, 3, 3, 4))
    >>> f = lambda x, k: jnp.sum(canonical_conv(x, k, (2, 2), ((1, 1), (1, 1))) ** 2)
    >>> g = lambda x, k: jnp.sum(jax.lax.conv_general_dilated(x, k, (2, 2), ((1, 1), (1, 1)),
    ...     dimension_numbers=DIMS) ** 2)
    >>> hvp = lambda f: jax.grad(lambda k: jnp.vdot(jax.grad(f, 1)(x, k), k))(k)
    >>> bool(jnp.allclose(hvp(f), hvp(g), rtol=1e-4, atol=1e-3))
    True
    """
    return lax.conv_general_dilated(
        x, kernel, strides, padding, lhs_dilation, rhs_dilation, dimension_numbers=DIMS
    )


def _canonical_conv_fwd(x, kernel, strides, padding, lhs_dilation, rhs_dilation):
    out = canonical_conv(x, kernel, strides, padding, lhs_dilation, rhs_dilation)
    return out, (x, kernel)


def _canonical_conv_bwd(strides, padding, lhs_dilation, rhs_dilation, residuals, g):
    x, kernel = residuals
    lhs = [_dilate(s, d) for s, d in zip(x.shape[1:3], lhs_dilation, strict=True)]
    rhs = [_dilate(s, d) for s, d in zip(kernel.shape[:2], rhs_dilation, strict=True)]
    out = [_dilate(s, d) for s, d in zip(g.shape[1:3], strides, strict=True)]
    lows = [lo for lo, _ in padding]
    # input gradient: g convolved with the flipped kernel, in and out channels swapped
    before = [r - lo - 1 for r, lo in zip(rhs, lows, strict=True)]
    after = [a + r - 1 - o - b for a, r, o, b in zip(lhs, rhs, out, before, strict=True)]
    flipped = jnp.flip(kernel, (0, 1)).transpose(0, 1, 3, 2)
    dx = canonical_conv(
        g,
        flipped,
        tuple(lhs_dilation),
        tuple(zip(before, after, strict=True)),
        tuple(strides),
        tuple(rhs_dilation),
    )
    return dx, _kernel_grad(x, g, kernel.shape, strides, padding, lhs_dilation, rhs_dilation)


def _kernel_grad(x, g, kernel_shape, strides, padding, lhs_dilation, rhs_dilation):
    """The kernel gradient as one matrix product per kernel tap (``kh * kw`` of them).

    As a convolution it has a tiny output and a huge window, and XLA's algebraic simplifier
    swaps its operands into a non-canonical convolution; as products over strided slices of
    the (padded, dilated) input it is a few well-shaped GEMMs, and so are its derivatives.
    """
    kh, kw = kernel_shape[:2]
    (top, bottom), (left, right) = padding
    zero = jnp.zeros((), x.dtype)
    config = [
        (0, 0, 0),
        (top, bottom, lhs_dilation[0] - 1),
        (left, right, lhs_dilation[1] - 1),
        (0, 0, 0),
    ]
    xp = lax.pad(x, zero, config)
    n, oh, ow, _ = g.shape
    taps = []
    for i in range(kh):
        for j in range(kw):
            r, c = i * rhs_dilation[0], j * rhs_dilation[1]
            window = lax.slice(
                xp,
                (0, r, c, 0),
                (n, r + strides[0] * (oh - 1) + 1, c + strides[1] * (ow - 1) + 1, x.shape[3]),
                (1, strides[0], strides[1], 1),
            )
            taps.append(jnp.einsum("nhwc,nhwf->cf", window, g))
    return jnp.stack(taps).reshape(kernel_shape)


canonical_conv.defvjp(_canonical_conv_fwd, _canonical_conv_bwd)


class CanonicalConv(nn.Module):
    """``nn.Conv(features, (3, 3), strides, padding="SAME")`` computed by
    :func:`canonical_conv`. Same parameters and initialisers as ``nn.Conv``."""

    features: int
    kernel_size: tuple[int, int] = (3, 3)
    strides: int = 1
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param(
            "kernel", self.kernel_init, (*self.kernel_size, x.shape[-1], self.features)
        )
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        padding = tuple(
            same_padding(size, window, self.strides)
            for size, window in zip(x.shape[1:3], self.kernel_size, strict=True)
        )
        strides = (self.strides, self.strides)
        return canonical_conv(x, kernel, strides, padding) + bias


CONV_LAYERS = {"im2col": PatchConv, "canonical": CanonicalConv}


def conv4_with(conv: str, num_outputs: int, filters: int = 64):
    """metalearn's Conv4 (stride variant, mean readout) with ``conv`` layers: ``im2col``
    (the library's :class:`PatchConv`) or ``canonical`` (:class:`CanonicalConv`)."""
    from metalearn.models.conv4 import BatchStatNorm, Conv4

    layer = CONV_LAYERS[conv]

    class VariantConv4(Conv4):
        def setup(self):
            init = nn.initializers.xavier_uniform()
            self.convs = [
                layer(self.filters, (3, 3), strides=2, kernel_init=init) for _ in range(4)
            ]
            self.norms = [BatchStatNorm() for _ in range(4)]
            self.head = nn.Dense(self.num_outputs)

    return VariantConv4(num_outputs, filters, "stride", "mean")


# --- micro-benchmark: one Conv4 layer (14x14x64 -> 7x7x64, stride 2) for a batch of tasks ---


def xla_conv(x, kernel, stride=2):
    return lax.conv_general_dilated(
        x, kernel, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def over_tasks(conv, strategy):
    if strategy == "vmap":
        return jax.vmap(conv)
    if strategy == "map":
        return lambda x, k: lax.map(lambda a: conv(*a), (x, k))
    return lambda x, k: jnp.stack([conv(x[i], k[i]) for i in range(x.shape[0])])


def time_ms(fn, *args, repeats=5) -> tuple[float, float]:
    """(compile seconds, median milliseconds) of ``jax.jit(fn)(*args)``."""
    jitted = jax.jit(fn)
    start = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return compile_s, 1e3 * statistics.median(times)


def micro(tasks: int, images: int, strategies, convs, repeats: int) -> None:
    x = jax.random.normal(jax.random.key(0), (tasks, images, 14, 14, 64))
    k = jax.random.normal(jax.random.key(1), (tasks, 3, 3, 64, 64)) * 0.05
    impls = {
        "xla": xla_conv,
        "im2col": lambda x, k: im2col_conv(x, k, 2),
        "canonical": lambda x, k: canonical_conv(x, k, (2, 2), ((0, 1), (0, 1))),
    }
    print(f"one Conv4 layer, {tasks} tasks x {images} images, 14x14x64 -> 7x7x64")
    print(f"{'conv':<7} {'batching':<7} {'fwd ms':>9} {'fwd+bwd ms':>11} {'compile s':>9}")
    for name in convs:
        for strategy in strategies:
            f = over_tasks(impls[name], strategy)
            _, fwd = time_ms(f, x, k, repeats=repeats)
            grad = jax.grad(lambda x, k, f=f: jnp.sum(f(x, k) ** 2), argnums=(0, 1))
            compile_s, both = time_ms(grad, x, k, repeats=repeats)
            print(f"{name:<7} {strategy:<7} {fwd:9.1f} {both:11.1f} {compile_s:9.2f}", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Conv4-layer formulations under task batching")
    p.add_argument("--tasks", type=int, default=32)
    p.add_argument("--images", type=int, default=75, help="images per task (5-way x 15 queries)")
    p.add_argument("--batching", default="unroll,map,vmap")
    p.add_argument("--conv", default="xla,im2col,canonical")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    micro(args.tasks, args.images, args.batching.split(","), args.conv.split(","), args.repeats)


if __name__ == "__main__":
    main()
