"""A researcher's own objective or model that breaks its contract stops the run before the first
step, in one line naming the part, what it returned and what is expected.

Before, a loss returning a bare scalar, a vector, another model state or metrics that are not a
dict of scalars failed deep in JAX (``Too many indices``, ``scan body function carry input and
carry output must have the same pytree structure``, ``iteration over a 0-d array`` after the
first steps had trained); a loss handing back the model state it was given trained a batch-norm
model whose running statistics never moved, silently; a model returning a tuple, a factory
returning no Flax module and a ProtoNets embedding returning a tuple were AttributeErrors.

The parts are registered here, at import, so the command-line tests name this module in
``METALEARN_PLUGINS``.
"""

from __future__ import annotations

import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from metalearn.algorithms.base import context
from metalearn.algorithms.protonet import protonet
from metalearn.config import register_configs, to_objects
from metalearn.data.sinusoid import sinusoid
from metalearn.data.task import Aux, Objective, supervised_objective
from metalearn.models.base import ModelParts, model_from_flax
from metalearn.registry import MODELS, TASKS
from tests.algorithms.problems import DIM, WAYS, cluster_task
from tests.cli import TINY, error_line, run_cli
from tests.conftest import compose_config, experiment_of, runner_of

PLUGIN_ENV = {**os.environ, "METALEARN_PLUGINS": __name__}


def scored(model, params, state, key, batch, train):
    """``(squared errors, new model state)`` of ``model`` on a regression ``batch``."""
    outputs, new_state = model.apply(params, state, key, batch[0], train)
    return (outputs - batch[1]) ** 2, new_state


# Losses of a sinusoid family's own objective: (squared errors, the state given, the new state)
# -> what the loss returns. "good" is the contract; each other breaks one part of it.
LOSSES = {
    "good": lambda err, state, new: (jnp.mean(err), Aux(new, {"mse": jnp.mean(err)})),
    "bare_scalar": lambda err, state, new: jnp.mean(err),
    "per_example": lambda err, state, new: (err[:, 0], Aux(new, {"mse": jnp.mean(err)})),
    "no_state": lambda err, state, new: (jnp.mean(err), Aux(None, {"mse": jnp.mean(err)})),
    "other_state": lambda err, state, new: (
        jnp.mean(err),
        Aux({"step": jnp.zeros(())}, {"mse": jnp.mean(err)}),
    ),
    "list_metrics": lambda err, state, new: (jnp.mean(err), Aux(new, [jnp.mean(err)])),
    "scalar_metrics": lambda err, state, new: (jnp.mean(err), Aux(new, jnp.mean(err))),
    "vector_metrics": lambda err, state, new: (jnp.mean(err), Aux(new, {"mse": err[:, 0]})),
    "given_state": lambda err, state, new: (jnp.mean(err), Aux(state, {"mse": jnp.mean(err)})),
}


@dataclasses.dataclass
class OwnLossConfig:
    name: str = "own_loss"
    loss: str = "good"


@TASKS.register("own_loss", OwnLossConfig)
def own_loss(config=None):
    c = config or OwnLossConfig()

    def objective(model):
        def loss(params, model_state, key, batch, train=True):
            err, new_state = scored(model, params, model_state, key, batch, train)
            return LOSSES[c.loss](err, model_state, new_state)

        return Objective(model, loss, "mse", False)

    return sinusoid()._replace(kind="custom", objective=objective)


class NormedMLP(nn.Module):
    num_outputs: int

    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.BatchNorm(use_running_average=not train)(nn.Dense(16)(x))
        return nn.Dense(self.num_outputs, name="head")(nn.relu(x))


class OutputsAndFeatures(nn.Module):
    """Returns (outputs, features): a tuple, not one array. Its embed returns a tuple too."""

    num_outputs: int

    def setup(self):
        self.hidden = nn.Dense(16)
        self.head = nn.Dense(self.num_outputs)

    def embed(self, x, train: bool = True):
        features = nn.relu(self.hidden(x))
        return features, features

    def __call__(self, x, train: bool = True):
        features = self.embed(x, train)[0]
        return self.head(features), features


@dataclasses.dataclass
class NormedMLPConfig:
    name: str = "own_normed_mlp"


@dataclasses.dataclass
class TupleModelConfig:
    name: str = "own_tuple_model"


@dataclasses.dataclass
class NoModuleConfig:
    name: str = "own_no_module"


@MODELS.register("own_normed_mlp", NormedMLPConfig, parts=ModelParts(head="head"))
def own_normed_mlp(num_outputs, config=None):
    return NormedMLP(num_outputs)


@MODELS.register("own_tuple_model", TupleModelConfig, parts=ModelParts(head="head"))
def own_tuple_model(num_outputs, config=None):
    return OutputsAndFeatures(num_outputs)


@MODELS.register("own_no_module", NoModuleConfig, parts=ModelParts(head="head"))
def own_no_module(num_outputs, config=None):
    return lambda x: x  # the forward function, not the Flax module


def config(*overrides):
    register_configs()  # the family and models registered above become options
    return to_objects(compose_config([*TINY, *overrides]))


def refusal(tmp_path, *overrides) -> str:
    """The ValueError a run of ``overrides`` is refused with when it is set up."""
    with pytest.raises(ValueError) as err:
        runner_of(config(*overrides), tmp_path)
    return str(err.value)


def test_a_loss_returning_a_bare_scalar_is_one_line(tmp_path):
    result = run_cli(
        *TINY,
        "data=own_loss",
        "data.loss=bare_scalar",
        f"hydra.run.dir={tmp_path / 'run'}",
        env=PLUGIN_ENV,
    )
    error_line(
        result,
        "error: data=own_loss: its objective's loss (train=True, on a task's support set) "
        "returned an array of shape () (float32), not the pair (loss, Aux(model_state, metrics))",
        "see docs/extending.md",
    )


def test_a_loss_that_is_not_a_scalar_is_named(tmp_path):
    message = refusal(tmp_path, "data=own_loss", "data.loss=per_example")
    assert message.startswith(
        "data=own_loss: its objective's loss (train=True, on a task's support set) returned a "
        "loss of shape (10,) (float32), not a float scalar"
    ), message
    assert "(jnp.mean)" in message


@pytest.mark.parametrize(
    "loss, returned",
    [("no_state", "Aux.model_state None"), ("other_state", "Aux.model_state a dict of step ()")],
)
def test_a_model_state_of_another_structure_is_named(tmp_path, loss, returned):
    message = refusal(tmp_path, "data=own_loss", f"data.loss={loss}")
    assert message.startswith("data=own_loss: its objective's loss (train=True, on a "), message
    assert f"returned {returned}" in message, message
    assert "not a state of the structure and shapes of the one it was given ({})" in message


@pytest.mark.parametrize(
    "loss, returned",
    [
        ("list_metrics", "metrics that are a list of 1 item (arrays of shapes ()), not a dict"),
        ("scalar_metrics", "metrics that are an array of shape () (float32), not a dict"),
        ("vector_metrics", "the metric 'mse' of shape (10,), not a scalar"),
    ],
)
def test_metrics_that_are_not_a_dict_of_scalars_are_named(tmp_path, loss, returned):
    message = refusal(tmp_path, "data=own_loss", f"data.loss={loss}")
    assert message.startswith("data=own_loss: its objective's loss (train=True"), message
    assert f"returned {returned}" in message, message


def test_a_loss_that_hands_back_the_state_it_was_given_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(
        *TINY,
        "data=own_loss",
        "data.loss=given_state",
        "model=own_normed_mlp",
        f"hydra.run.dir={run_dir}",
        env=PLUGIN_ENV,
    )  # it trained and evaluated, with batch-norm statistics frozen at their initial values
    error_line(
        result,
        "error: data=own_loss: its objective's loss returns, in training (train=True), the model "
        "state it was given, but model=own_normed_mlp's apply updates that state "
        "(batch_stats/BatchNorm_0/mean, batch_stats/BatchNorm_0/var)",
        "return the state model.apply returned",
    )
    assert not (run_dir / "eval.json").exists()


@pytest.mark.parametrize(
    "overrides",
    [
        ["data=own_loss", "model=own_normed_mlp"],  # the loss returns the new state
        ["data=own_loss"],  # a model without state: the state given is the state to return
        ["data=sinusoid", "model=own_normed_mlp"],  # the library's supervised objective
    ],
)
def test_objectives_that_keep_the_contract_pass(tmp_path, overrides):
    runner_of(config(*overrides), tmp_path)


def test_a_model_returning_a_tuple_is_one_line(tmp_path):
    result = run_cli(
        *TINY, "model=own_tuple_model", f"hydra.run.dir={tmp_path / 'run'}", env=PLUGIN_ENV
    )
    error_line(
        result,
        "error: model=own_tuple_model: its apply returned a tuple of 2 items (arrays of shapes "
        "(10, 1), (10, 16)), not one array of outputs, which data=sinusoid's regression loss "
        "scores",
        "see docs/extending.md (a model)",
    )
    # Outside the runner, the supervised loss says so when it is traced.
    model = model_from_flax(OutputsAndFeatures(1), (1,))
    params, state = model.init(jax.random.key(0))
    batch = (jnp.zeros((4, 1)), jnp.zeros((4, 1)))
    loss = supervised_objective(model, "regression").loss
    tuple_of_two = r"^regression: the model's apply returned a tuple of 2 items \(arrays of shapes"
    with pytest.raises(ValueError, match=tuple_of_two):
        loss(params, state, None, batch)


def test_a_model_factory_or_model_from_flax_without_a_flax_module_is_named():
    with pytest.raises(ValueError) as err:
        experiment_of(config("model=own_no_module"))
    assert str(err.value).startswith(
        "model=own_no_module: its factory returned a function (own_no_module.<locals>.<lambda>), "
        "not a Flax module (an instance of flax.linen.Module"
    ), err.value
    with pytest.raises(ValueError, match=r"^model_from_flax was given a function \(.*\), not a"):
        model_from_flax(lambda x: x, (1,))
    with pytest.raises(ValueError, match=r"given the class Dense, not an instance of it \(Dense"):
        model_from_flax(nn.Dense, (1,))


def test_protonet_with_an_embedding_that_is_a_tuple_is_named():
    parts = ModelParts(head="head", embed="embed")
    model = model_from_flax(OutputsAndFeatures(WAYS), (DIM,), parts)
    learner = protonet(supervised_objective(model, "classification"))
    params, state = model.init(jax.random.key(0))
    task = cluster_task(jax.random.key(1), 2, 3)
    message = (
        r"^algorithm=protonet: the model's embed \(ModelParts\(embed=\.\.\.\)\) returned a tuple "
        r"of 2 items \(arrays of shapes \(\d+, 16\), \(\d+, 16\)\), not one array of features "
        r"\[examples, features\]"
    )
    with pytest.raises(ValueError, match=message):
        jax.jit(learner.task_grad)(params, task, context(state))
    with pytest.raises(ValueError, match=message):
        learner.adapt(params, task.support, context(state))
