"""Every registered task family builds: image ones on ``tfds.testing.mock_data``."""

from __future__ import annotations

import dataclasses
import inspect

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds
from omegaconf import OmegaConf

from metalearn.data.task import TaskFamily
from metalearn.registry import TASKS

IMAGE_SHAPES = {
    "omniglot": (28, 28, 1),
    "miniimagenet": (84, 84, 3),
    "cifarfs": (32, 32, 3),
    "fc100": (32, 32, 3),
}
CLASSES_PER_SPLIT, PER_CLASS = 7, 20


def fake_data_source(image_shape):
    """An ``as_data_source`` replacement: uniform per-class records of random pixels."""

    def as_data_source(self, split, **kwargs):
        rng = np.random.default_rng(len(split))
        return [
            {
                "images": rng.integers(0, 256, (PER_CLASS, *image_shape), dtype=np.uint8),
                "class_name": f"{split}_{c}".encode(),
            }
            for c in range(CLASSES_PER_SPLIT)
        ]

    return as_data_source


def test_the_image_datasets_are_registered():
    assert set(IMAGE_SHAPES) | {"sinusoid"} <= set(TASKS.names())


@pytest.mark.parametrize("name", sorted(IMAGE_SHAPES))
def test_the_factory_takes_its_config_dataclass(name):
    # The dataclass is the one home of the defaults: the factory takes it (and overrides of
    # its fields), repeating none of them as keywords.
    entry = TASKS.entry(name)
    fields = {f.name: f.default for f in dataclasses.fields(entry.config_cls)}
    assert fields.pop("name") == name
    params = inspect.signature(entry.factory).parameters
    assert list(params) == ["config", "overrides"] and params["config"].default is None
    assert {"ways", "num_queries", "data_dir", "manual_dir"} <= set(fields)
    assert not entry.config_cls.__dataclass_params__.frozen
    config = OmegaConf.to_object(OmegaConf.structured(entry.config_cls))  # Hydra can type it
    as_tuples = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(config).items()}
    assert as_tuples == vars(entry.config_cls())


@pytest.mark.parametrize("name", sorted(IMAGE_SHAPES))
def test_builds_on_tfds_mock_data(name, tmp_path):
    shape = IMAGE_SHAPES[name]
    config = TASKS.entry(name).config_cls(ways=5, num_queries=3, data_dir=str(tmp_path))
    with tfds.testing.mock_data(as_data_source_fn=fake_data_source(shape)):
        tasks = TASKS.build(config)
    assert isinstance(tasks, TaskFamily)
    assert tasks.input_shape == shape and tasks.num_outputs == tasks.ways == 5
    assert tasks.kind == "classification"
    rotations = 4 if name == "omniglot" else 1
    for split in ("train", "val", "test"):
        images = tasks.splits[split].dense()
        assert images.shape == (CLASSES_PER_SPLIT * rotations, PER_CLASS, *shape)
    sample = jax.jit(tasks.sample, static_argnums=2)
    task = sample(tasks.splits["val"], jax.random.key(0), 2)
    assert task.support[0].shape == (10, *shape) and task.query[0].shape == (15, *shape)
    assert sorted(np.asarray(task.query[1]).tolist()) == sorted(list(range(5)) * 3)


def test_sinusoid_builds_from_its_config():
    tasks = TASKS.build(TASKS.entry("sinusoid").config_cls())
    assert tasks.kind == "regression" and tasks.splits["train"] == {}


def test_sinusoid_query_points_as_many_as_the_shots_draws_the_reference_codes_tasks():
    # num_queries=0 draws 2K points per task, the first K the support (cbfinn/maml's
    # DataGenerator(2K)): the first K query points are those of num_queries=K, and K=5 and K=20
    # give 5 and 20 query points; a negative count is one error naming the key.
    config = TASKS.entry("sinusoid").config_cls
    as_many, fixed = TASKS.build(config(num_queries=0)), TASKS.build(config(num_queries=5))
    for shots in (5, 20):
        task = as_many.sample({}, jax.random.key(3), shots)
        assert task.support[0].shape == (shots, 1) and task.query[0].shape == (shots, 1)
    same = fixed.sample({}, jax.random.key(3), 5)
    task = as_many.sample({}, jax.random.key(3), 5)
    np.testing.assert_array_equal(task.query[0], same.query[0])
    np.testing.assert_array_equal(task.support[1], same.support[1])
    with pytest.raises(ValueError, match=r"data.num_queries must be >= 1, or 0 for as many"):
        TASKS.build(config(num_queries=-1))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(amplitude_range=(5.0, 0.1)), "data.amplitude_range must be [low, high] with low"),
        (dict(phase_range=(0.0,)), "data.phase_range must be [low, high] with low <= high"),
        (dict(input_range=(1.0, -1.0)), "data.input_range must be [low, high] with low"),
        (dict(num_queries=-1), "data.num_queries must be >= 1, or 0 for as many as the shots"),
    ],
)
def test_the_sinusoid_config_refuses_a_bad_value_when_it_is_made(kwargs, message):
    # metalearn.config.to_objects makes it: refused before a rerun's config is compared with its
    # run directory's (which advised trainer.allow_changes for the value first).
    with pytest.raises(ValueError) as err:
        TASKS.entry("sinusoid").config_cls(**kwargs)
    assert str(err.value).startswith(message), str(err.value)
