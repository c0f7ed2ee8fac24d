"""A model's train/evaluate switch must be called ``train``: metalearn passes that name only."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from metalearn.models.base import ModelParts, model_from_flax


class NormedTraining(nn.Module):
    @nn.compact
    def __call__(self, x, training: bool = False):
        x = nn.BatchNorm(use_running_average=not training)(nn.Dense(4)(x))
        return nn.Dense(1, name="head")(x)


class DropoutDeterministic(nn.Module):
    @nn.compact
    def __call__(self, x, deterministic: bool = True):
        return nn.Dense(1, name="head")(nn.Dropout(0.5, deterministic=deterministic)(x))


class EmbedTraining(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = True):
        return nn.Dense(1, name="head")(self.embed(x, training=train))

    @nn.compact
    def embed(self, x, training: bool = False):
        return nn.BatchNorm(use_running_average=not training)(x)


@pytest.mark.parametrize(
    "module, parts, flag",
    [
        # Batch norm kept its initial running averages: the state moved by exactly 0.
        (NormedTraining(), ModelParts(head="head"), "NormedTraining.__call__ takes 'training'"),
        # Dropout never dropped.
        (DropoutDeterministic(), ModelParts(head="head"), "takes 'deterministic'"),
        (EmbedTraining(), ModelParts(head="head", embed="embed"), "EmbedTraining.embed takes"),
    ],
)
def test_another_name_for_the_train_switch_is_refused(module, parts, flag):
    with pytest.raises(ValueError, match=flag) as err:
        model_from_flax(module, (3,), parts)
    assert "name the argument train" in str(err.value)


def test_a_train_switch_named_train_updates_batch_statistics():
    class Normed(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = True):
            x = nn.BatchNorm(use_running_average=not train)(nn.Dense(4)(x))
            return nn.Dense(1, name="head")(x)

    model = model_from_flax(Normed(), (3,), ModelParts(head="head"))
    params, state = model.init(jax.random.key(0))
    _, trained = model.apply(params, state, None, jnp.ones((5, 3)), train=True)
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), trained, state)
    assert max(jax.tree.leaves(moved)) > 0
