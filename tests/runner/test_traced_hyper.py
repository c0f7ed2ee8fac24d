"""The seed's keys, ``algorithm.inner_lr`` and ``optimizer.lr`` are arguments of the compiled
steps, not constants: runs (sweep jobs) differing only in them compile the same program, which
JAX's caches then reuse."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.config import to_objects
from metalearn.runner.run import Runner
from metalearn.runner.steps import make_multi_step, trained
from tests.cli import TINY
from tests.conftest import compose_config, runner_of

SAME_PROGRAM = {
    "seed": ["seed=7"],
    "inner_lr": ["algorithm.inner_lr=0.003"],
    "outer lr": ["optimizer.lr=0.02"],
    "outer lr, cosine": ["optimizer.schedule=cosine", "optimizer.lr=0.02"],
}


def runner(tmp_path, overrides: list[str]) -> Runner:
    cfg = to_objects(compose_config([*TINY, *overrides]))
    return runner_of(cfg, tmp_path / "_".join(overrides).replace("=", "-"))


def programs(run: Runner) -> tuple[str, str]:
    """The lowered training call (2 fused steps) and evaluation call, as text."""
    train = run.lower(run.initial_state, 2).as_text()
    keys = jax.random.split(jax.random.key(0), 2)
    evaluate = run.eval_step.lower(
        trained(run.initial_state), run.splits["val"], keys, 5, run.hyper.learner
    ).as_text()
    return train, evaluate


@pytest.mark.parametrize("changed", sorted(SAME_PROGRAM))
def test_runs_differing_in_seed_or_rates_lower_to_the_same_program(tmp_path, changed):
    base_overrides = ["optimizer.schedule=cosine"] if "cosine" in changed else []
    base = runner(tmp_path, base_overrides)
    other = runner(tmp_path, SAME_PROGRAM[changed])
    assert base.cfg != other.cfg
    base_train, base_eval = programs(base)
    other_train, other_eval = programs(other)
    assert other_train == base_train
    assert other_eval == base_eval


def test_a_structural_change_is_a_different_program(tmp_path):
    # The comparison above can fail: another hidden width changes both programs.
    base_train, base_eval = programs(runner(tmp_path, []))
    other_train, other_eval = programs(runner(tmp_path, ["model.hidden_sizes=[40,20]"]))
    assert other_train != base_train and other_eval != base_eval


def test_one_compilation_serves_runs_with_another_inner_lr(tmp_path):
    """One jitted step, called with a second run's keys and rates: still one compilation, and
    exactly the second run's own result."""
    first = runner(tmp_path, [])
    second = runner(tmp_path, ["algorithm.inner_lr=0.003", "seed=3", "optimizer.lr=0.02"])
    traces = []

    def counted_meta_step(*args):  # runs once per trace: a second trace is a recompilation
        traces.append(None)
        return first._meta_step(*args)

    step = make_multi_step(counted_meta_step, 2)
    arrays = first.splits["train"]
    copy = lambda state: jax.tree_util.tree_map(jnp.copy, state)  # noqa: E731  (step donates)
    state_a, _ = step(copy(first.initial_state), arrays, first.hyper)
    traced_once = len(traces)
    state_b, metrics_b = step(copy(second.initial_state), arrays, second.hyper)
    assert traced_once >= 1 and len(traces) == traced_once  # the second run traced nothing
    own_b, own_metrics_b = second.train_call(copy(second.initial_state), 2)
    for x, y in zip(
        jax.tree_util.tree_leaves(state_b), jax.tree_util.tree_leaves(own_b), strict=True
    ):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(metrics_b["mse"], own_metrics_b["mse"])
    # and the rates do act: the two runs' parameters differ
    a, b = (jax.tree_util.tree_leaves(s.meta_params)[0] for s in (state_a, state_b))
    assert not np.array_equal(a, b)
