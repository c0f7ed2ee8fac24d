"""After a NaN, the likely cause is named: the data, the model, or a learning rate. NaN data and a
model whose outputs overflow were blamed on algorithm.inner_lr before."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from metalearn.config import register_configs, to_objects
from metalearn.data.task import Task, TaskFamily
from metalearn.models.base import ModelParts
from metalearn.registry import MODELS, TASKS
from metalearn.runner.divergence import divergence_advice
from metalearn.runner.loop import NonFiniteError, train_and_evaluate
from metalearn.runner.steps import trained
from tests.cli import TINY
from tests.conftest import compose_config, experiment_of


@dataclasses.dataclass
class NaNLinesConfig:
    name: str = "nan_lines"
    nan_above: float = 1.645  # a task's slope above this has NaN targets: about 1 task in 20


@TASKS.register("nan_lines", NaNLinesConfig)
def nan_lines(config=None):
    c = config or NaNLinesConfig()

    def sample(split_arrays, key, shots):
        slope_key, x_key = jax.random.split(key)
        slope = jax.random.normal(slope_key)
        x = jax.random.uniform(x_key, (shots + 10, 1), minval=-1, maxval=1)
        y = jnp.where(slope > c.nan_above, jnp.nan, slope * x)
        return Task((x[:shots], y[:shots]), (x[shots:], y[shots:]))

    return TaskFamily(
        {"train": {}, "val": {}, "test": {}}, sample, (1,), num_outputs=1, kind="regression"
    )


class OverflowingMLP(nn.Module):
    num_outputs: int

    @nn.compact
    def __call__(self, x, train: bool = True):
        hidden = nn.relu(nn.Dense(8)(x))
        return nn.Dense(self.num_outputs, name="head")(hidden) * 1e30 * 1e30  # inf in float32


@dataclasses.dataclass
class OverflowingMLPConfig:
    name: str = "overflowing_mlp"


@MODELS.register("overflowing_mlp", OverflowingMLPConfig, parts=ModelParts(head="head"))
def overflowing_mlp(num_outputs, config=None):
    return OverflowingMLP(num_outputs)


def config(*overrides):
    register_configs()  # the family and model registered above become options
    return to_objects(compose_config([*TINY, *overrides]))


def advice(cfg):
    exp = experiment_of(cfg)
    return divergence_advice(exp, exp.tasks.splits["train"], trained(exp.initial_state))


def test_nan_in_the_data_is_named_not_a_learning_rate():
    text = advice(config("data=nan_lines"))
    assert text.startswith("256 training tasks sampled again hold non-finite values"), text
    assert "task.support[1]" in text and "inner_lr" not in text


def test_a_model_whose_loss_is_non_finite_before_adaptation_is_named():
    text = advice(config("data=sinusoid", "model=overflowing_mlp"))
    assert "the query loss is already non-finite before any inner step" in text, text
    assert "(8 of 8 training tasks)" in text and "check the model" in text
    assert "lower" not in text  # no learning rate is blamed


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["algorithm.inner_lr=1e4", "algorithm.inner_steps=5"], "lower algorithm.inner_lr"),
        ([], "the inner loop adapts sanely"),
    ],
)
def test_finite_data_and_loss_leave_the_verdict_to_the_rates(overrides, expected):
    assert expected in advice(config(*overrides))


def test_a_run_that_meets_the_overflowing_model_stops_naming_it(tmp_path):
    cfg = config("data=sinusoid", "model=overflowing_mlp")
    with pytest.raises(NonFiniteError, match="non-finite .* at step") as err:
        train_and_evaluate(cfg, str(tmp_path))
    assert "Likely cause: the query loss is already non-finite before any inner step" in str(
        err.value
    )
