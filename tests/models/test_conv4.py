"""Conv4: output shapes, parameter counts worked out by hand, batch-statistics normalisation."""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.data.task import supervised_objective
from metalearn.models.base import model_from_flax
from metalearn.models.conv4 import DOWNSAMPLING, BatchStatNorm, Conv4, Conv4Config, conv4
from metalearn.models.patch_conv import PatchConv, PatchProduct
from metalearn.registry import MODELS


def count(tree) -> int:
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(tree))


def block(cin: int, filters: int) -> int:
    """One block: 3x3 kernel, conv bias, batch-norm scale and bias."""
    return 3 * 3 * cin * filters + filters + 2 * filters


@pytest.mark.parametrize(
    "kwargs, input_shape, ways, features",
    [
        # Finn et al.'s Omniglot net: 28 -> 14 -> 7 -> 4 -> 2 by stride 2, mean over 2x2.
        (dict(filters=64, downsample="stride", readout="mean"), (28, 28, 1), 5, 64),
        (dict(filters=64, downsample="stride", readout="mean"), (28, 28, 1), 20, 64),
        (dict(filters=64, downsample="stride", readout="flatten"), (28, 28, 1), 5, 2 * 2 * 64),
        # Their miniImageNet net: 84 -> 42 -> 21 -> 10 -> 5 by 2x2 max-pool, flattened.
        (dict(filters=32, downsample="maxpool", readout="flatten"), (84, 84, 3), 5, 5 * 5 * 32),
        # CIFAR at 32x32: 32 -> 16 -> 8 -> 4 -> 2.
        (dict(filters=64, downsample="maxpool", readout="flatten"), (32, 32, 3), 5, 2 * 2 * 64),
    ],
)
def test_shapes_and_parameter_count(kwargs, input_shape, ways, features):
    net = conv4(ways, Conv4Config(**kwargs))
    # Shapes only: traced, not compiled.
    variables = jax.eval_shape(net.init, jax.random.key(0), jnp.zeros((1, *input_shape)))
    assert set(variables) == {"params"}  # nothing mutable: batch statistics are not stored
    params = variables["params"]
    f, cin = kwargs["filters"], input_shape[-1]
    expected = block(cin, f) + 3 * block(f, f) + features * ways + ways
    assert count(params) == expected
    assert sorted(params) == [*[f"convs_{i}" for i in range(4)], "head"] + [
        f"norms_{i}" for i in range(4)
    ]
    assert params["head"]["kernel"].shape == (features, ways)
    x = jax.ShapeDtypeStruct((7, *input_shape), jnp.float32)
    assert jax.eval_shape(net.apply, {"params": params}, x).shape == (7, ways)
    embedded = jax.eval_shape(functools.partial(net.apply, method="embed"), {"params": params}, x)
    assert embedded.shape == (7, features)


def test_omniglot_net_count_is_the_known_total():
    # 768 + 3 * 37,056 + 325, written out: the 5-way Omniglot Conv4 of MAML (with conv biases).
    params = Conv4(5).init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))["params"]
    assert count(params) == 112_261


def test_batch_norm_uses_the_current_batch_statistics():
    x = jax.random.normal(jax.random.key(0), (6, 5, 5, 3)) * 3.0 + 1.0
    norm = BatchStatNorm(epsilon=1e-3)
    params = norm.init(jax.random.key(1), x)["params"]
    params = {"scale": jnp.array([1.0, 2.0, 0.5]), "bias": jnp.array([0.0, -1.0, 3.0])}
    y = norm.apply({"params": params}, x)
    xn = np.asarray(x)
    mean, var = xn.mean((0, 1, 2)), xn.var((0, 1, 2))
    expected = (xn - mean) / np.sqrt(var + 1e-3) * np.array([1.0, 2.0, 0.5]) + [0.0, -1.0, 3.0]
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


def test_an_example_output_depends_on_the_rest_of_the_batch():
    net = Conv4(5)
    x = jax.random.uniform(jax.random.key(0), (4, 28, 28, 1))
    params = net.init(jax.random.key(1), x)["params"]
    out = net.apply({"params": params}, x)
    other = net.apply({"params": params}, x.at[1:].set(0.5 * x[1:]))
    assert not np.allclose(out[0], other[0])


def test_registered_and_wraps_as_a_pure_model_with_head_and_embed():
    assert MODELS.entry("conv4").factory is conv4
    parts = MODELS.entry("conv4").info["parts"]
    assert (parts.head, parts.embed, parts.convolutional) == ("head", "embed", True)
    model = model_from_flax(conv4(5), (28, 28, 1), parts)
    assert model.is_convolutional and model.head == ("head",)
    assert model.norm_paths == {f"norms_{i}/{p}" for i in range(4) for p in ("bias", "scale")}
    params, state = model.init(jax.random.key(0))
    assert state == {}  # batch statistics of the current batch: no running averages
    objective = supervised_objective(model, "classification")
    x = jax.random.uniform(jax.random.key(1), (5, 28, 28, 1))
    y = jnp.arange(5)
    grads = jax.jit(jax.grad(lambda p: objective.loss(p, state, None, (x, y))[0]))(params)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads))
    assert model.embed(params, state, None, x)[0].shape == (5, 64)
    # Jitted and eager agree (the module is a pure function of params).
    np.testing.assert_allclose(
        jax.jit(model.apply)(params, state, None, x)[0],
        model.apply(params, state, None, x)[0],
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(downsample="avgpool"), "model.downsample"),
        (dict(readout="max"), "model.readout"),
        (dict(filters=0), "model.filters"),
        (dict(conv="cudnn"), "model.conv"),
    ],
)
def test_invalid_settings_name_the_config_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        conv4(5, Conv4Config(**kwargs))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(downsample="avgpool"), "model.downsample must be one of ('stride', 'maxpool')"),
        (dict(readout="max"), "model.readout must be one of ('flatten', 'mean'), got 'max'"),
        (dict(filters=0), "model.filters must be >= 1, got 0"),
        (dict(conv="cudnn"), "model.conv must be one of ('auto', 'xla', 'im2col'), got 'cudnn'"),
    ],
)
def test_the_config_refuses_a_bad_value_when_it_is_made(kwargs, message):
    # metalearn.config.to_objects makes it: refused before a rerun's config is compared with its
    # run directory's (which advised trainer.allow_changes for the value first).
    with pytest.raises(ValueError) as err:
        Conv4Config(**kwargs)
    assert str(err.value).startswith(message), str(err.value)


@pytest.mark.parametrize("downsample", DOWNSAMPLING)
def test_im2col_and_xla_convolutions_compute_the_same_network(downsample):
    """Same parameter tree, same outputs, same meta-relevant gradients for either ``conv``."""
    x = jax.random.normal(jax.random.key(0), (6, 28, 28, 1))
    nets = {
        c: conv4(5, Conv4Config(filters=8, downsample=downsample, conv=c))
        for c in ("xla", "im2col")
    }
    params = nets["xla"].init(jax.random.key(1), x)["params"]
    other = nets["im2col"].init(jax.random.key(1), x)["params"]
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(other)
    for a, b in zip(*map(jax.tree_util.tree_leaves, (params, other)), strict=True):
        np.testing.assert_array_equal(a, b)  # same initialisers, same draws

    def loss(c, p):
        return jnp.mean(jnp.tanh(nets[c].apply({"params": p}, x)) ** 2)

    np.testing.assert_allclose(
        nets["im2col"].apply({"params": params}, x),
        nets["xla"].apply({"params": params}, x),
        atol=1e-4,
    )
    grads = {c: jax.jit(jax.grad(loss, 1), static_argnums=0)(c, params) for c in nets}
    for a, b in zip(*(jax.tree_util.tree_leaves(g) for g in grads.values()), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


def test_auto_convolution_is_im2col_on_cpu_and_xla_elsewhere(monkeypatch):
    from metalearn.models import conv4 as module

    assert module.resolve_conv("auto") == ("im2col" if jax.default_backend() == "cpu" else "xla")
    monkeypatch.setattr(module.jax, "default_backend", lambda: "gpu")
    assert module.resolve_conv("auto") == "xla"
    monkeypatch.setattr(module.jax, "default_backend", lambda: "cpu")
    assert module.resolve_conv("auto") == "im2col"


def test_batch_norm_without_scale_has_offsets_only():
    # Finn et al.'s batch norm (tf.contrib.layers.batch_norm defaults): center=True, scale=False.
    net = conv4(5, Conv4Config(norm_scale=False))
    params = net.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))["params"]
    for i in range(4):
        assert sorted(params[f"norms_{i}"]) == ["bias"]
    assert count(params) == 112_261 - 4 * 64  # the known total less the four scale vectors
    # The wrapped model declares exactly the offsets as its normalisation parameters.
    model = model_from_flax(net, (28, 28, 1), MODELS.entry("conv4").info["parts"])
    assert model.norm_paths == {f"norms_{i}/bias" for i in range(4)}
    x = jax.random.normal(jax.random.key(1), (6, 3, 3, 4)) * 3.0 + 1.0
    bias = jnp.arange(4.0)
    y = BatchStatNorm(use_scale=False).apply({"params": {"bias": bias}}, x)
    mean, var = x.mean((0, 1, 2)), x.var((0, 1, 2))
    np.testing.assert_allclose(y, (x - mean) / jnp.sqrt(var + 1e-3) + bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use_scale", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_batch_norm_of_a_deferred_convolution_equals_the_norm_of_its_output(use_scale, masked):
    """A narrow first layer reaches the norm as a PatchProduct and is normalised through its
    patches' covariance: same values and derivatives (first, second, forward-over-reverse) as
    normalising the evaluated output, in float64; masked-out examples change nothing."""
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(0), (6, 9, 9, 2), jnp.float64) + 3.0
        conv = PatchConv(24, (3, 3), strides=2, defer_narrow=True)
        conv_params = float64(conv.init(jax.random.key(1), x))
        product = conv.apply(conv_params, x)
        assert isinstance(product, PatchProduct)  # 3 * 3 * 2 = 18 taps <= 24 filters
        norm = BatchStatNorm(use_scale=use_scale)
        norm_params = norm.init(jax.random.key(2), product.value())
        norm_params = jax.tree.map(lambda a: a + 0.3, float64(norm_params))
        mask = jnp.array([True, False, True, True, False, True]) if masked else None

        def out(kernel, bias, deferred):
            p = PatchProduct(product.patches, kernel, bias)
            return norm.apply(norm_params, p if deferred else p.value(), mask)

        def loss(kernel, bias, deferred):
            y = out(kernel, bias, deferred)
            return jnp.sum(jnp.tanh(y) * jnp.arange(y.size).reshape(y.shape) / y.size)

        def hvp(kernel, bias, v, deferred):
            return jax.jvp(lambda k_: jax.grad(loss)(k_, bias, deferred), (kernel,), (v,))[1]

        k, b = product.kernel, product.bias + 0.5
        np.testing.assert_allclose(out(k, b, True), out(k, b, False), rtol=1e-10, atol=1e-10)
        g = {d: jax.grad(loss, (0, 1))(k, b, d) for d in (True, False)}
        np.testing.assert_allclose(g[True][0], g[False][0], rtol=1e-9, atol=1e-11)
        np.testing.assert_allclose(g[True][1], 0.0)  # the conv bias cancels in the norm
        np.testing.assert_allclose(g[False][1], 0.0, atol=1e-12)
        v = jax.random.normal(jax.random.key(3), k.shape, jnp.float64)
        np.testing.assert_allclose(hvp(k, b, v, True), hvp(k, b, v, False), rtol=1e-8, atol=1e-10)
        if masked:  # what the masked-out examples hold does not matter
            garbage = product.patches.at[~mask].set(1e3)
            again = norm.apply(norm_params, PatchProduct(garbage, k, b), mask)
            np.testing.assert_allclose(again[mask], out(k, b, True)[mask], rtol=1e-10)


def float64(tree):
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), tree)


def first_layer_deferred(net, params, x) -> list[bool]:
    """For each BatchStatNorm call of ``net``, whether it was handed a PatchProduct."""
    seen = []

    def record(next_fun, args, kwargs, context):
        if isinstance(context.module, BatchStatNorm):
            seen.append(isinstance(args[0], PatchProduct))
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        net.apply({"params": params}, x)
    return seen


def maml_meta_loss(net, params, x, y, inner_lr=0.4):
    """One second-order MAML step: adapt on the first 5 examples, loss on the rest."""

    def ce(p, images, labels):
        logits = net.apply({"params": p}, images)
        return -jnp.mean(jnp.sum(labels * jax.nn.log_softmax(logits), -1))

    g = jax.grad(ce)(params, x[:5], y[:5])
    return ce(jax.tree.map(lambda a, d: a - inner_lr * d, params, g), x[5:], y[5:])


@pytest.mark.parametrize(
    "config, shape",
    [  # Omniglot's first layer: 9 taps < 64 filters; miniImageNet's: 27 < 32
        (Conv4Config(filters=64), (28, 28, 1)),
        (Conv4Config(filters=32, downsample="maxpool", readout="flatten"), (32, 32, 3)),
    ],
)
def test_im2col_conv4_normalises_its_first_layer_through_the_patches(config, shape):
    """The im2col net hands its first norm a PatchProduct; its outputs and second-order MAML
    meta-gradient equal the XLA-convolution net's (float64)."""
    with jax.enable_x64(True):
        x = jax.random.uniform(jax.random.key(0), (10, *shape), jnp.float64)
        y = jax.nn.one_hot(jnp.arange(10) % 5, 5)
        nets = {c: conv4(5, dataclasses.replace(config, conv=c)) for c in ("xla", "im2col")}
        params = float64(nets["xla"].init(jax.random.key(1), x)["params"])
        assert first_layer_deferred(nets["im2col"], params, x) == [True, False, False, False]
        assert first_layer_deferred(nets["xla"], params, x) == [False] * 4
        meta_gradient = jax.jit(jax.grad(maml_meta_loss, 1), static_argnums=0)
        grads = {c: meta_gradient(n, params, x, y) for c, n in nets.items()}
        for path, a in jax.tree_util.tree_leaves_with_path(grads["im2col"]):
            b = functools.reduce(lambda t, k: t[k.key], path, grads["xla"])
            np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9, err_msg=str(path))
