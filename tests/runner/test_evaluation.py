"""Evaluations: records equal to a direct computation; fixed, disjoint evaluation tasks."""

import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.runner.evaluation import (
    evaluate_split,
    evaluation_keys,
    format_record,
    selection_score,
)
from metalearn.statistics import mean_and_ci95, summarize

REGRESSION = SimpleNamespace(primary_metric="mse", maximize=False)
CLASSIFICATION = SimpleNamespace(primary_metric="accuracy", maximize=True)


def test_format_record_shows_median_and_divergence():
    record = {"metric": "mse", "shots": 5, "steps": 10, "tasks": 600}
    record.update(summarize(np.array([0.3, 0.1, 1e20, np.inf]), np.full(4, 3.0)))
    line = format_record(record)
    assert "median" in line and "(2 of 600 tasks diverged, 1 non-finite)" in line
    clean = {"metric": "mse", "shots": 5, "steps": 1, "tasks": 3}
    clean.update(summarize(np.array([0.3, 0.1, 0.2]), np.full(3, 3.0)))
    # The normal 95% interval of the mean, 1.96 standard errors (sample deviation 0.1 over
    # sqrt(3)); of 3 tasks, the median's interval from order statistics spans all of them.
    ci95 = 1.96 * 0.1 / math.sqrt(3)
    assert format_record(clean) == (
        f"mse shots=5 steps=1: 0.2000 ± {ci95:.4f}, median 0.2000 [0.1000, 0.3000]"
    )


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
        objective=REGRESSION,
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
        assert r["median"] == pytest.approx(float(np.median(want)), rel=1e-6)
        assert r["diverged"] == 0
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
        objective=REGRESSION,
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


def test_evaluate_split_counts_a_finite_blow_up_against_the_step_zero_column():
    # The objective's loss is called "nll" here: the rule follows the objective, not a name.
    def blowing_up(meta_params, split_arrays, keys, shots):
        before = jnp.full(keys.shape[0], 3.0)
        after = jnp.full(keys.shape[0], 0.2).at[0].set(1e20)  # the first task blows up
        return {"nll": jnp.stack([before, after], axis=1), "other": jnp.stack([before, after], 1)}

    def run(objective):
        return evaluate_split(
            blowing_up,
            None,
            None,
            split="test",
            seed=0,
            shots_list=[5],
            steps=[0, 10],
            num_tasks=6,
            tasks_per_call=6,
            ways=None,
            objective=objective,
        )

    records = run(SimpleNamespace(primary_metric="nll", maximize=False))
    got = [(r["metric"], r["steps"], r["nonfinite"], r["diverged"]) for r in records]
    # Only the objective's loss is measured against its loss before adaptation.
    assert got == [("nll", 0, 0, 0), ("nll", 10, 0, 1), ("other", 0, 0, 0), ("other", 10, 0, 0)]
    assert records[1]["median"] == pytest.approx(0.2)
    # An objective that maximises its primary metric declares no loss: only non-finite counts.
    maximized = run(SimpleNamespace(primary_metric="nll", maximize=True))
    assert all(r["diverged"] == 0 for r in maximized)


def test_change_from_zero_steps_is_the_paired_mean_and_interval():
    """Tasks spread far apart (RL returns of different goals) and each moved a little: the
    paired change and its interval, not the difference of two wide intervals."""

    def spread(meta_params, split_arrays, keys, shots):
        level = 100.0 * jax.vmap(jax.random.normal)(keys)  # differs a lot between tasks
        gain = 2.0 + 0.5 * jax.vmap(lambda k: jax.random.normal(jax.random.fold_in(k, 1)))(keys)
        return {"return": jnp.stack([level, level + gain, level + 2 * gain], axis=1)}

    records = evaluate_split(
        spread,
        None,
        None,
        split="test",
        seed=3,
        shots_list=[1],
        steps=[0, 1, 2],
        num_tasks=50,
        tasks_per_call=25,
        ways=None,
        objective=SimpleNamespace(primary_metric="return", maximize=True),
    )
    keys = evaluation_keys(3, "test", 1, 50)
    noise = jax.vmap(lambda k: jax.random.normal(jax.random.fold_in(k, 1)))(keys)
    gain = np.asarray(2.0 + 0.5 * noise)
    assert "change" not in records[0]
    for r, k in zip(records[1:], (1, 2), strict=True):
        mean, ci95 = mean_and_ci95(k * gain)
        assert r["change"] == pytest.approx(mean, rel=1e-4)
        assert r["change_ci95"] == pytest.approx(ci95, rel=1e-3)
        assert r["change_ci95"] < r["ci95"] / 50  # the returns' own intervals are ~100 wide
    assert "change from 0 steps +" in format_record(records[1])


def test_selection_reads_the_training_shot_count_at_the_most_steps():
    # Every other selection test had one record, so which one is chosen was never checked.
    evaluated = [(1, 0, 5.0), (1, 10, 4.0), (5, 0, 3.0), (5, 10, 0.5), (5, 1, 2.0)]
    records = [
        {"metric": "mse", "shots": shots, "steps": steps, "mean": mean, "nonfinite": 0}
        for shots, steps, mean in evaluated
    ]
    assert selection_score(records, REGRESSION, 5) == -0.5
    assert selection_score(records, REGRESSION, 1) == -4.0
