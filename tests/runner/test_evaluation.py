"""Evaluation statistics on cases with known answers; fixed, disjoint evaluation tasks."""

import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.runner.evaluation import (
    evaluate_split,
    evaluation_keys,
    mean_and_ci95,
    selection_score,
    summarize,
)


def test_mean_and_ci95_known_answer():
    values = np.arange(1.0, 11.0)  # mean 5.5, sample std sqrt(55/6)
    mean, ci95 = mean_and_ci95(values)
    assert mean == 5.5
    assert ci95 == pytest.approx(1.96 * math.sqrt(55 / 6) / math.sqrt(10))


def test_ci95_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(2000):
        mean, ci95 = mean_and_ci95(rng.normal(3.0, 2.0, size=600))
        covered += abs(mean - 3.0) <= ci95
    assert 0.93 <= covered / 2000 <= 0.97


def test_nonfinite_tasks_are_counted_not_averaged():
    record = summarize(np.array([1.0, 3.0, np.inf, np.nan]))
    assert record == {
        "mean": 2.0,
        "ci95": pytest.approx(1.96 * math.sqrt(2) / math.sqrt(2)),
        "nonfinite": 2,
    }
    assert summarize(np.array([np.nan, np.nan]))["mean"] is None


REGRESSION = SimpleNamespace(primary_metric="mse", maximize=False)
CLASSIFICATION = SimpleNamespace(primary_metric="accuracy", maximize=True)


def fake_eval_step(meta_params, split_arrays, keys, shots):
    """Per-task 'mse' = shots * (task index value) + steps column offset: a known answer."""
    values = jax.vmap(lambda k: jax.random.uniform(k))(keys)
    return {"mse": jnp.stack([shots * values, shots * values + 1.0], axis=1)}


def test_evaluate_split_records_equal_a_direct_computation():
    records = evaluate_split(
        fake_eval_step,
        None,
        None,
        split="test",
        seed=7,
        shots_list=[5, 10],
        steps=[0, 3],
        num_tasks=25,
        tasks_per_call=10,
        ways=None,
    )
    assert [(r["shots"], r["steps"]) for r in records] == [(5, 0), (5, 3), (10, 0), (10, 3)]
    for r in records:
        values = np.asarray(
            jax.vmap(jax.random.uniform)(evaluation_keys(7, "test", r["shots"], 25))
        )
        want = r["shots"] * values + (1.0 if r["steps"] == 3 else 0.0)
        mean, ci95 = mean_and_ci95(want)  # padding to 30 tasks (3 calls of 10) is dropped
        assert r["mean"] == pytest.approx(mean, rel=1e-6)
        assert r["ci95"] == pytest.approx(ci95, rel=1e-5)
        assert r["tasks"] == 25 and r["nonfinite"] == 0 and "ways" not in r
    with_ways = evaluate_split(
        fake_eval_step,
        None,
        None,
        split="val",
        seed=7,
        shots_list=[1],
        steps=[0, 1],
        num_tasks=4,
        tasks_per_call=4,
        ways=5,
    )
    assert all(r["ways"] == 5 for r in with_ways)


def test_evaluation_tasks_are_fixed_and_differ_between_splits_and_shots():
    a = jax.random.key_data(evaluation_keys(1, "test", 5, 600))
    np.testing.assert_array_equal(a, jax.random.key_data(evaluation_keys(1, "test", 5, 600)))
    for other in [
        evaluation_keys(1, "val", 5, 600),
        evaluation_keys(1, "test", 10, 600),
        evaluation_keys(2, "test", 5, 600),
    ]:
        b = jax.random.key_data(other)
        assert not np.any(np.all(a[:, None, :] == b[None, :, :], axis=-1))


def test_selection_prefers_lower_mse_and_never_a_diverged_model():
    def recs(mean, nonfinite=0):
        return [{"metric": "mse", "shots": 10, "steps": 10, "mean": mean, "nonfinite": nonfinite}]

    assert selection_score(recs(0.2), REGRESSION, 10) > selection_score(recs(0.3), REGRESSION, 10)
    assert selection_score(recs(0.1, nonfinite=1), REGRESSION, 10) == -math.inf
    acc = [{"metric": "accuracy", "shots": 1, "steps": 10, "mean": 0.9, "nonfinite": 0}]
    assert selection_score(acc, CLASSIFICATION, 1) == 0.9
