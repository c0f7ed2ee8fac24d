"""Evaluation statistics on cases with known answers; fixed, disjoint evaluation tasks."""

import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.runner.evaluation import (
    diverged_mask,
    evaluate_split,
    evaluation_keys,
    format_record,
    mean_and_ci95,
    median_and_ci95,
    paired_change,
    selection_score,
    summarize,
)

REGRESSION = SimpleNamespace(primary_metric="mse", maximize=False)
CLASSIFICATION = SimpleNamespace(primary_metric="accuracy", maximize=True)


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
        "median": None,  # two of four tasks blew up: the median is a blow-up too
        "median_ci95": [1.0, None],
        "nonfinite": 2,
        "diverged": 2,
    }
    assert summarize(np.array([np.nan, np.nan]))["mean"] is None


def test_inf_nan_and_finite_blow_up_are_counted_and_the_median_ignores_them():
    # 10 tasks: 7 well adapted, one inf, one NaN and one finite blow-up to 1e20.
    values = np.array([0.3, 0.1, 0.5, 0.2, np.inf, 0.4, np.nan, 0.6, 1e20, 0.7])
    before = np.full(10, 3.0)
    record = summarize(values, before)
    assert record["nonfinite"] == 2 and record["diverged"] == 3
    # Median over all 10, the two non-finite ones counted as worst: sorted
    # [0.1 .. 0.7, 1e20, inf, inf] -> (0.5 + 0.6) / 2.
    assert record["median"] == pytest.approx(0.55)
    # Distribution-free interval: ranks floor(5 - 3.1) = 1 and ceil(1 + 5 + 3.1) = 10.
    assert record["median_ci95"] == [pytest.approx(0.1), None]
    # The mean is over finite values, so the 1e20 task dominates it: why the median is there.
    assert record["mean"] == pytest.approx((2.8 + 1e20) / 8)
    # A nearly flat task (before 0.01 -> after 0.3) is not a blow-up: the threshold is 10 x
    # max(its own loss before, the median loss before).
    small = summarize(np.array([0.3, 0.2, 0.2]), np.array([0.01, 3.0, 3.0]))
    assert small["diverged"] == 0 and small["nonfinite"] == 0
    assert summarize(np.array([31.0, 0.2, 0.2]), np.array([0.01, 3.0, 3.0]))["diverged"] == 1
    # Without the values before adaptation only non-finite tasks count; accuracy never blows up.
    assert summarize(values)["diverged"] == 2
    accuracy = summarize(
        np.array([0.9, np.nan, 0.8]), np.array([0.2, 0.2, 0.2]), lower_is_better=False
    )
    assert accuracy["diverged"] == 1 and accuracy["median"] == pytest.approx(0.8)


def test_median_ci95_covers_the_true_median_about_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    covered = 0
    for _ in range(1000):  # a heavy-tailed distribution with median 0
        _, lo, hi = median_and_ci95(rng.standard_cauchy(600))
        covered += lo <= 0.0 <= hi
    assert 0.93 <= covered / 1000 <= 0.975


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


def test_one_task_has_a_mean_and_no_interval():
    record = summarize(np.array([0.7]))
    assert record["mean"] == pytest.approx(0.7) and record["ci95"] is None


def test_the_paired_change_leaves_out_tasks_that_are_not_finite_in_either():
    after = np.array([1.0, np.nan, 3.0, np.inf, 2.0, 5.0])
    before = np.array([2.0, 1.0, np.inf, 1.0, 4.0, 4.5])
    diff = np.array([1.0 - 2.0, 2.0 - 4.0, 5.0 - 4.5])  # the three tasks finite in both
    expected = diff.mean(), 1.96 * diff.std(ddof=1) / math.sqrt(3)
    change = paired_change(after, before)
    assert change["change"] == pytest.approx(expected[0])
    assert change["change_ci95"] == pytest.approx(expected[1])


def test_divergence_is_judged_against_the_median_before_adaptation_not_the_mean():
    # 10 x max(0.01, median 0.01) = 0.1 < 5: task 0 diverged; the mean (33.3) would hide it.
    blown = diverged_mask(np.array([5.0, 0.005, 50.0]), np.array([0.01, 0.01, 100.0]))
    assert blown.tolist() == [True, False, False]
