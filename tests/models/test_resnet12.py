"""ResNet-12: parameter count by formula, eval mode against a NumPy forward pass with the stored
running statistics, running-statistics updates, dropout keys, jit, first and second derivatives."""

from __future__ import annotations

import functools
import sys
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from metalearn.config import to_objects
from metalearn.models.base import model_from_flax
from metalearn.models.resnet12 import NORM_NAMES, RESNET12_PARTS, ResNet12, ResNet12Config
from metalearn.models.resnet12 import resnet12 as build_resnet12
from metalearn.registry import MODELS
from tests.cli import finished
from tests.conftest import compose_config

TINY = (2, 3, 4, 5)  # widths of a tiny net: 16x16 inputs give maps 8, 4, 2, 1
SMALL = (8, 8, 16, 16)


def resnet12(num_outputs: int, **settings) -> ResNet12:
    return build_resnet12(num_outputs, ResNet12Config(**settings))


def count(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))


def block_count(cin: int, c: int) -> int:
    """Three bias-free 3x3 convs, a bias-free 1x1 shortcut conv, four batch norms (scale, bias)."""
    return 9 * cin * c + 2 * 9 * c * c + cin * c + 4 * 2 * c


# Everything runs jitted: one compilation per network instead of one per operation.


def init(net: ResNet12, size: int, key: int = 0) -> dict:
    return jax.jit(net.init)(jax.random.key(key), jnp.zeros((1, size, size, 3)))


@functools.cache
def compiled(net: ResNet12, method: str = "__call__", train: bool = False):
    def run(variables, x, key):
        if not train:
            return net.apply(variables, x, method=method)
        rngs = {"dropout": key} if key is not None else {}
        return net.apply(variables, x, train=True, mutable=["batch_stats"], rngs=rngs)

    return jax.jit(run)


def evaluate(net, variables, x, method="__call__"):
    return compiled(net, method)(variables, x, None)


def train_call(net, variables, x, key=0):
    """``(logits, {"batch_stats": ...})`` in training mode; ``key=None``: no dropout rng."""
    key = None if key is None else jax.random.key(key)
    return compiled(net, train=True)(variables, x, key)


# --- an independent NumPy forward pass in evaluation mode (float64) -------------------------


def np_conv(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    kh, kw, _, cout = kernel.shape
    p = kh // 2
    padded = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
    n, h, w, _ = x.shape
    out = np.zeros((n, h, w, cout))
    for i in range(kh):
        for j in range(kw):
            out += padded[:, i : i + h, j : j + w, :] @ kernel[i, j]
    return out


def np_forward(variables: dict, x: np.ndarray) -> np.ndarray:
    params = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"])
    stats = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["batch_stats"])

    def bn(name, h):
        s, p = stats[name], params[name]
        return (h - s["mean"]) / np.sqrt(s["var"] + 1e-5) * p["scale"] + p["bias"]

    def leaky(h):
        return np.where(h > 0, h, 0.1 * h)

    x = np.asarray(x, np.float64)
    for k in range(1, 5):
        b = f"block{k}_"
        h = leaky(bn(b + "norm1", np_conv(x, params[b + "conv1"]["kernel"])))
        h = leaky(bn(b + "norm2", np_conv(h, params[b + "conv2"]["kernel"])))
        h = bn(b + "norm3", np_conv(h, params[b + "conv3"]["kernel"]))
        h = leaky(h + bn(b + "shortcut_norm", np_conv(x, params[b + "shortcut_conv"]["kernel"])))
        n, hh, ww, c = h.shape
        x = h[:, : hh // 2 * 2, : ww // 2 * 2].reshape(n, hh // 2, 2, ww // 2, 2, c).max((2, 4))
    features = x.mean(axis=(1, 2))
    return features @ params["head"]["kernel"] + params["head"]["bias"]


# --- structure ----------------------------------------------------------------------------


@pytest.mark.parametrize("readout, features", [("mean", 16), ("flatten", 2 * 2 * 16)])
def test_shapes_and_top_level_entries(readout, features):
    net = resnet12(5, filters=SMALL, readout=readout)
    variables = init(net, 32)
    params = variables["params"]
    convs = [f"block{k}_{c}" for k in range(1, 5) for c in ("conv1", "conv2", "conv3")]
    convs += [f"block{k}_shortcut_conv" for k in range(1, 5)]
    assert set(params) == {*convs, *NORM_NAMES, "head"}
    assert set(variables["batch_stats"]) == set(NORM_NAMES)
    assert all(set(params[c]) == {"kernel"} for c in convs)  # no conv biases
    assert params["block2_conv1"]["kernel"].shape == (3, 3, 8, 8)
    assert params["block4_shortcut_conv"]["kernel"].shape == (1, 1, 16, 16)
    x = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))
    assert evaluate(net, variables, x).shape == (2, 5)
    assert evaluate(net, variables, x, "embed").shape == (2, features)
    assert params["head"]["kernel"].shape == (features, 5)


def test_the_declared_parts_find_the_norms_by_type():
    model = model_from_flax(resnet12(5, filters=TINY), (16, 16, 3), RESNET12_PARTS)
    assert model.norm_paths == {f"{n}/{p}" for n in NORM_NAMES for p in ("scale", "bias")}
    assert model.head == ("head",) and model.embed is not None and model.is_convolutional


def test_parameter_count_is_metaoptnets():
    net = resnet12(5)
    shapes = jax.eval_shape(lambda: init(net, 84))
    backbone = sum(block_count(a, b) for a, b in [(3, 64), (64, 160), (160, 320), (320, 640)])
    assert backbone == 12_424_320  # MetaOptNet's ResNet-12: "12.4M parameters"
    assert count(shapes["params"]) == backbone + 640 * 5 + 5
    flat = jax.eval_shape(lambda: init(resnet12(5, readout="flatten"), 84))
    assert count(flat["params"]) == backbone + 5 * 5 * 640 * 5 + 5


# --- batch norm: running statistics -------------------------------------------------------


def test_a_train_call_updates_the_running_statistics_with_momentum_0_1():
    net = resnet12(5, filters=TINY, drop_rate=0.0)
    variables = init(net, 16)
    x = jax.random.normal(jax.random.key(1), (6, 16, 16, 3)) * 2.0 + 1.0
    _, state = train_call(net, variables, x, key=None)
    conv1 = np_conv(
        np.asarray(x, np.float64), np.asarray(variables["params"]["block1_conv1"]["kernel"])
    )
    stats = state["batch_stats"]["block1_norm1"]
    np.testing.assert_allclose(stats["mean"], 0.1 * conv1.mean((0, 1, 2)), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(stats["var"], 0.9 + 0.1 * conv1.var((0, 1, 2)), rtol=1e-4)
    for name in NORM_NAMES:
        before, after = variables["batch_stats"][name], state["batch_stats"][name]
        assert not np.allclose(before["mean"], after["mean"]), name


def test_eval_mode_uses_the_stored_running_statistics():
    net = resnet12(5, filters=TINY)
    variables = init(net, 16)
    # Non-trivial scales and biases, and running statistics from two training calls.
    keys = iter(jax.random.split(jax.random.key(3), 64))
    params = {
        name: {k: v + 0.3 * jax.random.normal(next(keys), v.shape) for k, v in entry.items()}
        for name, entry in variables["params"].items()
    }
    variables = {**variables, "params": params}
    for step in range(2):
        x = jax.random.normal(jax.random.key(10 + step), (8, 16, 16, 3)) + step
        _, state = train_call(net, variables, x, key=step)
        variables = {**variables, **state}
    x = jax.random.normal(jax.random.key(20), (4, 16, 16, 3))
    out = evaluate(net, variables, x)
    np.testing.assert_allclose(out, np_forward(variables, x), rtol=1e-4, atol=1e-4)
    fresh = {**variables, "batch_stats": init(net, 16)["batch_stats"]}
    assert not np.allclose(out, evaluate(net, fresh, x), atol=1e-3)  # the statistics matter
    one_example = evaluate(net, variables, x[:1])  # no dependence on the rest of the batch
    np.testing.assert_allclose(one_example, out[:1], rtol=1e-5, atol=1e-5)


# --- randomness ---------------------------------------------------------------------------


def test_eval_is_deterministic_and_train_depends_on_the_dropout_key():
    net = resnet12(5, filters=SMALL, dropblock_size=2)
    variables = init(net, 32)
    x = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
    # evaluation drops nothing: the NumPy forward pass (no dropout at all) gives the same logits
    np.testing.assert_allclose(
        evaluate(net, variables, x), np_forward(variables, x), rtol=1e-4, atol=1e-4
    )
    out0, _ = train_call(net, variables, x, key=0)
    again, _ = train_call(net, variables, x, key=0)
    out1, _ = train_call(net, variables, x, key=1)
    np.testing.assert_array_equal(out0, again)
    assert not np.allclose(out0, out1)
    quiet = resnet12(5, filters=SMALL, drop_rate=0.0)
    plain, _ = train_call(quiet, variables, x, key=None)  # no rng needed without dropout
    assert not np.allclose(plain, out0)


def test_dropblock_ramp_counts_training_calls():
    ramped = resnet12(5, filters=SMALL, dropblock_size=2, dropblock_ramp=1)
    variables = init(ramped, 32)
    assert float(variables["batch_stats"]["dropblock_calls"]) == 0.0
    x = jax.random.normal(jax.random.key(1), (16, 32, 32, 3))
    out, state = train_call(ramped, variables, x, key=4)
    assert float(state["batch_stats"]["dropblock_calls"]) == 1.0
    _, evaluated = jax.jit(partial(ramped.apply, mutable=["batch_stats"]))(
        {**variables, **state}, x
    )
    assert float(evaluated["batch_stats"]["dropblock_calls"]) == 1.0  # eval does not count
    # A ramp of one call reaches the full rate at once: the constant-rate net, bit for bit.
    constant = resnet12(5, filters=SMALL, dropblock_size=2)
    plain = {"params": variables["params"], "batch_stats": init(constant, 32)["batch_stats"]}
    np.testing.assert_array_equal(out, train_call(constant, plain, x, key=4)[0])
    # A long ramp starts near zero: DropBlock drops (almost) nothing on the first call.
    slow = resnet12(5, filters=SMALL, dropblock_size=2, dropblock_ramp=10**9)
    assert not np.allclose(train_call(slow, variables, x, key=4)[0], out)


# --- transformations ----------------------------------------------------------------------


def episode_loss(net, params, stats, x, y, key):
    logits, state = net.apply(
        {"params": params, "batch_stats": stats},
        x,
        train=True,
        mutable=["batch_stats"],
        rngs={"dropout": key},
    )
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), state


def test_jit_matches_and_gradients_reach_every_parameter():
    net = resnet12(5, filters=SMALL, dropblock_size=2)
    variables = init(net, 32)
    x = jax.random.normal(jax.random.key(1), (10, 32, 32, 3))
    y = jnp.arange(10) % 5
    key = jax.random.key(2)
    loss = jax.jit(lambda p: episode_loss(net, p, variables["batch_stats"], x, y, key)[0])
    grads = jax.jit(jax.grad(loss))(variables["params"])
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        assert np.all(np.isfinite(g)) and np.any(g != 0), jax.tree_util.keystr(path)


def test_jit_and_eager_agree():
    net = resnet12(5, filters=TINY)
    variables = init(net, 16)
    x = jax.random.normal(jax.random.key(1), (3, 16, 16, 3))
    np.testing.assert_allclose(
        evaluate(net, variables, x), net.apply(variables, x), rtol=1e-5, atol=1e-5
    )


def test_second_order_meta_gradient_matches_finite_differences():
    """MAML differentiates through an SGD step; check grad-of-grad against central differences."""
    net = resnet12(3, filters=TINY, dropblock_size=2)
    with jax.enable_x64(True):
        variables = jax.tree.map(lambda a: a.astype(jnp.float64), init(net, 16))
        stats = variables["batch_stats"]
        keys = jax.random.split(jax.random.key(5), 4)
        xs = jax.random.normal(keys[0], (3, 16, 16, 3), jnp.float64)
        xq = jax.random.normal(keys[1], (6, 16, 16, 3), jnp.float64)
        ys, yq = jnp.arange(3), jnp.arange(6) % 3

        def meta_loss(params, first_order=False):
            def support(p):
                return episode_loss(net, p, stats, xs, ys, keys[2])[0]

            grads = jax.grad(support)(params)
            if first_order:
                grads = jax.lax.stop_gradient(grads)
            adapted = jax.tree.map(lambda p, g: p - 0.5 * g, params, grads)
            return episode_loss(net, adapted, stats, xq, yq, keys[3])[0]

        # One compiled program for all of it (separate ones compile for much longer).
        @jax.jit
        def derivatives(params):
            meta_grad = jax.grad(meta_loss)(params)
            v = jax.tree.map(lambda a: jnp.cos(jnp.arange(a.size).reshape(a.shape) * 1.7), params)
            eps = 1e-5
            plus, minus = (
                jax.tree.map(lambda p, d, s=s: p + s * eps * d, params, v) for s in (1, -1)
            )
            numeric = (meta_loss(plus) - meta_loss(minus)) / (2 * eps)
            first = jax.grad(partial(meta_loss, first_order=True))(params)
            gap = optax.tree_utils.tree_max(
                jax.tree.map(lambda a, b: jnp.abs(a - b), meta_grad, first)
            )
            return meta_grad, optax.tree_utils.tree_vdot(meta_grad, v), numeric, gap

        meta_grad, directional, numeric, gap = derivatives(variables["params"])
        assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(meta_grad))
        np.testing.assert_allclose(directional, numeric, rtol=1e-5)
        assert gap > 1e-6  # the second-order terms are really there


# --- configuration ------------------------------------------------------------------------


def test_model_resnet12_composes_and_builds():
    cfg = to_objects(compose_config(["data=miniimagenet", "model=resnet12"]))
    assert cfg.model.filters == (64, 160, 320, 640)  # typed tuple: not the list OmegaConf made
    net = MODELS.build(cfg.model, 5)
    assert isinstance(net, ResNet12) and net.filters == (64, 160, 320, 640)
    assert (net.readout, net.drop_rate, net.dropblock_size) == ("mean", 0.1, 5)
    over = ["model.readout=flatten", "model.dropblock_size=2", "model.filters=[8,8,16,16]"]
    net = MODELS.build(to_objects(compose_config(["model=resnet12", *over])).model, 5)
    assert (net.readout, net.dropblock_size, net.filters) == ("flatten", 2, (8, 8, 16, 16))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(readout="max"), "model.readout must be one of"),
        (dict(filters=(64, 160, 320)), "model.filters must be 4 positive widths"),
        (dict(drop_rate=1.0), r"model.drop_rate must be in \[0, 1\)"),
        (dict(dropblock_size=0), "model.dropblock_size must be >= 1"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        resnet12(5, **kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(readout="max"), "model.readout must be one of"),
        (dict(filters=(64, 160, 320)), "model.filters must be 4 positive widths"),
        (dict(filters=(64, 0, 320, 640)), "model.filters must be 4 positive widths"),
        (dict(drop_rate=1.0), r"model.drop_rate must be in \[0, 1\), got 1.0"),
        (dict(dropblock_size=0), "model.dropblock_size must be >= 1, got 0"),
        (dict(dropblock_ramp=-1), r"model.dropblock_ramp must be >= 0 \(0: constant\), got -1"),
        (dict(conv="cudnn"), "model.conv must be one of"),
    ],
)
def test_the_config_refuses_a_bad_value_when_it_is_made(kwargs, message):
    # metalearn.config.to_objects makes it: refused before a rerun's config is compared with its
    # run directory's (which advised trainer.allow_changes for the value first).
    with pytest.raises(ValueError, match=f"^{message}"):
        ResNet12Config(**kwargs)


def test_the_cli_composes_model_resnet12():
    cmd = [sys.executable, "-m", "metalearn.train", "data=miniimagenet", "model=resnet12"]
    result = finished([*cmd, "--cfg", "job"], 120)
    assert result.returncode == 0, result.stderr
    assert "name: resnet12" in result.stdout and "dropblock_size: 5" in result.stdout


@pytest.mark.slow
def test_miniimagenet_shapes_with_real_widths():
    net = resnet12(5, readout="flatten")
    variables = init(net, 84)
    x = jax.random.normal(jax.random.key(1), (2, 84, 84, 3))
    assert evaluate(net, variables, x, "embed").shape == (2, 5 * 5 * 640)
    logits, _ = train_call(net, variables, x)
    assert logits.shape == (2, 5) and np.all(np.isfinite(logits))
