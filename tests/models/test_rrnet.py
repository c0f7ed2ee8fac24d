"""R2D2's network against the reference's ``RRFeatures`` written in PyTorch (float64, the same
weights): the embedding in training mode (batch statistics) and in evaluation mode (running
statistics after a training pass), its size at 84x84 and 32x32, dropout's place, and the
one-line refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.models.rrnet import RRNet, RRNetConfig, rrnet

FILTERS = (3, 4, 5, 6)


def torch_features(filters, drop):
    """bertinetto/r2d2's ``RRFeatures`` (fewshots/models/load_model.py), spelled out."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    def block(c_in, c_out, pool_stride, dropout):
        layers = [
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out, momentum=0.1),
            nn.MaxPool2d(2, stride=pool_stride),
            nn.LeakyReLU(0.1),
        ]
        return nn.Sequential(*layers, *([nn.Dropout(drop)] if dropout else []))

    class Features(nn.Module):
        def __init__(self):
            super().__init__()
            widths = (3, *filters)
            self.blocks = nn.ModuleList(
                block(widths[k], widths[k + 1], 1 if k == 3 else 2, k >= 2) for k in range(4)
            )
            self.pool3 = nn.MaxPool2d(2, stride=1)

        def forward(self, x):
            for k, b in enumerate(self.blocks):
                x = b(x)
                if k == 2:
                    x3 = self.pool3(x).flatten(1)
            return torch.cat([x3, x.flatten(1)], 1)

    return Features().double()


def copy_weights(net, variables):
    """Our parameters into the PyTorch network (HWIO -> OIHW)."""
    import torch

    params = variables["params"]
    for k, b in enumerate(net.blocks, start=1):
        kernel = np.asarray(params[f"block{k}_conv"]["kernel"], np.float64)
        b[0].weight.data = torch.tensor(kernel.transpose(3, 2, 0, 1).copy())
        norm = params[f"block{k}_norm"]
        b[1].weight.data = torch.tensor(np.asarray(norm["scale"], np.float64))
        b[1].bias.data = torch.tensor(np.asarray(norm["bias"], np.float64))


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_embedding_equals_the_references_network_in_float64(mode):
    torch = pytest.importorskip("torch")
    reference = torch_features(FILTERS, drop=0.0)
    with jax.enable_x64(True):
        model = RRNet(num_outputs=5, filters=FILTERS, drop_rate=0.0, conv="xla")
        x = jax.random.normal(jax.random.key(0), (6, 32, 32, 3), jnp.float64)
        variables = jax.tree_util.tree_map(
            lambda a: a.astype(jnp.float64), model.init(jax.random.key(1), x)
        )
        # random batch-norm scales and offsets, so the comparison sees them
        keys = iter(jax.random.split(jax.random.key(2), 8))
        for k in range(1, 5):
            norm = variables["params"][f"block{k}_norm"]
            norm["scale"] = 1.0 + 0.3 * jax.random.normal(next(keys), norm["scale"].shape)
            norm["bias"] = 0.3 * jax.random.normal(next(keys), norm["bias"].shape)
        copy_weights(reference, variables)
        ours, state = model.apply(
            variables, x, True, method="embed", mutable=["batch_stats"]
        )  # a training pass: batch statistics, running ones updated
        reference.train()
        x_torch = torch.tensor(np.asarray(x).transpose(0, 3, 1, 2).copy())
        expected = reference(x_torch).detach().numpy()
        if mode == "eval":  # after that one pass, the running statistics
            sizes = (32 * 32, 16 * 16, 8 * 8, 4 * 4)  # positions per channel at each norm
            for k, b in enumerate(reference.blocks, start=1):
                stats = state["batch_stats"][f"block{k}_norm"]
                np.testing.assert_allclose(stats["mean"], b[1].running_mean.numpy(), rtol=1e-9)
                # PyTorch's running variance takes the unbiased batch variance, ours the
                # biased one (resnet12's docstring): m / (m - 1) apart on the new part.
                m = 6 * sizes[k - 1]
                unbiased = 0.9 + (np.asarray(stats["var"]) - 0.9) * m / (m - 1)
                np.testing.assert_allclose(unbiased, b[1].running_var.numpy(), rtol=1e-9)
                b[1].running_var.data = torch.tensor(np.asarray(stats["var"], np.float64))
            ours = model.apply({**variables, **state}, x, False, method="embed")
            reference.eval()
            expected = reference(x_torch).detach().numpy()
    ours = np.asarray(ours)
    n3 = 3 * 3 * FILTERS[2]
    ours = np.concatenate(
        [
            ours[:, :n3].reshape(6, 3, 3, FILTERS[2]).transpose(0, 3, 1, 2).reshape(6, -1),
            ours[:, n3:].reshape(6, 3, 3, FILTERS[3]).transpose(0, 3, 1, 2).reshape(6, -1),
        ],
        axis=1,
    )
    assert ours.shape == expected.shape == (6, n3 + 3 * 3 * FILTERS[3])
    np.testing.assert_allclose(ours, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("size, features", [(84, 31104 + 41472), (32, 3456 + 4608)])
def test_embedding_sizes_are_the_references(size, features):
    model = rrnet(5)
    x = jax.ShapeDtypeStruct((2, size, size, 3), jnp.float32)
    variables = jax.eval_shape(model.init, jax.random.key(0), x)
    out = jax.eval_shape(lambda v, x: model.apply(v, x, method="embed"), variables, x)
    assert out.shape == (2, features)


def test_dropout_acts_when_training_only():
    model = RRNet(num_outputs=5, filters=FILTERS, drop_rate=0.4, conv="xla")
    x = jax.random.normal(jax.random.key(0), (4, 32, 32, 3))
    variables = model.init(jax.random.key(1), x)
    evaluation = model.apply(variables, x, False, method="embed")
    assert np.array_equal(evaluation, model.apply(variables, x, False, method="embed"))
    trained = [
        model.apply(
            variables,
            x,
            True,
            method="embed",
            mutable=["batch_stats"],
            rngs={"dropout": jax.random.key(seed)},
        )[0]
        for seed in (2, 3)
    ]
    block4 = np.asarray(trained[0])[:, -3 * 3 * FILTERS[3] :]  # dropped before no other pool
    assert 0.28 < np.mean(block4 == 0.0) < 0.52  # dropout 0.4: 216 draws, 0.033 standard error
    assert not np.array_equal(trained[0], trained[1])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(filters=(8, 8, 8)), r"model.filters must be 4 positive widths, got \(8, 8, 8\)"),
        (dict(drop_rate=1.0), r"model.drop_rate must be in \[0, 1\), got 1.0"),
        (dict(conv="fft"), r"model.conv must be one of"),
    ],
)
def test_bad_settings_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RRNetConfig(**kwargs)
