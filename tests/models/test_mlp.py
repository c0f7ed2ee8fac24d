"""The MLP's weight initialisers: Flax's default and the MAML reference code's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.models.mlp import MLPConfig, mlp


def init(**kwargs):
    return mlp(1, MLPConfig(hidden_sizes=(40, 40), **kwargs)).init(
        jax.random.key(0), jnp.zeros((1, 1))
    )["params"]


def test_reference_init_is_a_normal_of_std_001_cut_at_two_std_with_zero_biases():
    # cbfinn/maml construct_fc_weights: tf.truncated_normal(stddev=0.01) weights (re-drawn
    # beyond two standard deviations), tf.zeros biases.
    params = init(kernel_init="truncated_normal", kernel_std=0.01)
    kernels = np.concatenate([np.ravel(params[k]["kernel"]) for k in params])
    assert kernels.size == 40 + 40 * 40 + 40
    assert np.abs(kernels).max() <= 0.02
    # A standard normal cut at +-2 has standard deviation 0.8796.
    assert kernels.std() == pytest.approx(0.01 * 0.8796, rel=0.05)
    assert all(np.all(params[k]["bias"] == 0) for k in params)


def test_default_init_is_flax_lecun_normal():
    params = init()
    # LeCun normal: std 1/sqrt(fan_in) (truncated, then rescaled to that std): 1 for the
    # 1 -> 40 layer, 1/sqrt(40) for the 40 -> 40 layer.
    assert np.std(params["hidden_0"]["kernel"]) == pytest.approx(1.0, rel=0.3)
    assert np.std(params["hidden_1"]["kernel"]) == pytest.approx(40**-0.5, rel=0.1)
    reference = init(kernel_init="truncated_normal")
    assert np.std(params["hidden_1"]["kernel"]) > 10 * np.std(reference["hidden_1"]["kernel"])


def test_bad_init_settings_are_refused():
    with pytest.raises(ValueError, match="model.kernel_init must be one of"):
        mlp(1, MLPConfig(kernel_init="xavier"))
    with pytest.raises(ValueError, match="model.kernel_std must be > 0"):
        mlp(1, MLPConfig(kernel_init="truncated_normal", kernel_std=0.0))


# metalearn.config.to_objects makes the config: a bad value is refused there, before a rerun's
# config is compared with its run directory's (which advised trainer.allow_changes for it first).
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(activation="swish"), "model.activation must be one of ['gelu', 'relu', 'tanh']"),
        (dict(hidden_sizes=(40, 0)), "model.hidden_sizes must be positive widths, got [40, 0]"),
        (dict(hidden_sizes=()), "model.hidden_sizes must be positive widths, got []"),
        (dict(kernel_init="xavier"), "model.kernel_init must be one of"),
        (dict(kernel_std=0.0), "model.kernel_std must be > 0, got 0.0"),
    ],
)
def test_the_config_refuses_a_bad_value_when_it_is_made(kwargs, message):
    with pytest.raises(ValueError) as err:
        MLPConfig(**kwargs)
    assert str(err.value).startswith(message), str(err.value)
