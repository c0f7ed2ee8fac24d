"""The registered Gaussian MLP policy (model=gaussian_mlp): its mean layer's initial scale."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.rl.policy_model import GaussianMLPConfig, gaussian_mlp


def _init(config: GaussianMLPConfig):
    return gaussian_mlp(3, config).init(jax.random.key(0), jnp.zeros((1, 5)))["params"]


def test_head_init_scale_multiplies_only_the_mean_layers_initial_weights():
    paper, small = _init(GaussianMLPConfig()), _init(GaussianMLPConfig(head_init_scale=0.01))
    np.testing.assert_allclose(small["head"]["kernel"], 0.01 * paper["head"]["kernel"], rtol=1e-6)
    assert float(jnp.abs(paper["head"]["kernel"]).max()) > 0.1  # Glorot, not already small
    rest = lambda p: {k: v for k, v in p.items() if k != "head"}  # noqa: E731
    jax.tree.map(np.testing.assert_array_equal, rest(small), rest(paper))
    np.testing.assert_array_equal(small["head"]["bias"], paper["head"]["bias"])


@pytest.mark.parametrize("key", ["init_std", "head_init_scale"])
def test_a_non_positive_scale_is_refused_by_name(key):
    with pytest.raises(ValueError, match=f"model.{key} must be in "):
        gaussian_mlp(2, GaussianMLPConfig(**{key: 0.0}))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(hidden_sizes=()), "model.hidden_sizes must be positive widths, got ()"),
        (dict(hidden_sizes=(8, 0)), "model.hidden_sizes must be positive widths, got (8, 0)"),
        (dict(init_std=0.0), "model.init_std must be in [1e-06, 1e+06], got 0.0"),
        (dict(init_std=1e300), "model.init_std must be in [1e-06, 1e+06], got 1e+300"),
        (dict(head_init_scale=0.0), "model.head_init_scale must be in (0, 1e+06], got 0.0"),
    ],
)
def test_the_config_refuses_a_bad_value_when_it_is_made(kwargs, message):
    # metalearn.config.to_objects makes it: refused before a rerun's config is compared with its
    # run directory's (which advised trainer.allow_changes for the value first).
    with pytest.raises(ValueError) as err:
        GaussianMLPConfig(**kwargs)
    assert str(err.value) == message
