"""Conv4: output shapes, parameter counts worked out by hand, batch-statistics normalisation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.data.task import supervised_objective
from metalearn.models.base import model_from_flax
from metalearn.models.conv4 import DOWNSAMPLING, BatchStatNorm, Conv4, Conv4Config, conv4
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
    variables = net.init(jax.random.key(0), jnp.zeros((1, *input_shape)))
    assert set(variables) == {"params"}  # nothing mutable: batch statistics are not stored
    params = variables["params"]
    f, cin = kwargs["filters"], input_shape[-1]
    expected = block(cin, f) + 3 * block(f, f) + features * ways + ways
    assert count(params) == expected
    assert sorted(params) == [*[f"convs_{i}" for i in range(4)], "head"] + [
        f"norms_{i}" for i in range(4)
    ]
    assert params["head"]["kernel"].shape == (features, ways)
    x = jax.random.uniform(jax.random.key(1), (7, *input_shape))
    assert net.apply({"params": params}, x).shape == (7, ways)
    assert net.apply({"params": params}, x, method="embed").shape == (7, features)


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
    grads = jax.grad(lambda p: objective.loss(p, state, None, (x, y))[0])(params)
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
    grads = {c: jax.grad(loss, 1)(c, params) for c in nets}
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
