"""A researcher's model or task family that cannot be trained is named when the run is built: a
model without parameters (it trained nothing, silently), a head declared under a name the model
does not have (a KeyError in ANIL and ProtoNets), a family with neither a supervised kind nor an
objective (it said "unknown task kind 'custom'")."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from metalearn.data.task import Task, TaskFamily, family_objective
from metalearn.models.base import ModelParts, model_from_flax
from metalearn.models.mlp import MLP
from metalearn.runner.preflight import check_parameters


class NoParameters(nn.Module):
    num_outputs: int = 1

    def __call__(self, x, train: bool = True):
        return jnp.tanh(x)


def test_a_model_without_parameters_is_refused():
    model = model_from_flax(NoParameters(), (1,))
    with pytest.raises(ValueError, match="^model=still has no parameters .* nothing to meta-learn"):
        check_parameters(model, "still")


def test_a_head_the_model_does_not_have_is_named_with_the_entries_it_has():
    model = model_from_flax(MLP((8,), 1), (1,), ModelParts(head="output"))
    with pytest.raises(ValueError) as err:
        check_parameters(model, "mine")
    assert str(err.value).startswith("model=mine declares its head 'output'")
    assert "its top-level parameter entries are head, hidden_0" in str(err.value)
    check_parameters(model_from_flax(MLP((8,), 1), (1,), ModelParts(head="head")), "mine")


def test_a_family_with_neither_a_supervised_kind_nor_an_objective_is_named():
    def sample(arrays, key, shots):
        return Task(jnp.zeros(2), jnp.zeros(2))

    family = TaskFamily({"train": {}}, sample, (1,), num_outputs=1)  # kind left "custom"
    model = model_from_flax(MLP((8,), 1), (1,))
    with pytest.raises(ValueError, match="^data=mine has kind='custom' and no objective"):
        family_objective(family, model, "data=mine")
    regression = family._replace(kind="regression")
    assert family_objective(regression, model).primary_metric == "mse"
    assert jax.tree_util.tree_leaves(model.init(jax.random.key(0))[0])


def test_gradients_of_another_structure_than_the_meta_parameters_are_named():
    import optax

    from metalearn.algorithms.maml import fomaml
    from metalearn.data.sinusoid import sinusoid
    from metalearn.runner.steps import init_train_state, make_meta_train_step, sample_tasks

    family = sinusoid()
    model = model_from_flax(MLP((8,), 1), (1,), ModelParts(head="head"))
    learner = fomaml(family_objective(family, model))
    optimizer = optax.sgd(0.1)
    state = init_train_state(learner, model, optimizer, jax.random.key(0))
    tasks = sample_tasks(family, {}, jax.random.key(1), 2, 5)

    def head_only(params, task, ctx):  # the optimiser's error was optax's, naming neither
        grads, aux = learner.task_grad(params, task, ctx)
        return grads["head"], aux

    def wrong_shape(params, task, ctx):
        grads, aux = learner.task_grad(params, task, ctx)
        return {**grads, "head": {**grads["head"], "bias": grads["head"]["bias"][None]}}, aux

    def grads_only(params, task, ctx):  # "too many values to unpack (expected 2)" before
        return learner.task_grad(params, task, ctx)[0]

    def metrics_dict(params, task, ctx):
        grads, aux = learner.task_grad(params, task, ctx)
        return grads, aux.metrics

    for task_grad, message in [
        (grads_only, r"task_grad returned a dict, not \(grads, Aux\(model_state, metrics\)\)"),
        (metrics_dict, r"returned a pair whose second item is a dict, not \(grads, Aux"),
        (head_only, r"returned gradients for \['bias', 'kernel'\], not for the meta-parameters"),
        (wrong_shape, r"a gradient of shape \(1, 1\) for the meta-parameter head/bias of shape"),
    ]:
        step = make_meta_train_step(
            learner._replace(task_grad=task_grad),
            optimizer,
            meta_steps=1,
            strategy="vmap",
            key=jax.random.key(2),
        )
        with pytest.raises(ValueError, match=message):
            jax.jit(step)(state, tasks)
    jax.jit(
        make_meta_train_step(
            learner, optimizer, meta_steps=1, strategy="vmap", key=jax.random.key(2)
        )
    )(state, tasks)
