"""A task family's sampler is checked once before a run: each mistake below ran on silently (or
surfaced later as a NaN blamed on a learning rate); now it is one line naming what to fix."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.data.episodes import episode_distribution
from metalearn.data.family_checks import check_family, sampled_values_problem
from metalearn.data.sinusoid import sinusoid
from metalearn.data.task import Task, TaskFamily, WeightedBatch
from metalearn.rl.family import RLTasksConfig, rl_env

SPLITS = {"train": {}, "val": {}, "test": {}}


def lines_task(key, shots, num_queries=10):
    slope_key, x_key = jax.random.split(key)
    slope = jax.random.normal(slope_key)
    x = jax.random.uniform(x_key, (shots + num_queries, 1), minval=-1, maxval=1)
    return Task((x[:shots], slope * x[:shots]), (x[shots:], slope * x[shots:]))


def regression(sample, input_shape=(1,)):
    return TaskFamily(SPLITS, sample, input_shape=input_shape, num_outputs=1, kind="regression")


def classification(sample, ways=5):
    return TaskFamily(
        SPLITS, sample, input_shape=(1,), num_outputs=ways, kind="classification", ways=ways
    )


def episode(key, ways, shots, num_queries=3, label_offset=0, x_scale=1.0):
    count = ways * (shots + num_queries)
    x = x_scale * jax.random.normal(key, (count, 1))
    labels = jnp.concatenate(
        [jnp.repeat(jnp.arange(ways), shots), jnp.repeat(jnp.arange(ways), num_queries)]
    )
    n = ways * shots
    return Task((x[:n], labels[:n] + label_offset), (x[n:], labels[n:] + label_offset))


def check(family, trainer_shots=10, eval_shots=(5, 10, 20)):
    check_family(family, "mine", trainer_shots, list(eval_shots))


def test_the_librarys_families_pass():
    check(sinusoid())
    images = {
        s: np.random.default_rng(0).integers(0, 255, (8, 6, 4, 4, 1), np.uint8) for s in SPLITS
    }
    check(episode_distribution(images, ways=5, num_queries=2, dataset="demo"), 1, [1, 2])
    check(episode_distribution(images, ways=3, num_queries=2, dataset="demo", train_ways=6), 2, [2])
    padded = episode_distribution(
        images, ways=5, num_queries=2, dataset="demo", ways_range=(2, 5), shots_range=(1, 3)
    )
    check(padded, 3, [3])
    check(rl_env(RLTasksConfig(env="nav2d")), 1, [1])
    check(regression(lambda arrays, key, shots: lines_task(key, shots)))
    check(classification(lambda arrays, key, shots: episode(key, 5, shots)), 1, [1, 5])


@pytest.mark.parametrize(
    "family, fragments",
    [
        (  # reported as 5-shot, computed on 10 examples
            regression(lambda arrays, key, shots: lines_task(key, 10)),
            ["for eval.shots=5 on the test split", "10 support examples, not 5"],
        ),
        (  # 5-way 1-shot evaluated on a 5-way 5-shot episode
            classification(lambda arrays, key, shots: episode(key, 5, 5)),
            ["for trainer.shots=1 on the val split", "25 support examples, not ways * shots"],
        ),
        (
            classification(lambda arrays, key, shots: episode(key, 5, shots + 1)),
            ["for trainer.shots=1 on the val split", "10 support examples"],
        ),
        (
            regression(lambda arrays, key, shots: lines_task(key, shots), input_shape=(2,)),
            ["support inputs of shape (10, 1)", "the family's input_shape is (2,)"],
        ),
        (
            regression(lambda arrays, key, shots: lines_task(key, shots)._replace(query=None)),
            ["a query of NoneType, not an (inputs, targets) pair"],
        ),
        (
            regression(lambda arrays, key, shots: lines_task(key, shots).support),
            ["a tuple, not a task with support and query"],
        ),
        (
            regression(
                lambda arrays, key, shots: Task(
                    lines_task(key, shots).support,
                    (jnp.zeros((10, 1)), jnp.zeros((7, 1))),
                )
            ),
            ["10 query inputs but 7 targets"],
        ),
        (  # a mean over no query example: a NaN blamed on the model's outputs, at step 1
            regression(lambda arrays, key, shots: lines_task(key, shots, num_queries=0)),
            ["a query set of 0 examples"],
        ),
    ],
)
def test_a_task_of_the_wrong_shape_is_one_line(family, fragments):
    with pytest.raises(ValueError, match="^data=mine: for ") as err:
        check(family, 1 if family.kind == "classification" else 10, [5, 1])
    for fragment in fragments:
        assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def numpy_random_lines(arrays, key, shots):
    slope = np.random.normal()  # drawn once, when the step is traced: every task is this one
    x = jnp.asarray(np.random.uniform(-1, 1, (shots + 10, 1)), jnp.float32)
    return Task((x[:shots], slope * x[:shots]), (x[shots:], slope * x[shots:]))


def nan_lines(arrays, key, shots):
    task = lines_task(key, shots)
    return task._replace(support=(task.support[0], task.support[1] / 0.0 * 0.0))


@pytest.mark.parametrize(
    "family, fragments",
    [
        (
            regression(numpy_random_lines),
            ["the same task for two different keys", "not numpy.random or random"],
        ),
        (regression(nan_lines), ["non-finite values (NaN or inf) in task.support[1]"]),
        (
            classification(lambda arrays, key, shots: episode(key, 5, shots, label_offset=1)),
            ["support labels outside 0..4 (e.g. 5)", "relabel each episode's classes"],
        ),
    ],
)
def test_sampled_values_that_are_wrong_are_one_line(family, fragments):
    with pytest.raises(
        ValueError, match="^data=mine: two training tasks sampled at the start "
    ) as err:
        check(family, 1 if family.kind == "classification" else 10, [1])
    message = str(err.value)
    for fragment in fragments:
        assert fragment in message
    assert "\n" not in message


def test_padding_labels_are_not_taken_for_labels_out_of_range():
    def padded(arrays, key, shots):
        task = episode(key, 3, shots)
        pad = lambda batch: WeightedBatch(  # noqa: E731
            jnp.concatenate([batch[0], jnp.zeros((2, 1))]),
            jnp.concatenate([batch[1], jnp.array([-1, -1])]),
            jnp.concatenate([jnp.ones(batch[1].shape[0]), jnp.zeros(2)]),
        )
        return Task(pad(task.support), pad(task.query))

    family = classification(padded, ways=3)
    assert sampled_values_problem(family, 1) is None
    check(family, 1, [1])


def test_a_rare_non_finite_value_is_found_among_many_tasks():
    def rare_nan(arrays, key, shots):
        task = lines_task(key, shots)
        slope = task.support[1][0, 0] / task.support[0][0, 0]
        targets = jnp.where(slope > 1.645, jnp.nan, task.query[1])  # about 1 task in 20
        return task._replace(query=(task.query[0], targets))

    family = regression(rare_nan)
    assert sampled_values_problem(family, 10) is None  # the first two tasks happen to be finite
    assert "non-finite" in sampled_values_problem(family, 10, count=256, distinct=False)


def test_a_sampler_that_cannot_supply_the_shots_names_the_setting():
    def sample(arrays, key, shots):
        if shots > 18:
            raise ValueError(f"shots={shots} exceeds the 20 examples per class")
        return lines_task(key, shots)

    with pytest.raises(ValueError, match=r"^eval.shots=\[5, 50\]: shots=50 exceeds .*; lower"):
        check(regression(sample), 10, [5, 50])
    with pytest.raises(ValueError, match=r"^trainer.shots=20: shots=20 exceeds .*; lower"):
        check(regression(sample), 20, [5])
