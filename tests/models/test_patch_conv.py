"""PatchConv / im2col_conv against XLA's convolution: values and derivatives of every kind."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.models.patch_conv import PatchConv, im2col_conv, image_patches

DIMS = ("NHWC", "HWIO", "NHWC")


def reference(x, kernel, strides, padding):
    return jax.lax.conv_general_dilated(x, kernel, strides, padding, dimension_numbers=DIMS)


CASES = [
    # (spatial size, kernel, stride, padding): odd and even sizes, both paddings
    (8, 3, 2, "SAME"),
    (7, 3, 2, "SAME"),
    (28, 3, 2, "SAME"),
    (9, 3, 1, "SAME"),
    (9, 3, 1, "VALID"),
    (10, 3, 2, "VALID"),
    (6, 1, 1, "SAME"),
    (7, 5, 2, "SAME"),
]


@pytest.mark.parametrize("size,window,stride,padding", CASES)
def test_values_match_xla_convolution(size, window, stride, padding):
    x = jax.random.normal(jax.random.key(0), (3, size, size, 2))
    k = jax.random.normal(jax.random.key(1), (window, window, 2, 4))
    got = jax.jit(im2col_conv, static_argnums=(2, 3))(x, k, stride, padding)
    want = jax.jit(reference, static_argnums=(2, 3))(x, k, (stride, stride), padding)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("size,window,stride,padding", CASES[:5])
def test_second_derivatives_and_forward_mode_match(size, window, stride, padding):
    """Reverse-over-reverse (MAML), and jvp-of-grad (hvp, as iMAML's CG uses) through both
    arguments, in float64 against XLA's convolution."""
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(0), (3, size, size, 2), jnp.float64)
        k = jax.random.normal(jax.random.key(1), (window, window, 2, 4), jnp.float64)
        v = (jnp.cos(x), jnp.sin(k))

        @functools.partial(jax.jit, static_argnums=0)  # one compiled program, not op by op
        def make(conv, x, k, v):
            def loss(x, k):
                return jnp.sum(jnp.tanh(conv(x, k)) ** 2)

            grad = jax.grad(loss, (0, 1))

            def along_v(x, k):
                return sum(jnp.vdot(g, t) for g, t in zip(grad(x, k), v, strict=True))

            reverse = jax.grad(along_v, (0, 1))
            forward = jax.jvp(lambda x, k: grad(x, k), (x, k), v)[1]
            return grad(x, k), reverse(x, k), forward

        ours = make(lambda x, k: im2col_conv(x, k, stride, padding), x, k, v)
        theirs = make(lambda x, k: reference(x, k, (stride, stride), padding), x, k, v)
        for a, b in zip(*map(jax.tree_util.tree_leaves, (ours, theirs)), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)


def test_patches_are_tap_major_like_an_hwio_kernel():
    x = jnp.arange(16.0).reshape(1, 4, 4, 1)
    patches = image_patches(x, (3, 3), (1, 1), "VALID")
    assert patches.shape == (1, 2, 2, 9)
    np.testing.assert_array_equal(patches[0, 0, 0], [0, 1, 2, 4, 5, 6, 8, 9, 10])


def test_drop_in_for_flax_conv():
    x = jax.random.normal(jax.random.key(0), (2, 9, 9, 3))
    for kwargs in (dict(strides=2), dict(strides=1, padding="VALID"), dict(use_bias=False)):
        flax_conv = nn.Conv(5, (3, 3), **kwargs)
        params = jax.jit(flax_conv.init)(jax.random.key(1), x)
        ours = PatchConv(5, (3, 3), **kwargs)
        mine = jax.eval_shape(ours.init, jax.random.key(1), x)  # its structure only
        assert jax.tree_util.tree_structure(mine) == jax.tree_util.tree_structure(params)
        np.testing.assert_allclose(
            jax.jit(ours.apply)(params, x), jax.jit(flax_conv.apply)(params, x), atol=1e-5
        )


def test_bad_arguments_say_what_is_wrong():
    x = jnp.zeros((1, 4, 4, 2))
    with pytest.raises(ValueError, match="channels"):
        im2col_conv(x, jnp.zeros((3, 3, 3, 4)))
    with pytest.raises(ValueError, match="padding"):
        im2col_conv(x, jnp.zeros((3, 3, 2, 4)), padding="CIRCULAR")
    with pytest.raises(ValueError, match="does not fit"):
        im2col_conv(x, jnp.zeros((5, 5, 2, 4)), padding="VALID")
