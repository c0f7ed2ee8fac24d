"""How tasks are batched: every strategy maps and averages the same way, whatever the count."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from metalearn.core.batching import is_task_batching, map_over_tasks, mean_over_tasks


def _fn(task):
    return {"sum": jnp.sum(task["x"]), "scaled": task["x"] * task["n"]}


@pytest.mark.parametrize("count", [1, 2, 5, 7])
@pytest.mark.parametrize("strategy", ["map", "map2", "map3", "unroll"])
def test_every_strategy_equals_vmap_for_any_number_of_tasks(strategy, count):
    # map<k> splits the tasks into k consecutive groups as equal as the count allows (a count
    # that k does not divide, or fewer tasks than k: a validation set of 3 under map5)
    tasks = {"x": jnp.arange(3.0 * count).reshape(count, 3), "n": jnp.arange(count) + 1}
    expected = map_over_tasks(_fn, tasks, "vmap")
    got = map_over_tasks(_fn, tasks, strategy)
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key])
    np.testing.assert_allclose(
        mean_over_tasks(_fn, tasks, strategy)["sum"], np.mean(expected["sum"]), rtol=1e-6
    )


def test_unknown_strategies_are_refused():
    assert not any(is_task_batching(name) for name in ("map0", "map-1", "pmap", "Map2", ""))
    with pytest.raises(ValueError, match="unknown task batching strategy 'pmap'"):
        map_over_tasks(_fn, {"x": jnp.zeros((2, 3)), "n": jnp.zeros(2)}, "pmap")
