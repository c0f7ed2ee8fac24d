"""scripts/bench_conv.py's custom-VJP convolution agrees with lax.conv, to second order."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

pytest.importorskip("flax")


@pytest.fixture
def conv(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    import bench_conv

    return bench_conv


@pytest.mark.parametrize("name,size", [("canonical", 7), ("canonical", 8)])
def test_matches_lax_conv_to_second_order(conv, name, size):
    x = jax.random.normal(jax.random.key(0), (3, size, size, 2))
    k = jax.random.normal(jax.random.key(1), (3, 3, 2, 4))
    pads = tuple(conv.same_padding(size, 3, 2) for _ in range(2))
    impl = {
        "canonical": lambda x, k: conv.canonical_conv(x, k, (2, 2), pads),
    }[name]

    def reference(x, k):
        return conv.xla_conv(x, k, 2)

    assert jnp.allclose(jax.jit(impl)(x, k), jax.jit(reference)(x, k), atol=1e-4)

    def hvp(f, x, k):  # second derivatives through both arguments, as MAML needs
        def inner(x, k):
            gx, gk = jax.grad(lambda x, k: jnp.sum(jnp.tanh(f(x, k))), (0, 1))(x, k)
            return jnp.vdot(gx, x) + jnp.vdot(gk, k)

        return jax.grad(inner, (0, 1))(x, k)

    hvps = jax.jit(lambda x, k: (hvp(impl, x, k), hvp(reference, x, k)))
    for got, want in zip(*hvps(x, k), strict=True):
        assert jnp.allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_conv4_variants_have_the_library_parameters(conv):
    from metalearn.models.conv4 import Conv4

    x = jnp.zeros((2, 28, 28, 1))
    ref = Conv4(5).init(jax.random.key(0), x)["params"]
    for name in conv.CONV_LAYERS:
        params = conv.conv4_with(name, 5).init(jax.random.key(0), x)["params"]
        assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(ref)
        out = conv.conv4_with(name, 5).apply({"params": ref}, jnp.ones((2, 28, 28, 1)))
        assert jnp.allclose(
            out, Conv4(5).apply({"params": ref}, jnp.ones((2, 28, 28, 1))), atol=1e-4
        )
